"""Do a query row's bits depend on the MMA's row count? One attention tile (q [M, D] @ k.T, exp2, p @ v, row sums)
at M = 16, 32, 64, 128 (num_warps 4 and 8), the same 8 query rows placed at rows 3..10 in every tile; bf16 inputs,
fp32 accumulation, as kernels/tree_attention_invariant.py's tiles. Prints which parts match M = 16 bit for bit."""
import torch
import triton
import triton.language as tl

from eaglet.kernels._fixed_order import fixed_sum1


@triton.jit
def _tile(Q, K, V, S, O, R, R2, M: tl.constexpr, D: tl.constexpr, BN: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, D)
    q = tl.load(Q + rm[:, None] * D + rd[None, :])  # [M, D]
    k = tl.load(K + rn[:, None] * D + rd[None, :])  # [BN, D]
    v = tl.load(V + rn[:, None] * D + rd[None, :])  # [BN, D]
    s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [M, BN]
    tl.store(S + rm[:, None] * BN + rn[None, :], s)
    p = tl.math.exp2(s * 0.125 - tl.max(s * 0.125, 1)[:, None])  # [M, BN]
    tl.store(R + rm, tl.sum(p, 1))
    tl.store(R2 + rm, fixed_sum1(p, M, BN))
    o = tl.dot(p.to(tl.bfloat16), v, input_precision="ieee")  # [M, D]
    tl.store(O + rm[:, None] * D + rd[None, :], o)


def run(M, warps, q8, k, v, D, BN):
    q = torch.zeros(M, D, device="cuda", dtype=torch.bfloat16)
    q[3:11] = q8
    s = torch.empty(M, BN, device="cuda")
    o = torch.empty(M, D, device="cuda")
    r = torch.empty(M, device="cuda")
    r2 = torch.empty(M, device="cuda")
    _tile[(1,)](q, k, v, s, o, r, r2, M, D, BN, num_warps=warps)
    return s[3:11], o[3:11], r[3:11], r2[3:11]


for D in (64, 128):
    for BN in (32, 64):
        same = {}
        for seed in range(20):
            g = torch.Generator(device="cuda").manual_seed(seed)
            q8 = torch.randn(8, D, device="cuda", generator=g).to(torch.bfloat16) * 3
            k = torch.randn(BN, D, device="cuda", generator=g).to(torch.bfloat16) * 3
            v = torch.randn(BN, D, device="cuda", generator=g).to(torch.bfloat16)
            base = run(16, 4, q8, k, v, D, BN)
            for M in (16, 32, 64, 128):
                for w in (4, 8):
                    got = run(M, w, q8, k, v, D, BN)
                    eq = [torch.equal(a, b) for a, b in zip(base, got)]
                    same[(M, w)] = [x and y for x, y in zip(same.get((M, w), [True] * 4), eq)]
        for (M, w), eq in same.items():
            print(f"| D={D} BN={BN} | M={M} warps={w} | qk {eq[0]} | pv {eq[1]} | tl.sum {eq[2]} "
                  f"| fixed_sum1 {eq[3]} |")
