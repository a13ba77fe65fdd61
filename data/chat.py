"""Prompt encoding: a conversation's turns -> the token ids the target is prompted with."""

from __future__ import annotations


def encode_turns(tokenizer, history: list[dict], chat_template: bool) -> list[int]:
    """history: [{"role", "content"}, ...] ending with the user turn to answer. With `chat_template`, the whole
    conversation through the tokenizer's chat template with the assistant's generation prompt; without, the last
    turn's text alone (base models)."""
    if chat_template:
        text = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(history[-1]["content"])["input_ids"]
