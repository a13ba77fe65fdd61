"""run_spec.py's relied-upon interface, W&B offline logging, and eaglet beside transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["fold_norms=true", "invariant=false"]], ids=["default", "folded-norms"])
def test_shipped_eagle3_head_is_the_default_and_lossless(tmp_path, extra):
    """draft=eagle3 without a path serves the head eaglet ships for SmolLM2 (target.heads): it accepts drafts, and
    the fp32 CPU output equals plain greedy decoding; also on the stock path with the norms folded."""
    out = tmp_path / "run"
    cmd = [sys.executable, "run_spec.py", "draft=eagle3", "data=mt_bench", "data.limit=2", "data.max_turns=1",
           "gen.max_new_tokens=48", "hardware=cpu", "logger=none", f"hydra.run.dir={out}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["draft"] == "eagle3" and metrics["ar_identical_fraction"] == 1.0
    assert metrics["tau"] > 1.3  # a random head gets ~1.0


@pytest.mark.slow
def test_run_spec_interface(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "run_spec.py", "draft=none", "data=mt_bench", "data.limit=2", "gen.max_new_tokens=32",
           "logger=none", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tokens_per_s"] > 0 and metrics["target"] == "smollm2_135m" and metrics["draft"] == "none"
    assert metrics["num_prompts"] == 2 and metrics["max_new_tokens"] == 32
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    # one line per answer as it finished: MT-bench's two turns of each prompt, turn 0 first
    assert sorted((line["prompt_id"], line["turn"]) for line in lines) == [("81", 0), ("81", 1), ("82", 0), ("82", 1)]
    assert [line["turn"] for line in lines] == [0, 0, 1, 1]
    for line in lines:
        assert 0 < len(line["token_ids"]) <= 32 and len(line["text"]) > 20 and line["prompt"]


@pytest.mark.slow
def test_wandb_offline_run_and_jsonl_prompts(tmp_path):
    from hydra import compose, initialize_config_dir

    from eaglet.runner.run import run

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "fr", "prompt": "What is the capital of France?"}) + "\n")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("run_spec", overrides=["data=jsonl", f"data.path={prompts}", "gen.max_new_tokens=12",
                                             "logger=wandb", "print_answers=0"])
    metrics = run(cfg, tmp_path / "out")
    assert metrics["num_prompts"] == 1
    [line] = [json.loads(x) for x in (tmp_path / "out" / "outputs.jsonl").read_text().splitlines()]
    assert line["prompt_id"] == "fr" and "Paris" in line["text"]
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb")), "W&B offline run not written"


def test_transformers_and_tokenizer_work_beside_eaglet():
    # run from the repo root, where kernels/ and models/ folders sit on sys.path[0]
    code = ("import transformers, eaglet.kernels.tree_attention, eaglet.models.llama\n"
            "from transformers import AutoTokenizer\n"
            "from transformers.utils import import_utils as iu\n"
            "import importlib.util as u\n"
            "assert eaglet.kernels.__name__ == 'eaglet.kernels'\n"
            "iu.is_kernels_available()\n"
            "from eaglet.data.assets import asset_path\n"
            "from eaglet.models.checkpoint import load_tokenizer\n"
            "tok = load_tokenizer(asset_path('smollm2_gguf'))\n"
            "assert tok.decode(tok('Paris')['input_ids']) == 'Paris'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_tokenizer_chat_template(tokenizer):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant" in ids


def test_divergence_margin_points_at_the_first_difference():
    import torch

    from eaglet.engine.autoregressive import AREngine
    from eaglet.engine.requests import Request
    from eaglet.models.kv_cache import KVCache
    from eaglet.models.llama import ModelArgs, Transformer
    from eaglet.runner.run import divergence_margin

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_name("tiny_llama")).eval()
    r = Request([5, 6, 7], 8)
    AREngine(model, KVCache.for_model(model.args, max_reqs=1, max_context=32, page_size=4), 1).generate([r])
    other = r.output_ids[:3] + [(r.output_ids[3] + 1) % 512] + r.output_ids[4:]
    d = divergence_margin(model, r.prompt_ids, r.output_ids, other)
    assert d["index"] == 3 and d["top2_gap"] > 0  # greedy picked the top token: a positive gap to the runner-up


def test_bad_run_configs_are_named(tmp_path):
    import pytest
    import torch
    from omegaconf import OmegaConf

    from eaglet.engine.drafters.eagle import EagleDrafter
    from eaglet.models.head_checkpoint import new_draft_head, save_draft_head
    from eaglet.models.llama import ModelArgs, Transformer
    from eaglet.runner.common import resolve_hardware

    target = Transformer(ModelArgs.from_name("tiny_llama")).eval()
    tiny = OmegaConf.create({"name": "tiny_llama"})  # a target config that ships no head
    with pytest.raises(ValueError, match="draft.path=<head directory>, or draft.random_init=true.*draft=none"):
        EagleDrafter.from_config(OmegaConf.create({"name": "eagle3", "path": None, "random_init": False}), tiny,
                                 target, invariant=False, fold_norms=False)
    save_draft_head(new_draft_head("eagle1", target, dtype=torch.float32, device="cpu"), tmp_path / "h")
    with pytest.raises(ValueError, match="holds a eagle1 head; use draft=eagle1"):
        EagleDrafter.from_config(OmegaConf.create({"name": "multi_layer", "path": str(tmp_path / "h")}), tiny,
                                 target, invariant=False, fold_norms=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="hardware=cpu"):
            resolve_hardware(OmegaConf.create({"device": "cuda", "dtype": "auto"}))
    with pytest.raises(ValueError, match="hardware.dtype"):
        resolve_hardware(OmegaConf.create({"device": "cpu", "dtype": "int8"}))


def test_skip_too_long_keeps_prompts_that_fit(caplog):
    """data.skip_too_long (on for ShareGPT, whose prompts reach 27k tokens): prompts whose first turn leaves
    no room for the answer are skipped, and the run says how many (a line of its log)."""
    from omegaconf import OmegaConf

    from eaglet.data.prompts import Prompt
    from eaglet.models.checkpoint import load_tokenizer
    from eaglet.runner.common import target_path
    from eaglet.runner.run import fitting_prompts

    tok = load_tokenizer(target_path(OmegaConf.load(REPO / "conf" / "target" / "smollm2_135m.yaml")))
    short, long = Prompt("s", ["What is the capital of France?"], {}), Prompt("l", ["word " * 3000], {})
    assert fitting_prompts([long, short], tok, True, 1000) == [short]
    assert "skipped 1 of 2 prompts" in caplog.text
    caplog.clear()
    assert fitting_prompts([short], tok, True, 1000) == [short] and caplog.text == ""
