"""The folded block's fused projections (kernels/folded_linear.py) against their torch references: proj_rope_store
(F.linear + rope_store_ref with x's 1/rms; with a second input, an EAGLE-3 midlayer's), gate_up_silu (F.linear +
silu_and_mul_ref with x's 1/rms) and linear_add_ / linear_add (addmm, in place or not).

On CPU run with TRITON_INTERPRET=1 (CI does) so the Triton kernel itself is tested (fp32); on a GPU the same tests
run there, plus bf16 at Llama-3-8B's verify shapes and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.kernels.folded_linear import (
    gate_up_silu,
    gate_up_silu_ref,
    linear_add,
    linear_add_,
    linear_add_ref,
    proj_rope_store,
    proj_rope_store_ref,
)
from kernel_testing import DEVICE, gpu_only, needs_kernel, rel_err

EPS = 1e-6
MAX_POS = 131072  # angles up to ~1.3e5 rad: the cos/sin range reduction


def stream(M, H, gen, dtype):
    """Residual-stream rows of very different norms [M, H] (the row scale matters)."""
    return (torch.randn(M, H, generator=gen) * torch.rand(M, 1, generator=gen).mul(8).add(0.1)).to(DEVICE, dtype)


def weight(N, K, gen, dtype):
    return (torch.randn(N, K, generator=gen) * K**-0.5).to(DEVICE, dtype)  # [N, K]


def make_qkv(M, H, Hq, Hkv, D, dtype, seed=0, spare=5):
    """x, weight and the RoPE/cache arguments; the caches hold junk so that misplaced or missing writes show, and
    the slots are a random permutation (no duplicates)."""
    gen = torch.Generator().manual_seed(seed)
    S = M + spare
    return dict(
        x=stream(M, H, gen, dtype),
        weight=weight((Hq + 2 * Hkv) * D, H, gen, dtype),
        positions=torch.randint(0, MAX_POS, (M,), generator=gen).to(DEVICE),  # [M]
        inv_freq=(1.0 / 5e5 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float().to(DEVICE),  # [D/2]
        k_cache=torch.randn(S, Hkv, D, generator=gen).to(DEVICE, dtype),  # [S, Hkv, D]
        v_cache=torch.randn(S, Hkv, D, generator=gen).to(DEVICE, dtype),  # [S, Hkv, D]
        out_slots=torch.randperm(S, generator=gen)[:M].to(DEVICE),  # [M]
        n_heads=Hq, n_kv_heads=Hkv, head_dim=D, eps=EPS,
    )


def run_qkv(fn, args):
    a = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())
    return fn(**a), a["k_cache"], a["v_cache"]


def tol(dtype):
    # fp32: summation order only. bf16: a rounding of the GEMM output (2^-8) may flip between the orders of two
    # fp32 accumulations and propagate through the row scale and the rotation.
    return 1e-5 if dtype == torch.float32 else 1e-2


# (M, H, Hq, Hkv, D): K with and without a tail of the 256-wide K tile; D = 64 (SmolLM2) and 128 (Llama), the GQA
# ratios 3 and 4; M = 1, 8 (the B=1 verify), 16 (MAX_M) and 20 (above: the unfused composition)
QKV_SHAPES = [
    pytest.param(8, 200, 3, 1, 64, id="M8-H200-D64"),
    pytest.param(1, 256, 4, 1, 128, id="M1-H256-D128"),
    pytest.param(16, 576, 9, 3, 64, id="M16-H576-smollm2"),
    pytest.param(20, 96, 2, 1, 64, id="M20-unfused"),
]


@needs_kernel
@pytest.mark.parametrize("M,H,Hq,Hkv,D", QKV_SHAPES)
def test_proj_rope_store_matches_reference(M, H, Hq, Hkv, D):
    args = make_qkv(M, H, Hq, Hkv, D, torch.float32)
    out, ref = run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)
    for got, want, name in zip(out, ref, ("q", "k_cache", "v_cache")):
        assert rel_err(got, want) < 1e-5, name
    # the slots not written keep their junk, bit for bit
    untouched = torch.ones(args["k_cache"].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[args["out_slots"]] = False
    assert torch.equal(out[1][untouched], args["k_cache"][untouched])
    assert torch.equal(out[2][untouched], args["v_cache"][untouched])


# (M, H, H2, Hq, Hkv, D): an EAGLE-3 midlayer's cat(norm(embeds), norm(hidden)) input; H2 != H with K tails;
# M = 1 (a chain step), 4 (SmolLM2's top-4 tree step) and 17 (above MAX_M: the unfused composition)
TWO_INPUT_SHAPES = [
    pytest.param(1, 200, 136, 3, 1, 64, id="M1-H200-H136"),
    pytest.param(4, 576, 576, 9, 3, 64, id="M4-smollm2-head"),
    pytest.param(17, 128, 128, 2, 1, 128, id="M17-unfused"),
]


@needs_kernel
@pytest.mark.parametrize("M,H,H2,Hq,Hkv,D", TWO_INPUT_SHAPES)
def test_proj_rope_store_two_inputs_matches_reference(M, H, H2, Hq, Hkv, D):
    """Each input scaled by its own rows' 1/rms (x and x2 rows have different norms: using one input's scale for
    both, or swapping the inputs' weight columns, is a large error)."""
    args = make_qkv(M, H, Hq, Hkv, D, torch.float32, seed=M)
    gen = torch.Generator().manual_seed(7)
    args.update(x2=stream(M, H2, gen, torch.float32), weight=weight((Hq + 2 * Hkv) * D, H + H2, gen, torch.float32))
    out, ref = run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)
    for got, want, name in zip(out, ref, ("q", "k_cache", "v_cache")):
        assert rel_err(got, want) < 1e-5, name
    if H2 == H:  # x itself as x2 is still a second input (the weight's second half)
        args["x2"] = args["x"]
        out, ref = run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)
        assert rel_err(out[0], ref[0]) < 1e-5


