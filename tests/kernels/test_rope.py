"""rope_store (kernels/rope.py) against its torch reference, and the reference against
Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb (and Qwen3's q/k RMSNorm).

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested (fp32); on a
GPU the same tests run there, plus bf16/fp16, mixed cache dtypes and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICE, gpu_only, needs_kernel, rel_err

import eaglet.kernels.rope as rp
from eaglet.kernels.rope import rope_store, rope_store_ref

MAX_POS = 131072  # angles up to ~1.3e5 rad: exercises the cos/sin range reduction



def inv_freq_for(D: int, theta: float = 1e5) -> torch.Tensor:
    return (1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float()  # [D/2]


def make(M, Hq, Hkv, D, dtype, *, norm=False, slots=None, spare=7, cache_dtype=None, seed=0, device=DEVICE):
    """Inputs as a dict; caches hold random junk (so unwritten or misplaced slots show), slots
    default to a random permutation (no duplicates) into M + spare slots."""
    gen = torch.Generator().manual_seed(seed)
    S = M + spare
    cache_dtype = cache_dtype or dtype
    args = dict(
        qkv=torch.randn(M, (Hq + 2 * Hkv) * D, generator=gen).to(dtype),  # [M, (Hq+2Hkv)*D]
        positions=torch.randint(0, MAX_POS, (M,), generator=gen),  # [M]
        inv_freq=inv_freq_for(D),  # [D/2]
        k_cache=torch.randn(S, Hkv, D, generator=gen).to(cache_dtype),  # [S, Hkv, D]
        v_cache=torch.randn(S, Hkv, D, generator=gen).to(cache_dtype),  # [S, Hkv, D]
        out_slots=torch.randperm(S, generator=gen)[:M] if slots is None else torch.tensor(slots),  # [M]
        q_norm_weight=(torch.rand(D, generator=gen) + 0.5).to(dtype) if norm else None,  # [D]
        k_norm_weight=(torch.rand(D, generator=gen) + 0.5).to(dtype) if norm else None,  # [D]
    )
    args = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    return args, dict(n_heads=Hq, n_kv_heads=Hkv, head_dim=D)


def run_both(args, heads, **overrides):
    """(kernel q, k_cache, v_cache), (reference q, k_cache, v_cache), each on its own cache copy."""
    results = []
    for fn in (rope_store, rope_store_ref):
        a = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone(), **overrides)
        q = fn(**a, **heads)
        results.append((q, a["k_cache"], a["v_cache"]))
    return results


CASES = [
    pytest.param(1, 9, 3, 64, id="M1-smollm2-9-3-D64"),
    pytest.param(37, 9, 3, 64, id="M37-smollm2-9-3-D64"),
    pytest.param(5, 32, 8, 128, id="M5-llama3-32-8-D128"),
    pytest.param(4, 2, 2, 16, id="M4-MHA-D16"),
    pytest.param(3, 4, 1, 48, id="M3-MQA-D48-not-pow2"),
]


@needs_kernel
@pytest.mark.parametrize("M,Hq,Hkv,D", CASES)
@pytest.mark.parametrize("norm", [False, True], ids=["no-qk-norm", "qk-norm"])
def test_fp32_matches_reference(M, Hq, Hkv, D, norm):
    args, heads = make(M, Hq, Hkv, D, torch.float32, norm=norm)
    (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads)
    assert q.shape == (M, Hq, D) and q.dtype == torch.float32 and q.is_contiguous()
    assert rel_err(q, q_ref) < 1e-5
    assert rel_err(k_cache, k_ref) < 1e-5  # whole cache: a misplaced or missing row fails this
    assert torch.equal(v_cache, v_ref)  # v is a plain copy


@needs_kernel
def test_int32_indices_and_paged_cache():
    """int32 positions/slots, and a paged pool [pages, page_size, Hkv, D] addressed by flat slot."""
    args, heads = make(11, 9, 3, 64, torch.float32, spare=21, seed=1)
    args = dict(args, positions=args["positions"].int(), out_slots=args["out_slots"].int(),
                k_cache=args["k_cache"].view(8, 4, 3, 64), v_cache=args["v_cache"].view(8, 4, 3, 64))
    (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads)
    assert rel_err(q, q_ref) < 1e-5 and rel_err(k_cache, k_ref) < 1e-5 and torch.equal(v_cache, v_ref)


@needs_kernel
@pytest.mark.parametrize("norm", [False, True], ids=["no-qk-norm", "qk-norm"])
def test_duplicate_slots_one_writer_wins(norm):
    """Padding rows share dummy slot 0: each shared slot holds one of its writers' k rows and one of its writers' v
    rows (with q/k norm, k and v of one slot can come from different writers: seen on an H200; padding is junk
    either way), untouched slots keep their junk."""
    slots = [0, 0, 4, 0, 4, 2, 0, 7]
    M, S = len(slots), 10
    args, heads = make(M, 9, 3, 64, torch.float32, norm=norm, slots=slots, spare=S - M, seed=2)
    k_cache, v_cache = args["k_cache"].clone(), args["v_cache"].clone()  # [S, Hkv, D] each
    q = rope_store(**dict(args, k_cache=k_cache, v_cache=v_cache), **heads)  # [M, Hq, D]
    # Per-row expected k/v: the reference with every row in its own slot of a fresh cache.
    k_rows, v_rows = torch.zeros_like(args["k_cache"][:M]), torch.zeros_like(args["v_cache"][:M])  # [M, Hkv, D]
    q_ref = rope_store_ref(**dict(args, k_cache=k_rows, v_cache=v_rows,
                                  out_slots=torch.arange(M, device=DEVICE)), **heads)
    assert rel_err(q, q_ref) < 1e-5
    for s in range(S):
        writers = [m for m in range(M) if slots[m] == s]
        if not writers:
            assert torch.equal(k_cache[s], args["k_cache"][s]) and torch.equal(v_cache[s], args["v_cache"][s])
            continue
        assert any(torch.equal(v_cache[s], v_rows[m]) for m in writers), f"slot {s}: none of {writers}' v rows"
        assert any(rel_err(k_cache[s], k_rows[m]) < 1e-5 for m in writers), f"slot {s}: none of {writers}' k rows"


@needs_kernel
def test_strided_qkv():
    """A column slice of a wider buffer is read in place (row stride); a transposed qkv is copied."""
    args, heads = make(13, 9, 3, 64, torch.float32, seed=3)
    qkv = args["qkv"]  # [M, W]
    wide = torch.randn(13, qkv.shape[1] + 100, device=DEVICE)  # [M, W + 100]
    wide[:, 50:50 + qkv.shape[1]] = qkv
    for strided in (wide[:, 50:50 + qkv.shape[1]], qkv.t().contiguous().t()):
        (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads, qkv=strided)
        assert rel_err(q, q_ref) < 1e-5 and rel_err(k_cache, k_ref) < 1e-5 and torch.equal(v_cache, v_ref)


@needs_kernel
def test_empty_batch():
    args, heads = make(0, 9, 3, 64, torch.float32)
    k_before = args["k_cache"].clone()
    q = rope_store(**args, **heads)
    assert q.shape == (0, 9, 64) and torch.equal(args["k_cache"], k_before)


@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3-qk-norm"])
def test_reference_is_hf_apply_rotary_pos_emb(norm):
    """The reference equals transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb (fp32, CPU),
    with Qwen3's q_norm/k_norm (Qwen3RMSNorm over head_dim) before it when norm is on."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    M, Hq, Hkv, D = 23, 9, 3, 64
    cfg = LlamaConfig(hidden_size=Hq * D, num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=D, rope_theta=1e5)
    rotary = LlamaRotaryEmbedding(cfg)
    args, heads = make(M, Hq, Hkv, D, torch.float32, norm=norm, seed=4, device="cpu")
    args["inv_freq"] = rotary.inv_freq.float()  # [D/2], HF's own frequencies
    k_cache, v_cache = args["k_cache"].clone(), args["v_cache"].clone()
    q_ref = rope_store_ref(**dict(args, k_cache=k_cache, v_cache=v_cache), **heads)  # [M, Hq, D]

    q, k, v = args["qkv"].split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q = q.view(1, M, Hq, D).transpose(1, 2)  # [1, Hq, M, D], HF's layout
    k = k.view(1, M, Hkv, D).transpose(1, 2)  # [1, Hkv, M, D]
    with torch.no_grad():
        if norm:
            q_norm, k_norm = Qwen3RMSNorm(D, eps=1e-6), Qwen3RMSNorm(D, eps=1e-6)
            q_norm.weight.copy_(args["q_norm_weight"])
            k_norm.weight.copy_(args["k_norm_weight"])
            q, k = q_norm(q), k_norm(k)
        cos, sin = rotary(q, args["positions"][None])  # [1, M, D] each
        q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)  # [1, H, M, D]
    slots = args["out_slots"]
    torch.testing.assert_close(q_ref, q_hf[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_cache[slots], k_hf[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    assert torch.equal(v_cache[slots], v.view(M, Hkv, D))


def test_cpu_fallback_is_reference(monkeypatch):
    monkeypatch.setattr(rp, "use_triton", lambda *ts: False)
    args, heads = make(6, 9, 3, 64, torch.float32, norm=True, device="cpu")
    (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads)
    assert torch.equal(q, q_ref) and torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_validation_errors():
    args, heads = make(4, 9, 3, 64, torch.float32, device="cpu")

    def call(**kw):
        merged = {**args, **heads, **kw}
        return rope_store(**merged)

    with pytest.raises(ValueError, match="qkv must be"):
        call(n_heads=8)  # head counts that do not add up to qkv's width
    with pytest.raises(ValueError, match="qkv must be"):
        call(qkv=args["qkv"][:, :-64])
    with pytest.raises(ValueError, match="head_dim"):
        call(head_dim=63)
    with pytest.raises(ValueError, match="positions"):
        call(positions=args["positions"][:3])
    with pytest.raises(ValueError, match="positions"):
        call(positions=args["positions"].float())
    with pytest.raises(ValueError, match="out_slots"):
        call(out_slots=args["out_slots"][:, None])
    with pytest.raises(ValueError, match="inv_freq"):
        call(inv_freq=args["inv_freq"].bfloat16())
    with pytest.raises(ValueError, match="inv_freq"):
        call(inv_freq=args["inv_freq"][:16])
    with pytest.raises(ValueError, match="k_cache"):
        call(k_cache=args["k_cache"][:, :2])
    with pytest.raises(ValueError, match="v_cache"):
        call(v_cache=args["v_cache"].transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="k_cache .* and v_cache"):
        call(v_cache=args["v_cache"][:5])
    with pytest.raises(ValueError, match="q_norm_weight and k_norm_weight"):
        call(q_norm_weight=torch.ones(64))
    with pytest.raises(ValueError, match="k_norm_weight"):
        call(q_norm_weight=torch.ones(64), k_norm_weight=torch.ones(64, dtype=torch.float16))
    with pytest.raises(ValueError, match="q_norm_weight"):
        call(q_norm_weight=torch.ones(32), k_norm_weight=torch.ones(64))


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,Hq,Hkv,D", [(1, 9, 3, 64), (64, 9, 3, 64), (4096, 9, 3, 64), (8, 32, 8, 128),
                                        (4096, 32, 8, 128), (37, 4, 1, 48)])
@pytest.mark.parametrize("norm", [False, True], ids=["no-qk-norm", "qk-norm"])
def test_half_precision_gpu(dtype, M, Hq, Hkv, D, norm):
    args, heads = make(M, Hq, Hkv, D, dtype, norm=norm, seed=5)
    (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads)
    assert q.dtype == dtype and not q.isnan().any()
    assert rel_err(q, q_ref) < 1e-2 and rel_err(k_cache, k_ref) < 1e-2
    assert torch.equal(v_cache, v_ref)


@gpu_only
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_cache_dtype_differs_gpu(dtype, cache_dtype):
    args, heads = make(64, 9, 3, 64, dtype, cache_dtype=cache_dtype, seed=6)
    (q, k_cache, v_cache), (q_ref, k_ref, v_ref) = run_both(args, heads)
    assert k_cache.dtype == cache_dtype
    assert rel_err(q, q_ref) < 1e-2 and rel_err(k_cache, k_ref) < 1e-2 and torch.equal(v_cache, v_ref)


@gpu_only
def test_cuda_graph_capture_and_replay():
    args, heads = make(8, 9, 3, 64, torch.bfloat16, seed=7)
    rope_store(**args, **heads)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = rope_store(**args, **heads)
    new, _ = make(8, 9, 3, 64, torch.bfloat16, seed=8)
    for name in ("qkv", "positions", "out_slots"):
        args[name].copy_(new[name])
    k_before, v_before = args["k_cache"].clone(), args["v_cache"].clone()
    graph.replay()
    k_ref, v_ref = k_before.clone(), v_before.clone()
    q_ref = rope_store_ref(**dict(args, k_cache=k_ref, v_cache=v_ref), **heads)
    assert rel_err(q, q_ref) < 1e-2 and rel_err(args["k_cache"], k_ref) < 1e-2 and torch.equal(args["v_cache"], v_ref)
