"""Every registered compile case (kernels/_compile_cases.py) compiled ahead of time for H100 (sm_90) and MI300X
(gfx942) on this CPU, and checked against the targets' limits (kernels/_aot.py). It compiles for real, so it runs in
its own pytest process without TRITON_INTERPRET (scripts/test.sh); the cases compile in a process pool, once."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
import yaml

from eaglet.kernels._utils import is_interpret

if is_interpret():
    pytest.skip("compiles for real: run without TRITON_INTERPRET=1", allow_module_level=True)

from eaglet.kernels import _aot  # noqa: E402
from eaglet.kernels._compile_cases import MODULES, TREES, CompileCase, Ptr, launched_kernels  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JOBS = [job for target in _aot.TARGETS for job in _aot.unique_jobs(target)]


@pytest.fixture(scope="module")
def results() -> dict[str, _aot.Result]:
    return {job.name: res for job, res in zip(JOBS, _aot.compile_all())}


@pytest.mark.parametrize("job", JOBS, ids=[job.name for job in JOBS])
def test_compiles_within_limits(job, results):
    res = results[job.name]
    assert res.compiled, res.error
    assert not _aot.problems(res), "\n".join(_aot.problems(res))


def test_occupancy_is_llvms(results):
    """gfx942: the waves per SIMD computed from VGPRs and SGPRs equal what LLVM reports for each binary without a
    waves_per_eu hint. LLVM does not see Triton's LDS (allocated at launch: its metadata says 0 bytes), which the
    computed occupancy also counts, and reports a hinted binary's requested waves per SIMD."""
    amd = [r for r in results.values() if r.target == "gfx942" and r.compiled]
    assert amd and all(r.llvm_occupancy is not None for r in amd)
    unhinted = [r for r in amd if not r.waves_per_eu]
    assert unhinted and any(r.shared for r in unhinted)
    assert [r.name for r in unhinted if _aot.occupancy(replace(r, shared=0)) != r.llvm_occupancy] == []
    assert [r.name for r in amd if r.waves_per_eu and r.llvm_occupancy != r.waves_per_eu] == []
    assert all(r.occupancy <= _aot.occupancy(replace(r, shared=0)) for r in amd)


def test_sm90_occupancy():
    """Warps per SM from registers (256-register units a warp, 64K an SM) and shared memory (1 KB reserved a block)."""

    def occ(regs, warps, shared=0):
        return _aot.occupancy(_aot.Result("k", "", "", "sm_90", (), warps, regs=regs, shared=shared))

    assert occ(32, 4) == 64  # every limit above the 64-warp cap
    assert occ(128, 8) == 16  # 4,096 registers a warp: 16 warps, 2 blocks
    assert occ(33, 4, shared=100 * 1024) == 8  # 2 blocks of 101 KB fit in 228 KB, not 3


def test_every_kernel_has_cases():
    """Each launched kernel (@triton.jit `*_kernel`) of a registered module has a case on both targets; every module
    with a kernel is registered."""
    for target in _aot.TARGETS:
        have = {job.case.kernel_name for job in _aot.unique_jobs(target)}
        want = {f"{m}.{k}" for m in MODULES for k in launched_kernels(m)}
        assert want - have == set(), target
    kernel_modules = {p.stem for p in (REPO / "kernels").glob("[!_]*.py") if launched_kernels(p.stem)}
    assert kernel_modules - set(MODULES) == set()


