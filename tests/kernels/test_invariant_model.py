"""Invariant numerics at the model level (models/llama.py `set_invariant`): a verify's tree nodes compute what
plain decoding computes for the same tokens. In tests/kernels so CI runs it under the Triton interpreter (the
CPU references are not what it checks)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, needs_kernel

from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import ModelArgs, Transformer


def _logits_of(model, kv, row, tokens, positions, prefix, mask=None, bound=None):
    """One forward of new tokens [T] at positions [T] after `prefix` cached tokens of request `row`
    (new token j's K/V at position prefix + j, as a verify writes its tree) -> fp32 logits [T, V]."""
    dev = model.device
    pt = kv.req_to_page[[row]]  # [1, P]
    pos = torch.tensor([positions], device=dev)  # [1, T]
    at = prefix + torch.arange(len(tokens), device=dev)[None]  # [1, T]
    batch = ForwardBatch(pt, torch.tensor([prefix], dtype=torch.int32, device=dev), slots_for(pt, at, kv.page_size),
                         None if mask is None else mask[None].to(dev), bound)
    hidden, _ = model(torch.tensor([tokens], device=dev), pos, batch, kv)
    return model.logits(hidden[0])


@needs_kernel
@pytest.mark.parametrize("folded", [False, True], ids=["norm-weights", "folded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if CUDA else [torch.float32])
def test_invariant_verify_logits_equal_decode_logits(dtype, folded):
    """set_invariant(True): the logits of the tree nodes on one root-to-leaf path of a verify are
    bit-identical to those of decoding that path one token at a time (and the prompt's logits do not
    depend on its padding into a longer batch row), which is what makes bf16 speculation lossless."""
    torch.manual_seed(0)
    dev = "cuda" if CUDA else "cpu"
    model = Transformer(ModelArgs.from_name("tiny_llama")).to(dev, dtype).eval().set_invariant(True)
    with torch.no_grad():  # norm weights that matter: applied in the projections, or folded into them
        for layer in model.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    if folded:
        model.fold_norm_weights()
    prompt = torch.randint(0, 512, (70,)).tolist()  # 70 tokens: the path crosses the 64-key tile boundary
    P = len(prompt)
    # tree (parents first): 0 root; 1, 2 children of 0; 3 child of 1; 4, 5 children of 2 -> path 0, 2, 5
    parents = [-1, 0, 0, 1, 2, 2]
    toks = [11, 200, 31, 77, 140, 5]
    depth = [0, 1, 1, 2, 2, 2]
    mask = torch.zeros(6, 6, dtype=torch.bool)  # [N, N] ancestor-or-self
    for i in range(6):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    path = [0, 2, 5]

    def fresh():
        kv = KVCache.for_model(model.args, max_reqs=1, max_context=256, page_size=16, dtype=dtype, device=dev)
        row = kv.alloc_request()
        kv.reserve(row, 256)
        return kv, row

    with torch.inference_mode():
        kv_t, row_t = fresh()
        pre_t = _logits_of(model, kv_t, row_t, prompt, list(range(P)), 0)  # [P, V]
        tree = _logits_of(model, kv_t, row_t, toks, [P + d for d in depth], P, mask, bound=255)  # [6, V]
        kv_a, row_a = fresh()
        pre_a = _logits_of(model, kv_a, row_a, prompt + [0] * 9, list(range(P + 9)), 0)  # padded prompt
        decoded = [_logits_of(model, kv_a, row_a, [toks[i]], [P + e], P + e, bound=200)[0]
                   for e, i in enumerate(path)]  # each [V]
    assert torch.equal(pre_a[:P], pre_t)
    for e, i in enumerate(path):
        assert torch.equal(decoded[e], tree[i]), f"path node {i} (depth {e})"