@needs_kernel
def test_proj_rope_store_rotates_both_halves_of_every_head():
    """A weight whose rows are one-hot picks x's columns: every q/k dim must land in its head and half, rotated
    with its own frequency (a pair split across the wrong tile rows or heads shows as a large error)."""
    M, H, Hq, Hkv, D = 3, 512, 2, 1, 128  # two 64-row tiles per head
    args = make_qkv(M, H, Hq, Hkv, D, torch.float32, seed=3)
    perm = torch.randperm(H, generator=torch.Generator().manual_seed(1))[: (Hq + 2 * Hkv) * D]
    args["weight"] = torch.eye(H, device=DEVICE)[perm.to(DEVICE)]  # [(Hq+2Hkv)*D, H]
    out, ref = run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)
    for got, want in zip(out, ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# (M, H, I): I with and without a tail of the 32 outputs of a 64-row tile
GATE_UP_SHAPES = [
    pytest.param(8, 256, 96, id="M8-H256-I96"),
    pytest.param(5, 200, 100, id="M5-H200-I100"),
    pytest.param(16, 576, 1536, id="M16-smollm2"),
    pytest.param(17, 64, 64, id="M17-unfused"),
]


@needs_kernel
@pytest.mark.parametrize("M,H,I", GATE_UP_SHAPES)
def test_gate_up_silu_matches_reference(M, H, I):
    gen = torch.Generator().manual_seed(M + I)
    x, w = stream(M, H, gen, torch.float32), weight(2 * I, H, gen, torch.float32) * 4  # * 4 reaches silu's tails
    assert rel_err(gate_up_silu(x, w, EPS), gate_up_silu_ref(x, w, EPS)) < 1e-5


# (M, K, N): K and N with tails of the tiles; M = 16 and 33 (the fallback)
ADD_SHAPES = [
    pytest.param(8, 300, 100, id="M8-K300-N100"),
    pytest.param(1, 256, 256, id="M1-K256-N256"),
    pytest.param(16, 1536, 576, id="M16-down-smollm2"),
    pytest.param(33, 64, 80, id="M33-unfused"),
]


@needs_kernel
@pytest.mark.parametrize("M,K,N", ADD_SHAPES)
def test_linear_add_updates_out_in_place(M, K, N):
    gen = torch.Generator().manual_seed(M * N)
    a, w = stream(M, K, gen, torch.float32), weight(N, K, gen, torch.float32)
    buf = torch.randn(M, N + 7, generator=gen).to(DEVICE)  # out is a row-strided view of it
    out = buf[:, :N]
    ref, spare = linear_add_ref(out, a, w), buf[:, N:].clone()
    assert linear_add_(out, a, w) is out
    assert rel_err(out, ref) < 1e-5
    assert torch.equal(buf[:, N:], spare)  # the columns beside out are untouched


@needs_kernel
@pytest.mark.parametrize("M", [3, 20])
def test_linear_add_leaves_the_residual(M):
    gen = torch.Generator().manual_seed(M)
    a, w, res = stream(M, 300, gen, torch.float32), weight(100, 300, gen, torch.float32), stream(M, 100, gen,
                                                                                              torch.float32)
    kept = res.clone()
    assert rel_err(linear_add(res, a, w), linear_add_ref(res, a, w)) < 1e-5
    assert torch.equal(res, kept)


@needs_kernel
def test_folded_model_verify_through_the_fused_kernels():
    """A folded tiny Llama's verify-shaped forward (a prompt, then 8 tree tokens: the fused kernels' M) gives the
    unfolded model's hidden states, and writes the same K/V (here, unlike tests/models, the kernels run)."""
    from eaglet.models.kv_cache import ForwardBatch, KVCache, slots_for
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    plain = Transformer(ModelArgs.from_name("tiny_llama")).to(DEVICE).eval()
    for layer in plain.model.layers:  # norm weights far from 1, so that folding them changes the weights
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.data.uniform_(0.5, 1.5)
    folded = Transformer(plain.args).to(DEVICE).eval()
    folded.load_state_dict(plain.state_dict())
    folded.fold_norm_weights()
    prompt, tree = torch.randint(0, 512, (1, 21)), torch.randint(0, 512, (1, 8))
    results = []
    for model in (plain, folded):
        kv = KVCache.for_model(model.args, max_reqs=1, max_context=64, page_size=16, device=DEVICE)
        row = kv.alloc_request()
        kv.reserve(row, 64)
        pt = kv.req_to_page[[row]]  # [1, P]
        with torch.inference_mode():
            for toks, start in ((prompt, 0), (tree, 21)):
                pos = start + torch.arange(toks.shape[1], device=DEVICE)[None]  # [1, T]
                batch = ForwardBatch(pt, torch.tensor([start], dtype=torch.int32, device=DEVICE),
                                     slots_for(pt, pos, kv.page_size))
                hidden, _ = model(toks.to(DEVICE), pos, batch, kv)  # [1, T, H]
        results.append((hidden, kv.layer(1)[0].clone(), kv.layer(1)[1].clone()))
    for got, want in zip(results[1], results[0]):
        assert rel_err(got, want) < 1e-5


@needs_kernel
def test_folded_eagle3_head_through_the_fused_kernels():
    """A folded EAGLE-3 head (DraftHead.fold_norm_weights) gives the unfolded head's hidden states and logits: its
    extend over 2 x 6 target features and two draft steps of 2 x 3 rows each run the two-input qkv and the
    out-of-place o_proj add (here, unlike tests/models, the kernels run)."""
    from eaglet.models.head_checkpoint import new_draft_head
    from eaglet.models.kv_cache import ForwardBatch, slots_for
    from eaglet.models.llama import ModelArgs, Transformer

    torch.manual_seed(0)
    target = Transformer(ModelArgs(**{**ModelArgs.from_name("tiny_llama").__dict__, "n_layers": 8})).eval()
    plain = new_draft_head("eagle3", target, draft_vocab_size=100).to(DEVICE).eval()
    with torch.no_grad():  # norm weights far from 1, so that folding them changes the weights
        for name, p in plain.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    folded = new_draft_head("eagle3", target, draft_vocab_size=100).to(DEVICE).eval()
    folded.load_state_dict(plain.state_dict())
    folded.fold_norm_weights()
    assert folded.midlayer.norms_folded and torch.equal(folded.midlayer.hidden_norm.weight,
                                                        torch.ones_like(folded.midlayer.hidden_norm.weight))
    target.to(DEVICE)
    gen = torch.Generator().manual_seed(4)
    B, T, K = 2, 6, 3  # B * K = 6 rows a draft step
    tokens = torch.randint(0, 512, (B, T + 2 * K), generator=gen).to(DEVICE)
    feats = torch.randn(B, T, 3 * 256, generator=gen).to(DEVICE)
    results = []
    for head in (plain, folded):
        kv = head.kv_cache(max_reqs=B, max_context=32, page_size=4)
        rows = [kv.alloc_request() for _ in range(B)]
        for r in rows:
            kv.reserve(r, 32)
        pt = kv.req_to_page[rows]  # [B, P]
        outs = []
        with torch.inference_mode():
            hidden, start = feats, 0
            for step, n in ((None, T), (1, K), (2, K)):
                pos = start + torch.arange(n, device=DEVICE)[None].repeat(B, 1)  # [B, n]
                batch = ForwardBatch(pt, torch.full((B,), start, dtype=torch.int32, device=DEVICE),
                                     slots_for(pt, pos, kv.page_size), max_prefix_len=start)
                # draft steps: each request's last hidden state for its K nodes, a strided view [B, K, H] (stride 0
                # along K) that cannot be viewed as rows, as the engine's gathers can give
                x = hidden if step is None else hidden[:, -1:].expand(B, n, 256)
                kept = x.clone()
                hidden, logits = head(tokens[:, start:start + n], x, pos, batch, kv, step=step)  # [B, n, H], [B, n, Vd]
                assert torch.equal(x, kept)  # the caller's hidden input is left as it was
                outs += [hidden, logits]
                start += n
        results.append(outs + [kv.layer(0)[0].clone(), kv.layer(0)[1].clone()])
    for got, want in zip(results[1], results[0]):
        assert rel_err(got, want) < 1e-5


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"weight must be \[N, 64\]"):
        linear_add_(torch.zeros(4, 32), x, torch.randn(32, 65))
    with pytest.raises(ValueError, match="weight dtype"):
        gate_up_silu(x, torch.randn(32, 64, dtype=torch.float64), EPS)
    with pytest.raises(ValueError, match=r"out must be \[M, N\] = \[4, 32\]"):
        linear_add_(torch.zeros(4, 31), x, torch.randn(32, 64))
    with pytest.raises(ValueError, match="gate rows, then up rows"):
        gate_up_silu(x, torch.randn(33, 64), EPS)
    with pytest.raises(ValueError, match="row-major"):
        linear_add_(torch.zeros(4, 32), x, torch.randn(64, 32).t())
    args = make_qkv(4, 64, 2, 1, 64, torch.float32)
    with pytest.raises(ValueError, match=r"qkv must be \[M, \(n_heads \+ 2\*n_kv_heads\) \* head_dim\]"):
        proj_rope_store(**dict(args, n_heads=3))
    with pytest.raises(ValueError, match="out_slots must be"):
        proj_rope_store(**dict(args, out_slots=args["out_slots"][:2]))
    with pytest.raises(ValueError, match=r"x2 must be \[M, K2\] with M = 4 rows"):
        proj_rope_store(**dict(args, x2=torch.randn(3, 64, device=DEVICE)))
    with pytest.raises(ValueError, match=r"weight must be \[N, 128\]"):
        proj_rope_store(**dict(args, x2=torch.randn(4, 64, device=DEVICE)))  # the weight covers x's columns only
    with pytest.raises(ValueError, match=r"res must be \[M, N\] = \[4, 32\]"):
        linear_add(torch.zeros(4, 31), x, torch.randn(32, 64))


