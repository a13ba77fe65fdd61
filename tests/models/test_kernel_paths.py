"""The two numerics paths (models/kernel_paths.py): the table's answer, and that every model layer runs the kernels of
the path its config names: a target block, the LM head, EAGLE-1, EAGLE-3 and multi-layer draft heads (layers, fc, LM
head), invariant on and off, norm weights folded or not, at a decode and a multi-token shape. The spies record each
kernel entry point the models call, in order; a layer that ran the other path's kernels fails the comparison."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from eaglet.kernels import projection as proj
from eaglet.models import llama
from eaglet.models.head_checkpoint import new_draft_head
from eaglet.models.kernel_paths import KernelPath, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import ModelArgs, Transformer


def test_the_table():
    assert path_for(True) is KernelPath.INVARIANT and path_for(False) is KernelPath.STOCK
    assert len(KernelPath) == 2
    with pytest.raises(TypeError, match="invariant must be a bool"):
        path_for(1)


# ---- the models run the kernels of the path their config names -------------------------------------------------


def norm_tag(w) -> str:
    """How a norm reaches a kernel: '-' none, 'folded' projection.FOLDED, 'unit' the ones folding leaves, 'g' a
    weight."""
    if w is None:
        return "-"
    if isinstance(w, str):
        assert w is proj.FOLDED
        return "folded"
    return "unit" if bool((w == 1).all()) else "g"


def spy(monkeypatch) -> list[str]:
    """Record every call of the kernel entry points models/llama.py and models/eagle.py run, with the norm each
    projection or rmsnorm call takes; the calls go through to the real functions."""
    ran = []
    labels = {
        (proj, "linear"): lambda a: f"proj.linear[{norm_tag(a.get('norm_weight'))}]",
        (proj, "proj_rope_store"): lambda a: "proj.proj_rope_store[" + norm_tag(a["norm_weight"]) + (
            "" if a.get("x2") is None else "," + norm_tag(a.get("norm_weight2"))) + "]",
        (proj, "gate_up_silu"): lambda a: f"proj.gate_up_silu[{norm_tag(a['norm_weight'])}]",
        (proj, "linear_add_"): lambda a: "proj.linear_add_",
        (proj, "linear_add"): lambda a: "proj.linear_add",
        (llama, "rmsnorm"): lambda a: f"rmsnorm[{norm_tag(a['weight'])}]",
        (llama, "rope_store"): lambda a: "rope_store",
        (llama, "silu_and_mul"): lambda a: "silu_and_mul",
        (llama, "tree_attention"): lambda a: "tree_attention[" + (
            "invariant" if a.get("invariant") else "split-kv") + "]",
        (nn.Linear, "forward"): lambda a: "nn.Linear",
    }
    for (owner, name), label in labels.items():
        orig = getattr(owner, name)
        sig = inspect.signature(orig)

        def wrapped(*args, _orig=orig, _sig=sig, _label=label, **kw):
            ran.append(_label(_sig.bind(*args, **kw).arguments))
            return _orig(*args, **kw)

        monkeypatch.setattr(owner, name, wrapped)
    return ran


def invariant_layer(g_in: str, g_post: str, out_of_place: bool = False) -> list[str]:
    """A target block's (or, out_of_place, a draft layer's) invariant kernels: four projection launches around the
    invariant tree attention, each norm inside the projection after it."""
    return [f"proj.proj_rope_store[{g_in}]", "tree_attention[invariant]",
            "proj.linear_add" if out_of_place else "proj.linear_add_", f"proj.gate_up_silu[{g_post}]",
            "proj.linear_add_"]


def stock_layer(norms_in: list[str], g_post: str) -> list[str]:
    """A block's or draft layer's stock kernels: the rmsnorm kernel (one per input norm), cuBLAS qkv, the RoPE / K-V
    store kernel, the split-KV tree attention, cuBLAS o, the post-attention norm, gate_up, SiLU·mul, down."""
    return ([f"rmsnorm[{g}]" for g in norms_in] + ["nn.Linear", "rope_store", "tree_attention[split-kv]",
                                                    "nn.Linear", f"rmsnorm[{g_post}]", "nn.Linear", "silu_and_mul",
                                                    "nn.Linear"])


def expected(kind: str, path: KernelPath, folded: bool, n_layers: int) -> list[str]:
    """The kernels one call of `kind` runs on `path`. A folded norm reaches the invariant projections as 'folded'
    and the stock rmsnorm kernel as 'unit'; EAGLE-1's layer 0 (and every multi-layer step) has no input norm, so
    nothing of its attention half folds and it keeps its post-attention weight; final norms never fold."""
    g = ("folded" if folded else "g") if path is KernelPath.INVARIANT else ("unit" if folded else "g")
    if path is KernelPath.INVARIANT:
        head = ["proj.linear[-]"]
        layer0 = invariant_layer("-", "g", out_of_place=True)
        return {
            "target": invariant_layer(g, g) * n_layers + ["rmsnorm[g]"],  # the final norm
            "lm_head": ["proj.linear[-]"],
            "eagle1": ["proj.linear[-]"] + layer0 + invariant_layer(g, g, out_of_place=True) + head,
            "eagle3": ["proj.linear[-]"] + invariant_layer(f"{g},{g}", g, out_of_place=True) + ["proj.linear[g]"],
            "multi_layer": (["proj.linear[-]"] + layer0) * 2 + head,
        }[kind]
    layer0 = stock_layer([], "g")
    return {
        "target": stock_layer([g], g) * n_layers + ["rmsnorm[g]"],
        "lm_head": ["nn.Linear"],
        "eagle1": ["nn.Linear"] + layer0 + stock_layer([g], g) + ["nn.Linear"],
        "eagle3": ["nn.Linear"] + stock_layer([g, g], g) + ["rmsnorm[g]", "nn.Linear"],
        "multi_layer": (["nn.Linear"] + layer0) * 2 + ["nn.Linear"],
    }[kind]


def randomised_norms(module: nn.Module) -> nn.Module:
    """Norm weights away from their ones init, so that 'unit' says the weights were folded."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return module.eval()


