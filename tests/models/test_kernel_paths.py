"""The kernel-path table (models/kernel_paths.py): its answer for every case the models meet, the override and its
restore, and that TransformerBlock, Transformer.logits and DraftLayer run the path the table names."""

from __future__ import annotations

import pytest
import torch

from eaglet.models import kernel_paths as kp
from eaglet.models.eagle import DraftLayer
from eaglet.models.kernel_paths import Layer, Path, override_limits, path_for
from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
from eaglet.models.llama import FeedForward, ModelArgs, Transformer, TransformerBlock, rope_inv_freq

I, F, U, P = Path.INVARIANT, Path.FUSED_LINEAR, Path.FOLDED, Path.PLAIN
ROWS = (0, 1, 2, 8, 16, 17, 64, 65, 512)  # empty, decode B=1, verify / B>1 decode, folded_linear's MAX_M +- 1, prefill

# (layer, invariant, folded) -> the path at each of ROWS
TABLE = {
    (Layer.BLOCK, False, False): (F, F, P, P, P, P, P, P, P),
    (Layer.BLOCK, False, True): (F, F, U, U, U, U, U, U, U),
    (Layer.BLOCK, True, False): (I,) * 9,
    (Layer.BLOCK, True, True): (I,) * 9,
    (Layer.LM_HEAD, False, False): (P,) * 9,
    (Layer.LM_HEAD, True, False): (I,) * 9,
    (Layer.DRAFT, False, False): (P,) * 9,
    (Layer.DRAFT, False, True): (U, U, U, U, U, P, P, P, P),
    (Layer.DRAFT, True, False): (I,) * 9,  # the target's kernels beside an invariant target
    (Layer.DRAFT, True, True): (I,) * 9,
}


@pytest.mark.parametrize("key", list(TABLE), ids=lambda k: f"{k[0].value}-inv{int(k[1])}-folded{int(k[2])}")
def test_table_answers(key):
    layer, invariant, folded = key
    got = tuple(path_for(layer, invariant=invariant, folded=folded, rows=m) for m in ROWS)
    assert got == TABLE[key]


def test_limits_are_the_measured_ones():
    assert kp.FUSED_LINEAR_MAX_ROWS == 1 and kp.DRAFT_FOLDED_MAX_ROWS == 16


def block(rows: int, **kw) -> Path:
    return path_for(Layer.BLOCK, invariant=False, folded=False, rows=rows, **kw)


def test_override_changes_and_restores():
    with override_limits(fused_linear_max_rows=64):
        assert block(64) is F and block(65) is P
        with override_limits(fused_linear_max_rows=0):  # nested: the inner limit, then the outer one again
            assert block(1) is P
            assert path_for(Layer.DRAFT, invariant=False, folded=True, rows=16) is U  # the other limit stays
        assert block(64) is F
    assert block(1) is F and block(2) is P
    with override_limits(draft_folded_max_rows=0):
        assert path_for(Layer.DRAFT, invariant=False, folded=True, rows=1) is P and block(1) is F
    assert path_for(Layer.DRAFT, invariant=False, folded=True, rows=1) is U


def test_override_restores_after_an_exception():
    with pytest.raises(RuntimeError, match="inside"):
        with override_limits(fused_linear_max_rows=0, draft_folded_max_rows=0):
            raise RuntimeError("inside")
    assert block(1) is F and path_for(Layer.DRAFT, invariant=False, folded=True, rows=16) is U


@pytest.mark.parametrize("bad", [-1, 1.5, "1"])
def test_override_rejects_bad_limits(bad):
    with pytest.raises(ValueError, match="fused_linear_max_rows must be an int >= 0"):
        with override_limits(fused_linear_max_rows=bad):
            pass
    assert block(1) is F


def test_unknown_layer_is_named():
    with pytest.raises(ValueError, match="layer must be a Layer"):
        path_for("block", invariant=False, folded=False, rows=1)


# ---- the models run the table's path ----------------------------------------------------------------------


def spy(monkeypatch):
    """Record which path each TransformerBlock / DraftLayer call ran: the block's own methods, else whether the
    MLP ran folded (the folded path) or not (the plain one)."""
    ran = []
    for name, path in (("_forward_invariant", I), ("_forward_fused_linear", F)):
        orig = getattr(TransformerBlock, name)

        def wrapped(self, *a, _orig=orig, _path=path, **kw):
            ran.append(_path)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(TransformerBlock, name, wrapped)
    orig_mlp = FeedForward.forward

    def mlp(self, x, folded=False):
        ran.append(U if folded else P)
        return orig_mlp(self, x, folded=folded)

    monkeypatch.setattr(FeedForward, "forward", mlp)
    return ran


def batch_of(args: ModelArgs, B: int, T: int):
    """positions [B, T], a ForwardBatch of T new tokens per request and its KV pool."""
    kv = KVCache.for_model(args, max_reqs=B, max_context=32, page_size=4)
    reqs = [kv.alloc_request() for _ in range(B)]
    for r in reqs:
        kv.reserve(r, T)
    pos, pt = torch.arange(T)[None].expand(B, T), kv.req_to_page[reqs]  # [B, T], [B, pages]
    return pos, ForwardBatch(pt, torch.zeros(B, dtype=torch.int32), slots_for(pt, pos, 4)), kv


@pytest.mark.parametrize("fused_max", [None, 0, 64], ids=["default", "fused-never", "fused-to-64"])
@pytest.mark.parametrize("B,T", [(1, 1), (8, 1), (1, 8), (2, 9)])
@pytest.mark.parametrize("invariant", [False, True], ids=["fastest", "invariant"])
@pytest.mark.parametrize("folded", [False, True], ids=["norms", "folded"])
def test_target_blocks_run_the_tables_path(monkeypatch, folded, invariant, B, T, fused_max):
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_name("tiny_llama")).eval()
    if folded:
        model.fold_norm_weights()
    model.set_invariant(invariant)
    pos, batch, kv = batch_of(model.args, B, T)
    ran = spy(monkeypatch)
    with override_limits(fused_linear_max_rows=fused_max), torch.no_grad():
        want = path_for(Layer.BLOCK, invariant=invariant, folded=folded, rows=B * T)
        model(torch.zeros(B, T, dtype=torch.long), pos, batch, kv)
    assert ran == [want] * model.args.n_layers


def test_logits_run_the_tables_path(monkeypatch):
    model = Transformer(ModelArgs.from_name("tiny_llama")).eval()
    calls = []
    monkeypatch.setattr("eaglet.models.llama.proj.linear", lambda x, w: calls.append(x.shape) or x @ w.t())
    h = torch.randn(2, 3, model.args.dim)  # [B, T, H]
    model.logits(h)
    assert calls == []
    model.set_invariant(True).logits(h)
    assert calls == [torch.Size([6, model.args.dim])]


@pytest.mark.parametrize("rows", [1, 16, 17])
def test_draft_layer_runs_the_tables_path(monkeypatch, rows):
    args = ModelArgs.from_name("tiny_llama")
    torch.manual_seed(0)
    layer = DraftLayer(args, 0, input_norm=True).eval()
    layer.fold_norm_weights()
    pos, batch, kv = batch_of(args, 1, rows)
    x = torch.randn(1, rows, args.dim)  # [1, T, H]
    ran = spy(monkeypatch)
    with torch.no_grad():
        layer(x, pos, rope_inv_freq(args).float(), batch, kv)
        with override_limits(draft_folded_max_rows=0):
            layer(x, pos, rope_inv_freq(args).float(), batch, kv)
    assert ran == [path_for(Layer.DRAFT, invariant=False, folded=True, rows=rows), P]