def test_conf_trees_are_compiled():
    """Every tree in conf/tree has its sizes in TREES, so its kernels' constexprs are compiled."""
    sizes = {(t.steps, t.topk, t.num_draft_tokens) for t in TREES}
    for path in sorted((REPO / "conf" / "tree").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        assert (cfg["steps"], cfg["topk"], cfg["num_draft_tokens"]) in sizes, path.name


@triton.jit
def _tile_dot_kernel(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A K loop of tile products: its pipelined tiles live in shared memory / LDS, num_stages of them."""
    m, n, k = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # [BM, BN]
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + m[:, None] * K + (k0 + k)[None, :])  # [BM, BK]
        b = tl.load(b_ptr + (k0 + k)[:, None] * BLOCK_N + n[None, :])  # [BK, BN]
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + m[:, None] * BLOCK_N + n[None, :], acc)


def test_lds_overflow_is_reported():
    """A config whose three stages of 128x128 bf16 tiles (128 KB) fit an H100's 227 KB but not MI300's 64 KB of LDS:
    sm_90 passes, gfx942 fails with one line naming the kernel, its config and the target."""
    bf16 = Ptr(torch.bfloat16)
    case = CompileCase(_tile_dot_kernel, dict(a_ptr=bf16, b_ptr=bf16, c_ptr=Ptr(torch.float32), K=4096, BLOCK_M=128,
                                              BLOCK_N=128, BLOCK_K=128), dict(num_warps=8, num_stages=3))
    assert _aot.problems(_aot.compile_case(case, "sm_90")) == []
    res = _aot.compile_case(case, "gfx942")
    assert res.shared > 64 * 1024
    assert _aot.problems(res) == [
        "test_compile._tile_dot_kernel[BLOCK_M=128 BLOCK_N=128 BLOCK_K=128 num_stages=3 num_warps=8]{%16: K} on "
        f"gfx942: LDS {res.shared} B > 65536 B"]


def test_autotune_entry_case():
    """`CompileCase.from_config`: a triton.Config's constexprs become arguments, the rest launch options; a HIP entry
    (waves_per_eu) compiles for gfx942 with it, and is refused for sm_90, whose backend has no such option."""
    bf16 = Ptr(torch.bfloat16)
    config = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "waves_per_eu": 2}, num_warps=4, num_stages=2)
    case = CompileCase.from_config(_tile_dot_kernel, dict(a_ptr=bf16, b_ptr=bf16, c_ptr=Ptr(torch.float32), K=4096),
                                   config, ("a shape",))
    assert case.args["BLOCK_K"] == 64 and case.used_by == ("a shape",)
    assert case.options == dict(waves_per_eu=2, num_warps=4, num_stages=2, num_ctas=1)
    assert case.config == "BLOCK_M=32 BLOCK_N=32 BLOCK_K=64 num_ctas=1 num_stages=2 num_warps=4 waves_per_eu=2"
    res = _aot.compile_case(case, "gfx942")
    assert res.compiled and _aot.problems(res) == []
    with pytest.raises(KeyError, match="waves_per_eu"):
        _aot.compile_case(case, "sm_90")


def test_spill_is_reported():
    """A registered kernel with a block far past its launcher's (the top-k merge over 65,536 keys) spills on sm_90:
    reported with its kernel, config and target."""
    from eaglet.kernels.topk import compile_cases

    case = next(c for c in compile_cases(False) if c.kernel.__name__ == "_rows_kernel")
    case = replace(case, args={**case.args, "BLOCK_KC": 65536})
    res = _aot.compile_case(case, "sm_90")
    [msg] = _aot.problems(res)
    assert msg.startswith(f"topk._rows_kernel[{case.config}]")
    assert res.spills > 0 and res.stack > 0
    assert "BLOCK_KC=65536" in msg
    assert f"on sm_90: {res.spills} B of spill stores a thread ({res.stack} B stack frame)" in msg


def test_local_array_is_not_a_spill():
    """sm_90: libdevice's sin/cos keep the 28-byte table of their range reduction (angles past 105,615 rad) in the
    stack frame, a local array: a RoPE epilogue has that frame and no spill stores (ptxas's report), and passes."""
    from eaglet.kernels.projection import _ROPE, compile_cases

    case = next(c for c in compile_cases(False) if c.args["EPI"] == _ROPE and c.args["M"] == 1)
    res = _aot.compile_case(case, "sm_90")
    assert (res.stack, res.spills) == (32, 0)
    assert _aot.problems(res) == []


def test_workgroup_that_cannot_fit_is_reported():
    """gfx942: a workgroup of 16 waves needs 4 waves on each SIMD; a kernel whose VGPRs allow fewer cannot launch."""
    res = _aot.Result("k", "cfg", "", "gfx942", (), 16, regs=256, sgprs=32)
    res.occupancy = _aot.occupancy(res)
    assert res.occupancy == 2 and math.ceil(16 / 4) == 4
    assert _aot.problems(res) == ["k[cfg]{} on gfx942: a workgroup of 16 waves needs 4 waves per SIMD, its 256 VGPRs "
                                  "/ 32 SGPRs / 0 B LDS allow 2"]
