"""The batch-invariant projections (kernels/projection.py) against their torch references, and the property they
exist for: a row's result is bit-identical whatever else is in the call (M = 1, 2, 7, 8, 16, 37, 64
and 130 on the split-K grid, a 513-row prefill on the wide tiles), with splits of K and without.

On CPU run with TRITON_INTERPRET=1 (CI does): fp32, the Triton kernel itself. On a GPU the same tests run there, plus
bf16 / fp16 at SmolLM2-135M's and Llama-3.1-8B's shapes with the launch table's own configs.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import CUDA, DEVICE, gpu_only, needs_kernel, rel_err

from eaglet.kernels import projection as P
from eaglet.kernels import projection_config as PC

EPS = 1e-6
MAX_POS = 131072  # angles up to ~1.3e5 rad: the cos/sin range reduction
INVARIANT_MS = (1, 2, 7, 8, 16, 37, 64, 130, 513)  # decode, verify sizes (B=8 x 16 tokens: 128), a prefill


def rows(M, K, gen, dtype):
    """Residual-stream-like rows of very different norms [M, K] (the norm's row scale matters)."""
    return (torch.randn(M, K, generator=gen) * torch.rand(M, 1, generator=gen).mul(8).add(0.1)).to(DEVICE, dtype)


def mat(N, K, gen, dtype):
    return (torch.randn(N, K, generator=gen) * K**-0.5).to(DEVICE, dtype)  # [N, K]


def vec(K, gen, dtype, lo=0.5):
    return (torch.rand(K, generator=gen) + lo).to(DEVICE, dtype)  # [K]


def cfg(N, K, M, splits, block_k=64):
    """A launch config with `splits` splits of K (the interpreter's table would not split small K)."""
    split_k = -(-(-(-K // splits)) // block_k) * block_k
    return dict(BLOCK_N=64, BLOCK_K=block_k, SPLITS=-(-K // split_k), SPLIT_K=split_k, num_warps=4, num_stages=2,
                BLOCK_M=16 if M <= 16 else 32 if M <= 32 else 64)


def rope_args(M, Hq, Hkv, D, gen, dtype, spare=5):
    """positions, inv_freq and caches holding junk (misplaced or missing writes show), slots a permutation."""
    S = M + spare
    return dict(
        positions=torch.randint(0, MAX_POS, (M,), generator=gen).to(DEVICE),  # [M]
        inv_freq=(1.0 / 5e5 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float().to(DEVICE),  # [D/2]
        k_cache=torch.randn(S, Hkv, D, generator=gen).to(DEVICE, dtype),  # [S, Hkv, D]
        v_cache=torch.randn(S, Hkv, D, generator=gen).to(DEVICE, dtype),  # [S, Hkv, D]
        out_slots=torch.randperm(S, generator=gen)[:M].to(DEVICE),  # [M]
        n_heads=Hq, n_kv_heads=Hkv, head_dim=D,
    )


def run_qkv(fn, x, g, w, b, ra, **kw):
    a = dict(ra, k_cache=ra["k_cache"].clone(), v_cache=ra["v_cache"].clone())
    q = fn(x, g, w, b, a["positions"], a["inv_freq"], a["k_cache"], a["v_cache"], a["out_slots"], a["n_heads"],
           a["n_kv_heads"], a["head_dim"], EPS, **kw)
    return q, a["k_cache"], a["v_cache"]


def tol(dtype):
    # fp32: summation order only. bf16: a rounding of the product (2^-8) may flip between two fp32 orders
    return 1e-5 if dtype == torch.float32 else 1e-2


# (M, N, K, splits): K tails of the 64-wide tile, N tails of the 64-row tile, split-K on and off, a prefill
SHAPES = [
    pytest.param(1, 96, 200, 1, id="M1-ktail"),
    pytest.param(5, 130, 320, 3, id="M5-ntail-split3"),
    pytest.param(20, 192, 256, 2, id="M20-two-mtiles"),
    pytest.param(270, 64, 192, 3, id="M270-prefill-tiles"),
]


@needs_kernel
@pytest.mark.parametrize("M,N,K,splits", SHAPES)
def test_linear_and_adds_match_reference(M, N, K, splits):
    gen = torch.Generator().manual_seed(M * 7 + N)
    x, w, g, b = rows(M, K, gen, torch.float32), mat(N, K, gen, torch.float32), vec(K, gen, torch.float32), \
        vec(N, gen, torch.float32, -0.5)
    c = cfg(N, K, M, splits)
    assert rel_err(P.linear(x, w, cfg=c), P.linear_ref(x, w)) < 1e-5
    assert rel_err(P.linear(x, w, b, g, EPS, cfg=c), P.linear_ref(x, w, b, g, EPS)) < 1e-5
    res = rows(M, N, gen, torch.float32)
    want = P.linear_add_ref(res, x, w, b)
    got = P.linear_add(res, x, w, b, cfg=c)
    assert rel_err(got, want) < 1e-5 and not torch.equal(got, res)
    out = res.clone()
    assert P.linear_add_(out, x, w, cfg=c) is out
    assert rel_err(out, P.linear_add_ref(res, x, w)) < 1e-5
    x_strided = torch.cat([x, x], dim=1)[:, :K]  # rows with a stride != K
    assert torch.equal(P.linear(x_strided, w, cfg=c), P.linear(x, w, cfg=c))
    # into a slice of a wider buffer (the target's captured layers): the same values, the rest of the buffer untouched
    wide = torch.full((M, 3 * N), 7.0)
    assert P.linear_add(res, x, w, b, cfg=c, out=wide[:, N:2 * N]).data_ptr() == wide[:, N:].data_ptr()
    assert torch.equal(wide[:, N:2 * N], got) and (wide[:, :N] == 7).all() and (wide[:, 2 * N:] == 7).all()


@needs_kernel
@pytest.mark.parametrize("M,N,K,splits", SHAPES)
def test_gate_up_silu_matches_reference(M, N, K, splits):
    gen = torch.Generator().manual_seed(M + K)
    x, w, g = rows(M, K, gen, torch.float32), mat(2 * N, K, gen, torch.float32), vec(K, gen, torch.float32)
    got = P.gate_up_silu(x, g, w, EPS, cfg=cfg(2 * N, K, M, splits))
    assert got.shape == (M, N)
    assert rel_err(got, P.gate_up_silu_ref(x, g, w, EPS)) < 1e-5
    swapped = torch.cat([w[N:], w[:N]])  # gate and up exchanged: a different function
    assert rel_err(P.gate_up_silu(x, g, swapped, EPS, cfg=cfg(2 * N, K, M, splits)), got) > 1e-2


# (M, H, Hq, Hkv, D, bias, two inputs, splits)
QKV_SHAPES = [
    pytest.param(8, 200, 3, 1, 64, False, False, 1, id="M8-H200-D64"),
    pytest.param(1, 256, 4, 1, 128, True, False, 2, id="M1-D128-bias-split"),
    pytest.param(16, 192, 9, 3, 64, False, True, 2, id="M16-eagle3-two-inputs"),
    pytest.param(266, 128, 2, 1, 64, False, False, 2, id="M266-prefill-tiles"),
]


@needs_kernel
@pytest.mark.parametrize("M,H,Hq,Hkv,D,bias,two,splits", QKV_SHAPES)
def test_proj_rope_store_matches_reference(M, H, Hq, Hkv, D, bias, two, splits):
    gen = torch.Generator().manual_seed(M + H)
    dt = torch.float32
    x, g = rows(M, H, gen, dt), vec(H, gen, dt)
    N = (Hq + 2 * Hkv) * D
    w = mat(N, 2 * H if two else H, gen, dt)
    b = vec(N, gen, dt, -0.5) if bias else None
    kw = dict(x2=rows(M, H, gen, dt), norm_weight2=vec(H, gen, dt)) if two else {}
    ra = rope_args(M, Hq, Hkv, D, gen, dt)
    got = run_qkv(P.proj_rope_store, x, g, w, b, ra, cfg=cfg(N, H, M, splits), **kw)
    want = run_qkv(P.proj_rope_store_ref, x, g, w, b, ra, **kw)
    for o, r in zip(got, want):
        assert rel_err(o, r) < 1e-5
    untouched = torch.ones(ra["k_cache"].shape[0], dtype=torch.bool)
    untouched[ra["out_slots"].cpu()] = False
    assert torch.equal(got[1][untouched.to(DEVICE)], ra["k_cache"][untouched.to(DEVICE)])
    if two:  # each input has its own 1/rms: scaling x2 alone leaves rmsnorm(x2), so the result, as it is
        kw2 = dict(kw, x2=kw["x2"] * 3)
        other = run_qkv(P.proj_rope_store, x, g, w, b, ra, cfg=cfg(N, H, M, splits), **kw2)
        assert rel_err(other[0], got[0]) < 1e-5


@needs_kernel
@pytest.mark.parametrize("M", [8, 266])  # split-K tiles, prefill tiles
def test_kv_alone_writes_the_caches_of_the_whole_qkv(M):
    """n_heads 0 with the qkv weight's k and v rows (a block drafter's context store): the same K/V as the whole
    projection writes, no q."""
    gen = torch.Generator().manual_seed(M)
    H, Hq, Hkv, D, dt = 192, 3, 1, 64, torch.float32
    x, g, w = rows(M, H, gen, dt), vec(H, gen, dt), mat((Hq + 2 * Hkv) * D, H, gen, dt)
    ra = rope_args(M, Hq, Hkv, D, gen, dt)
    _, want_k, want_v = run_qkv(P.proj_rope_store_ref, x, g, w, None, ra)
    q, k, v = run_qkv(P.proj_rope_store, x, g, w[Hq * D:], None, dict(ra, n_heads=0))
    assert q.shape == (M, 0, D)
    assert rel_err(k, want_k) < 1e-5 and rel_err(v, want_v) < 1e-5


@needs_kernel
@pytest.mark.parametrize("M, splits, bias", [(8, 1, False), (16, 2, True), (266, 2, False)])  # split-K, prefill
def test_kv_of_several_layers_in_one_launch(M, splits, bias):
    """layers=3 (a block drafter's context store): each layer's k/v rows into its own caches, one pool tensor's layers
    apart, the same bits as a launch per layer; the pool's other layers and slots untouched."""
    gen = torch.Generator().manual_seed(M + splits)
    H, Hkv, D, L, dt = 192, 1, 64, 3, torch.float32
    N = 2 * Hkv * D  # a layer's rows
    x, g, w = rows(M, H, gen, dt), vec(H, gen, dt), mat(L * N, H, gen, dt)
    b = vec(L * N, gen, dt, -0.5) if bias else None
    ra = rope_args(M, 0, Hkv, D, gen, dt)
    S = ra["k_cache"].shape[0]
    pool = torch.randn(L + 1, 2, S, Hkv, D, generator=gen).to(DEVICE, dt)  # [L+1, 2, S, Hkv, D]: a spare layer last
    got = pool.clone()
    P.proj_rope_store(x, g, w, b, ra["positions"], ra["inv_freq"], got[0, 0], got[0, 1], ra["out_slots"], 0, Hkv, D,
                      EPS, layers=L, layer_stride=got.stride(0), cfg=cfg(N, H, M, splits))
    want = pool.clone()
    for i in range(L):
        P.proj_rope_store(x, g, w[i * N:(i + 1) * N], None if b is None else b[i * N:(i + 1) * N], ra["positions"],
                          ra["inv_freq"], want[i, 0], want[i, 1], ra["out_slots"], 0, Hkv, D, EPS,
                          cfg=cfg(N, H, M, splits))
    assert torch.equal(got, want) and torch.equal(got[L], pool[L])
    ref = pool.clone()
    P.proj_rope_store_ref(x, g, w, b, ra["positions"], ra["inv_freq"], ref[0, 0], ref[0, 1], ra["out_slots"], 0, Hkv,
                          D, EPS, layers=L, layer_stride=ref.stride(0))
    assert rel_err(got, ref) < 1e-5 and not torch.equal(got[:L], pool[:L])
    with pytest.raises(ValueError, match="layers=3"):
        P.proj_rope_store(x, g, w[:-1], None, ra["positions"], ra["inv_freq"], got[0, 0], got[0, 1], ra["out_slots"],
                          0, Hkv, D, EPS, layers=L, layer_stride=got.stride(0))


@needs_kernel
@pytest.mark.parametrize("splits", [1, 3])
def test_rows_are_bit_identical_across_m(splits):
    """Every function's row m is the same bits whatever M is (the split grid up to MAX_SPLIT_M rows, the wide prefill
    tiles above), and equals that row computed alone: what makes a verify compute its tokens as decoding does."""
    gen = torch.Generator().manual_seed(splits)
    dt = torch.bfloat16 if CUDA else torch.float32
    H, Hq, Hkv, D, I = 192, 3, 1, 64, 160
    big = max(INVARIANT_MS)
    x, g, g2 = rows(big, H, gen, dt), vec(H, gen, dt), vec(H, gen, dt)
    wqkv, wgu, wd = mat((Hq + 2 * Hkv) * D, 2 * H, gen, dt), mat(2 * I, H, gen, dt), mat(H, I, gen, dt)
    a = rows(big, I, gen, dt)
    e = rows(big, H, gen, dt)
    ra = rope_args(big, Hq, Hkv, D, gen, dt)

    def every(M):
        c = lambda n, k: cfg(n, k, M, splits)  # noqa: E731
        r = {k: (v[:M] if k in ("positions", "out_slots") else v) for k, v in ra.items()}
        q, kc, vc = run_qkv(P.proj_rope_store, e[:M], g, wqkv, None, r, x2=x[:M], norm_weight2=g2,
                            cfg=c(wqkv.shape[0], H))
        slots = r["out_slots"]
        return dict(
            lin=P.linear(x[:M], wd.t().contiguous(), None, g, EPS, cfg=c(I, H)),
            add=P.linear_add(x[:M], a[:M], wd, cfg=c(H, I)),
            silu=P.gate_up_silu(x[:M], g, wgu, EPS, cfg=c(2 * I, H)),
            q=q, k=kc[slots], v=vc[slots],
        )

    full = every(big)
    for M in INVARIANT_MS[:-1]:
        part = every(M)
        for name, t in part.items():
            assert torch.equal(t, full[name][:M]), (name, M)
    if CUDA:  # the table's own configs too (cfg=None), at both regimes
        one = P.gate_up_silu(x[:1], g, wgu, EPS)
        assert torch.equal(one, P.gate_up_silu(x, g, wgu, EPS)[:1])


@needs_kernel
@pytest.mark.parametrize("splits", [1, 3])
def test_sumsq_pre_pass_sums_as_the_split_k_path(splits):
    """The prefill path's sums of squares (`_sumsq_kernel`) have `row_sumsq_ref`'s bits (the split-K path's order:
    lanes per split, a pairwise tree, the splits in order), with a K tail, for any rows-per-program."""
    gen = torch.Generator().manual_seed(20 + splits)
    dt = torch.bfloat16 if CUDA else torch.float32
    M, K = 37, 600  # 64-wide steps: 10 in one split; 4, 4 and 2 in three
    x = rows(M, K, gen, dt)
    c = cfg(64, K, M, splits)
    want = P.row_sumsq_ref(x, c["SPLITS"], c["SPLIT_K"], c["BLOCK_K"])  # [M]
    assert rel_err(want, x.float().pow(2).sum(-1)) < 1e-6
    for block_m in (16, 64):
        out = torch.full((M,), float("nan"), device=DEVICE)  # [M]
        P._sumsq_kernel[(-(-M // block_m),)](x, out, M, K, x.stride(0), c["SPLIT_K"], SPLITS=c["SPLITS"],
                                             BLOCK_M=block_m, BLOCK_K=c["BLOCK_K"])
        assert torch.equal(out, want), block_m


@needs_kernel
@pytest.mark.parametrize("splits", [1, 3])
def test_prefill_rows_match_split_k_rows_with_norms(splits, monkeypatch):
    """A prefill row takes its sum of squares from the pre-pass, not from its K loop, and still has the split-K path's
    bits: norms folded (NORM 1) and applied (NORM 2), one input and two (mixed), in the test's 64-row prefill tiles, in
    128 (RoPE: 64) x 256 ones (on the GPU also with the MMA's K tile half the plan's, and on the split-K grid), and in
    the table's own prefill tiles (MAX_SPLIT_M lowered to reach them here)."""
    gen = torch.Generator().manual_seed(30 + splits)
    dt = torch.bfloat16 if CUDA else torch.float32
    H, Hq, Hkv, D, I = 192, 3, 1, 64, 160
    big = 300
    Nq = (Hq + 2 * Hkv) * D
    x, e, g, g2 = rows(big, H, gen, dt), rows(big, H, gen, dt), vec(H, gen, dt), vec(H, gen, dt)
    wl, wgu, wq, wq2 = mat(I, H, gen, dt), mat(2 * I, H, gen, dt), mat(Nq, H, gen, dt), mat(Nq, 2 * H, gen, dt)
    ra = rope_args(big, Hq, Hkv, D, gen, dt)

    def every(M, c):
        r = {k: (v[:M] if k in ("positions", "out_slots") else v) for k, v in ra.items()}
        slots = r["out_slots"]
        q1, k1, v1 = run_qkv(P.proj_rope_store, x[:M], P.FOLDED, wq, None, r, cfg=c(Nq, H, True))
        q2, k2, v2 = run_qkv(P.proj_rope_store, e[:M], P.FOLDED, wq2, None, r, x2=x[:M], norm_weight2=g2,
                             cfg=c(Nq, H, True))
        return dict(
            lin_plain=P.linear(x[:M], wl, cfg=c(I, H)),
            lin_folded=P.linear(x[:M], wl, None, P.FOLDED, EPS, cfg=c(I, H)),
            lin=P.linear(x[:M], wl, None, g, EPS, cfg=c(I, H)),
            silu_folded=P.gate_up_silu(x[:M], P.FOLDED, wgu, EPS, cfg=c(2 * I, H)),
            q1=q1, k1=k1[slots], v1=v1[slots], q2=q2, k2=k2[slots], v2=v2[slots],
        )

    def wide(n, k, rope=False):
        return dict(cfg(n, k, big, splits), BLOCK_N=64 if rope else 128, BLOCK_M=256, num_warps=8, IN_PROGRAM=True)

    full = every(big, lambda n, k, rope=False: cfg(n, k, big, splits))
    assert big > P.MAX_SPLIT_M  # the test's cfg runs the prefill path by rows
    for M in (1, 7, 64):
        part = every(M, lambda n, k, rope=False: cfg(n, k, M, splits))
        for name, t in part.items():
            assert torch.equal(t, full[name][:M]), (name, M)
    for name, t in every(big, wide).items():
        assert torch.equal(t, full[name]), (name, "256-row tiles")
    if CUDA:  # the interpreter's dot is one numpy matmul a tile: there a K tile's width rounds
        def narrow(n, k, rope=False):  # the MMA's K tile half the plan's; the pre-pass keeps the plan's lanes
            return dict(wide(n, k, rope), BLOCK_K=32, SUMSQ_K=64, num_stages=3)

        for name, t in every(big, narrow).items():
            assert torch.equal(t, full[name]), (name, "32-wide K tiles")
        # no norm: the split-K grid in a prefill's tiles, each split a program, in the narrower K tile too
        grid = dict(cfg(I, H, big, splits), BLOCK_K=32, BLOCK_N=128, BLOCK_M=256, num_warps=8, IN_PROGRAM=False)
        assert torch.equal(P.linear(x, wl, cfg=grid), full["lin_plain"])
    if splits == 1:  # the table's plans split nothing at these K
        one = every(7, lambda n, k, rope=False: None)
        monkeypatch.setattr(PC, "MAX_SPLIT_M", 16)
        assert P.launch_config(I, H, 40, P._PLAIN, dt, x.device)["IN_PROGRAM"]
        table = every(40, lambda n, k, rope=False: None)
        for name, t in one.items():
            assert torch.equal(t, table[name][:7]), (name, "table")


def test_config_depends_on_the_weight_only():
    """The launch table: the reduction plan (the splits and the K tile: what fixes an element's order) is one per
    weight shape, never per M (the row tiles may differ); more splits where the weight has few row tiles."""
    dev = torch.device("cpu")
    for N, K in [(6144, 4096), (4096, 14336), (960, 576)]:
        plans = {(c["SPLITS"], c["SPLIT_K"], c.get("SUMSQ_K", c["BLOCK_K"]))  # a prefill's MMA K tile is its own
                 for M in (1, 8, 64, 2048) for c in [P.launch_config(N, K, M, P._PLAIN, torch.bfloat16, dev)]}
        assert len(plans) == 1, (N, K, plans)
    few = PC._config(4096, 14336, P._ADD, torch.bfloat16, 132, False)
    many = PC._config(28672, 4096, P._SILU, torch.bfloat16, 132, False)
    assert few["SPLITS"] > 1 and many["SPLITS"] == 1
    assert few["SPLITS"] * few["SPLIT_K"] >= 14336 > (few["SPLITS"] - 1) * few["SPLIT_K"]


def test_prefill_tiles():
    """sm_90's prefill tiles at the models' shapes (132 SMs, bf16): the stages fit 227 KB of shared memory, RoPE tiles
    stay within a head, the MMA's K tile is 64 with the pre-pass in the plan's lanes, 256-row x tiles go only where
    the program holds one accumulator and its K loop leaves x alone, a tile's grid has at least half as many
    programs as there are SMs where one can, and a weight of long splits without a norm runs on the split-K grid."""
    bf16 = torch.bfloat16

    def tiles(N, K, M, epi, D=64, two=False, norm=1, grid=False):
        c = PC._table(N, K, M, epi, bf16, 132, False, D, two, norm)
        plan = PC._config(N, K, epi, bf16, 132, False)
        assert c["IN_PROGRAM"] != grid and c["num_warps"] == 8
        assert c["BLOCK_K"] == 64 and c["SUMSQ_K"] == plan["BLOCK_K"] and c["SPLIT_K"] == plan["SPLIT_K"]
        assert c["num_stages"] * (c["BLOCK_N"] + c["BLOCK_M"]) * c["BLOCK_K"] * 2 <= 227 * 1024
        return c["BLOCK_N"], c["BLOCK_M"]

    for H, I, Hq, Hkv, D in MODELS.values():
        for M in (257, 2048, 16384):
            qkv = (Hq + 2 * Hkv) * D
            assert tiles(qkv, H, M, P._ROPE, D)[0] == D
            assert tiles(qkv, H, M, P._ROPE, D, two=True)[1] == 128
            assert tiles(2 * I, H, M, P._SILU, norm=2) == (128, 128)
    for M in (257, 2048):  # the 8B's o and down: 2 splits of 2,048 / 7,168 columns
        assert tiles(4096, 4096, M, P._ADD, norm=0, grid=True) == (128, 256)
        assert tiles(4096, 14336, M, P._ADD, norm=0, grid=True) == (128, 256)
    assert tiles(576, 1536, 2048, P._ADD, norm=0) == (128, 128)  # SmolLM2's down: 4 splits of 384, in the program
    assert tiles(576, 1536, 257, P._ADD, norm=0) == (64, 128)  # no tile reaches 66 programs: the most, 27
    assert tiles(2 * 14336, 4096, 2048, P._SILU) == (128, 256)
    assert tiles(2 * 1536, 576, 2048, P._SILU) == (128, 256)  # 24 x 8 = 192 programs
    assert tiles(576, 576, 2048, P._ADD, norm=0) == (128, 128)  # 5 x 8 = 40 programs of 128 x 256
    assert tiles(960, 576, 2048, P._ROPE, 64) == (64, 256)  # 15 x 8 = 120
    assert tiles(6144, 4096, 16384, P._ROPE, 128) == (128, 128)  # RoPE at 128 weight rows: 128-row x tiles


@needs_kernel
def test_bad_inputs():
    x = torch.randn(4, 64, device=DEVICE)
    w = torch.randn(32, 64, device=DEVICE)
    with pytest.raises(ValueError, match="weight must be"):
        P.linear(x, torch.randn(32, 63, device=DEVICE))
    with pytest.raises(ValueError, match="row-major"):
        P.linear(x, torch.randn(64, 32, device=DEVICE).t())
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        P.linear(x, w, norm_weight=torch.ones(63, device=DEVICE))
    with pytest.raises(ValueError, match="dtype"):
        P.linear(x, w.double())
    with pytest.raises(ValueError, match=r"out must be \[M, N\]"):
        P.linear_add_(torch.zeros(4, 31, device=DEVICE), x, w)
    with pytest.raises(ValueError, match="gate rows"):
        P.gate_up_silu(x, torch.ones(64, device=DEVICE), torch.randn(31, 64, device=DEVICE), EPS)
    with pytest.raises(ValueError, match="x2 must be"):
        ra = rope_args(4, 1, 1, 64, torch.Generator().manual_seed(0), torch.float32)
        run_qkv(P.proj_rope_store, x, None, torch.randn(192, 128, device=DEVICE), None, ra,
                x2=torch.randn(3, 64, device=DEVICE))


# SmolLM2-135M and Llama-3.1-8B (H, I, Hq, Hkv, D)
MODELS = {"smollm2": (576, 1536, 9, 3, 64), "llama3_8b": (4096, 14336, 32, 8, 128)}


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model", list(MODELS))
def test_model_shapes_gpu(model, dtype):
    """The table's configs at the real shapes: close to the reference, and every row bit-identical across M
    (decode 1, verify 8, 64 and 130 rows, a 513-token prefill) for all four block projections and the LM head."""
    H, I, Hq, Hkv, D = MODELS[model]
    gen = torch.Generator().manual_seed(0)
    big = 513
    x, g = rows(big, H, gen, dtype), vec(H, gen, dtype)
    wqkv, wo = mat((Hq + 2 * Hkv) * D, H, gen, dtype), mat(H, Hq * D, gen, dtype)
    wgu, wd = mat(2 * I, H, gen, dtype), mat(H, I, gen, dtype)
    o, a = rows(big, Hq * D, gen, dtype), rows(big, I, gen, dtype)
    ra = rope_args(big, Hq, Hkv, D, gen, dtype)

    def every(M):
        r = {k: (v[:M] if k in ("positions", "out_slots") else v) for k, v in ra.items()}
        q, kc, vc = run_qkv(P.proj_rope_store, x[:M], g, wqkv, None, r)
        return dict(q=q, k=kc[r["out_slots"]], o=P.linear_add(x[:M], o[:M], wo), gu=P.gate_up_silu(x[:M], g, wgu, EPS),
                    down=P.linear_add(x[:M], a[:M], wd))

    full = every(big)
    want_q = run_qkv(P.proj_rope_store_ref, x, g, wqkv, None, ra)[0]
    assert rel_err(full["q"], want_q) < tol(dtype)
    assert rel_err(full["gu"], P.gate_up_silu_ref(x, g, wgu, EPS)) < tol(dtype)
    assert rel_err(full["down"], P.linear_add_ref(x, a, wd)) < tol(dtype)
    for M in (1, 8, 64, 130):
        part = every(M)
        for name, t in part.items():
            assert torch.equal(t, full[name][:M]), (name, M)


@gpu_only
def test_cuda_graph_replays_split_k():
    """The split-K arrival counters are left at zero by each launch: a captured graph replays correctly, again."""
    gen = torch.Generator().manual_seed(1)
    dt = torch.bfloat16
    x, w = rows(8, 4096, gen, dt), mat(4096, 4096, gen, dt)
    assert P.launch_config(4096, 4096, 8, P._ADD, dt, x.device)["SPLITS"] > 1
    want = P.linear_add(x, x, w)
    out = torch.empty_like(want)
    P.linear_add(x, x, w)  # warm-up: compile and allocate the counters outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(P.linear_add(x, x, w))
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, want)
