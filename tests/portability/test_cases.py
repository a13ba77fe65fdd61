"""The compile cases are the launches: a launcher called on CPU tensors (its kernel intercepted, never run) passes the
arguments its module's case for that call has (kernels/_compile_cases.py), on a GPU of the SM count the launcher
plans for off a GPU. Tensor element types, alignment and the scalars' specialisation (== 1, a multiple of 16) are
what a case restates by hand; constexprs and launch options come from the shared config tables and must match too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import triton

from eaglet.kernels import projection as PJ
from eaglet.kernels import tree_attention as TA
from eaglet.kernels import tree_attention_invariant as TAI
from eaglet.kernels import tree_attention_splitkv as TAS
from eaglet.kernels import trie_graft as TG
from eaglet.kernels._compile_cases import Ptr, model_shapes
from eaglet.kernels._utils import is_interpret
from eaglet.kernels.tree_attention_plan import CASE_PAGE

if is_interpret():
    pytest.skip("the cases are for compiled kernels (PRECISE_TRIG, bf16 dots): run without TRITON_INTERPRET=1",
                allow_module_level=True)

SMOL, LLAMA = model_shapes()
BF16 = torch.bfloat16
EPS = 1e-5


def launches(monkeypatch, module, names: tuple[str, ...], call, launcher=None) -> list[tuple[str, dict]]:
    """(kernel name, its arguments by name) of every launch of module.<names> that call() makes; the kernels do not
    run, and the launcher (its module: `launcher`, else `module`) takes its Triton path for CPU tensors. The modules
    are as they were afterwards."""
    seen = []
    with monkeypatch.context() as patch:
        for name in names:
            kernel = getattr(module, name)
            fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel

            class Launch:
                def __getitem__(self, grid, name=name, fn=fn):
                    return lambda *args, **kw: seen.append((name, {**dict(zip(fn.arg_names, args)), **kw}))

            patch.setattr(module, name, Launch())
        patch.setattr(launcher or module, "use_triton", lambda *tensors: True)
        call()
    return seen


def assert_mirrors(case, launch: dict) -> None:
    """Each launch argument as the case has it."""
    params = {p.name: p for p in case.kernel.params}
    for name, v in launch.items():
        c = case.args[name] if name in case.args else case.options[name]
        if isinstance(v, torch.Tensor):
            assert isinstance(c, Ptr) and (c.dtype, c.aligned) == (v.dtype, v.data_ptr() % 16 == 0), name
        elif isinstance(v, int) and not isinstance(v, bool) and name in params and not params[name].is_constexpr:
            assert (v == 1, v % 16 == 0) == (c == 1, c % 16 == 0), (name, v, c)
        elif isinstance(v, float):
            assert isinstance(c, float), name
        else:
            assert v == c, (name, v, c)


def test_model_shapes_are_the_models():
    """The shapes kernels/_compile_cases.py restates (kernels/ imports no model code) are models/llama.py's."""
    from eaglet.models.llama import transformer_configs

    for s in model_shapes():
        c = transformer_configs[s.name]
        assert (s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.ffn, s.vocab) == (
            c["dim"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["intermediate_size"], c["vocab_size"]), s.name
    shipped = json.loads((Path(__file__).resolve().parents[2] / "heads" / "smollm2_135m_eagle3" / "config.json")
                         .read_text())
    assert SMOL.draft_vocab == shipped["draft_vocab_size"]


def rope_tensors(M: int, s, slots: int = 64) -> tuple:
    D = s.head_dim
    return (torch.zeros(M, dtype=torch.int64), torch.zeros(D // 2), torch.empty(slots, s.n_kv_heads, D, dtype=BF16),
            torch.empty(slots, s.n_kv_heads, D, dtype=BF16), torch.zeros(M, dtype=torch.int64))


def qkv_rows(s) -> int:
    return (s.n_heads + 2 * s.n_kv_heads) * s.head_dim


@pytest.mark.parametrize("s", [SMOL, LLAMA], ids=lambda s: s.name)
@pytest.mark.parametrize("M", [1, 32, 64, 100, 320, 301])  # 320, 301: prefills (a second input's sums unaligned)
def test_projection_cases_are_its_launches(monkeypatch, s, M):
    H, N, heads = s.hidden, qkv_rows(s), (s.n_heads, s.n_kv_heads, s.head_dim)
    x, x2, g = torch.empty(M, H, dtype=BF16), torch.empty(M, H, dtype=BF16), torch.empty(H, dtype=BF16)
    calls = [  # (the launch, the case's EPI, N, K, K2, NORM, NORM2, HAS_BIAS, heads)
        (lambda: PJ.proj_rope_store(x, g, torch.empty(N, H, dtype=BF16), torch.empty(N, dtype=BF16),
                                    *rope_tensors(M, s), *heads, EPS), PJ._ROPE, N, H, 0, 2, 0, True, heads),
        (lambda: PJ.proj_rope_store(x, PJ.FOLDED, torch.empty(N, 2 * H, dtype=BF16), None, *rope_tensors(M, s),
                                    *heads, EPS, x2=x2, norm_weight2=PJ.FOLDED), PJ._ROPE, N, H, H, 1, 1, False, heads),
        (lambda: PJ.linear_add_(x, torch.empty(M, s.ffn, dtype=BF16), torch.empty(H, s.ffn, dtype=BF16)), PJ._ADD,
         H, s.ffn, 0, 0, 0, False, (1, 1, 1)),
        (lambda: PJ.gate_up_silu(x, PJ.FOLDED, torch.empty(2 * s.ffn, H, dtype=BF16), EPS), PJ._SILU, 2 * s.ffn, H,
         0, 1, 0, False, (1, 1, 1)),
        (lambda: PJ.linear(x, torch.empty(s.draft_vocab, H, dtype=BF16), norm_weight=g, eps=EPS), PJ._PLAIN,
         s.draft_vocab, H, 0, 2, 0, False, (1, 1, 1)),
    ]
    for call, epi, N_, K, K2, norm, norm2, bias, hd in calls:
        seen = launches(monkeypatch, PJ, ("_sumsq_kernel", "_proj_kernel"), call)
        case, *pre = PJ._case(epi, M, N_, K, K2, norm, norm2, bias, hd, 8, False, "")  # 8: off a GPU
        # the prefill's pre-pass, one per input with a norm, runs before the projection
        assert [name for name, _ in seen] == ["_sumsq_kernel"] * len(pre) + ["_proj_kernel"]
        assert (M > PJ.MAX_SPLIT_M and norm + norm2 > 0) == bool(pre)
        for c, (_, got) in zip([*pre, case], seen):
            assert_mirrors(c, got)


@pytest.mark.parametrize("s", [SMOL, LLAMA], ids=lambda s: s.name)
@pytest.mark.parametrize("call", [(1, 1, False, 1024), (8, 1, False, 1024), (1, 8, True, 1024), (8, 60, True, 1024),
                                  (1, 2048, False, 0)], ids=["decode", "decode-B8", "verify", "verify-B8-N60",
                                                             "prefill"])
@pytest.mark.parametrize("invariant", [False, True], ids=["split-kv", "invariant"])
def test_tree_attention_cases_are_its_launches(monkeypatch, s, call, invariant):
    B, N, tree, prefix = call
    pages = -(-(prefix + N) // CASE_PAGE)
    q = torch.empty(B, N, s.n_heads, s.head_dim, dtype=BF16)
    cache = torch.empty(B * pages, CASE_PAGE, s.n_kv_heads, s.head_dim, dtype=BF16)
    mask = torch.ones(B, N, N, dtype=torch.bool) if tree else None
    kernels = TAI if invariant else TAS
    names = ("_inv_fwd_kernel", "_inv_merge_kernel") if invariant else ("_fwd_kernel", "_merge_kernel")
    kernels.prepare.cache_clear()  # a recipe holds the kernel objects it was built with
    try:
        got = launches(monkeypatch, kernels, names, lambda: TA.tree_attention(
            q, cache, cache, torch.zeros(B, pages, dtype=torch.int32), torch.zeros(B, dtype=torch.int32), mask,
            max_prefix_len=prefix, invariant=invariant), launcher=TA)
    finally:
        kernels.prepare.cache_clear()
    if invariant:
        cases = TAI._call_cases(s, B, N, tree, prefix, False, "")
    else:
        cases = TAS._call_cases(s, B, N, tree, prefix, 8, False, "")  # 8: the plan off a GPU
    fwd = [c for c in cases if "fwd" in c.kernel.__name__]
    merge = [c for c in cases if "merge" in c.kernel.__name__]
    assert [n for n, _ in got] == [fwd[0].kernel.__name__] + [c.kernel.__name__ for c in merge]
    for case, (_, args) in zip(fwd[:1] + merge, got):
        assert_mirrors(case, args)


@pytest.mark.parametrize("case", TG.compile_cases(False), ids=lambda c: c.used_by[0])
def test_trie_graft_cases_are_its_launches(monkeypatch, case):
    """The n-gram drafter's and n-gram branches' grafts at each tree, B = 2: the launch is its case."""
    N, M, P, S = (case.args[k] for k in ("N", "M", "P", "S"))
    links = torch.full((2, N), -1, dtype=torch.int64)
    tree = (torch.zeros(2, N, dtype=torch.int64), torch.zeros(2, N, dtype=torch.int64), links, links,
            torch.ones(2, N, N, dtype=torch.bool))
    fallback = None  # n-gram branches on a model drafter's tree carry its widened tree
    if case.args["HAS_FALLBACK"]:
        fb_links = torch.full((2, M), -1, dtype=torch.int64)
        fallback = (torch.zeros(2, M, dtype=torch.int64), torch.zeros(2, M, dtype=torch.int64), fb_links, fb_links,
                    torch.ones(2, M, M, dtype=torch.bool))
    [(_, args)] = launches(monkeypatch, TG, ("_graft_kernel",),
                           lambda: TG.graft(tree, torch.full((2, P, S), -1, dtype=torch.int64), M - N, fallback))
    assert_mirrors(case, args)