# ----------------------------------------------------------------------------------------------------
# GPU: bf16 at Llama-3-8B's B=1 verify shapes, a CUDA graph


@gpu_only
@pytest.mark.parametrize("M,dtype", [(1, torch.bfloat16), (8, torch.bfloat16), (16, torch.bfloat16),
                                     (8, torch.float16), (8, torch.float32)])
def test_llama3_8b_shapes(M, dtype):
    """The verify's shapes in every dtype the launchers take (fp32: the tiles that fit its shared memory)."""
    args = make_qkv(M, 4096, 32, 8, 128, dtype)
    for got, want in zip(run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)):
        assert rel_err(got, want) < tol(dtype)
    gen = torch.Generator().manual_seed(M)
    # the public Llama-3.1-8B EAGLE-3 head's midlayer qkv: cat(norm(embeds), norm(hidden)), 2 x 4096 columns
    args.update(x2=stream(M, 4096, gen, dtype), weight=weight(6144, 8192, gen, dtype))
    for got, want in zip(run_qkv(proj_rope_store, args), run_qkv(proj_rope_store_ref, args)):
        assert rel_err(got, want) < tol(dtype)
    x = stream(M, 4096, gen, dtype)
    w = weight(2 * 14336, 4096, gen, dtype)
    assert rel_err(gate_up_silu(x, w, EPS), gate_up_silu_ref(x, w, EPS)) < tol(dtype)
    a, wd = stream(M, 14336, gen, dtype), weight(4096, 14336, gen, dtype)
    out = x.clone()
    ref = linear_add_ref(out, a, wd)
    assert rel_err(linear_add(out, a, wd), ref) < tol(dtype)
    assert rel_err(linear_add_(out, a, wd), ref) < tol(dtype)


@gpu_only
def test_cuda_graph_replays_match_eager():
    args = make_qkv(8, 1024, 8, 2, 128, torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    w_gu, w_d = weight(2 * 512, 1024, gen, torch.bfloat16), weight(1024, 512, gen, torch.bfloat16)
    x = args["x"]

    def step():
        q = proj_rope_store(**args)
        a = gate_up_silu(x, w_gu, EPS)
        return q, a, linear_add_(x.clone(), a, w_d)

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static, eager):
        assert torch.equal(got, want)