def batch_of(kv: KVCache, B: int, T: int):
    """positions [B, T] and the ForwardBatch of T new tokens for each of B fresh requests of `kv`."""
    reqs = [kv.alloc_request() for _ in range(B)]
    for r in reqs:
        kv.reserve(r, T)
    pos, pt = torch.arange(T)[None].expand(B, T), kv.req_to_page[reqs]  # [B, T], [B, pages]
    return pos, ForwardBatch(pt, torch.zeros(B, dtype=torch.int32), slots_for(pt, pos, kv.page_size))


KINDS = ("target", "lm_head", "eagle1", "eagle3", "multi_layer")


@pytest.mark.parametrize("B,T", [(1, 1), (2, 3)], ids=["decode", "multi-token"])
@pytest.mark.parametrize("folded", [False, True], ids=["norms", "folded"])
@pytest.mark.parametrize("invariant", [False, True], ids=["stock", "invariant"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_layer_runs_the_kernels_of_its_path(monkeypatch, kind, invariant, folded, B, T):
    torch.manual_seed(0)
    args = ModelArgs(**{**ModelArgs.from_name("tiny_llama").__dict__, "n_layers": 3})
    target = randomised_norms(Transformer(args))
    head = None
    if kind in ("eagle1", "eagle3", "multi_layer"):
        extra = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}} if kind == "eagle3" else {}
        head = randomised_norms(new_draft_head(kind, target, num_layers={"eagle1": 2, "multi_layer": 2}.get(kind),
                                               **extra))
    if folded:
        target.fold_norm_weights()
        if head is not None:
            head.fold_norm_weights()
    target.set_invariant(invariant)
    if head is not None:
        head.set_invariant(invariant)  # the target's, as engine/run.py sets it
    tokens = torch.randint(0, args.vocab_size, (B, T))
    with torch.no_grad():
        if kind in ("target", "lm_head"):
            kv = KVCache.for_model(args, max_reqs=B, max_context=8, page_size=4)
            pos, batch = batch_of(kv, B, T)
            ran = spy(monkeypatch)
            if kind == "target":
                target(tokens, pos, batch, kv)
            else:
                target.logits(torch.randn(B, T, args.dim))
        else:
            kv = head.kv_cache(max_reqs=B, max_context=8, page_size=4)
            pos, batch = batch_of(kv, B, T)
            feats = torch.randn(B, T, head.feature_size)
            ran = spy(monkeypatch)
            head(tokens, feats, pos, batch, kv)
    assert ran == expected(kind, path_for(invariant), folded, args.n_layers)
