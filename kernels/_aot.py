"""Ahead-of-time compilation of the registry's cases (kernels/_compile_cases.py) for GPUs this machine does not have:
H100 (sm_90, a cubin) and MI300X (gfx942, an HSACO), with the resources each binary uses and the limits it must meet.

    unique_jobs(target)           the registry's cases for one target, one per binary
    compile_case(case, target)    -> Result: compiled or the error, registers, spills/scratch, shared memory/LDS,
                                  occupancy
    compile_all(targets, procs)   every unique job of every target, compiled in a process pool
    problems(result)              the limits a Result breaks, one line each naming kernel, config and target

A case is specialised exactly as a launch would be: the kernel's own binder (Triton's `create_function_from_signature`
and `JITFunction._pack_args`, internals kept stable across Triton 3.x) turns its arguments into the signature,
constexprs, alignment attributes and options, and `triton.compile` builds that for the target. ptxas (sm_90) and
LLVM's AMDGPU backend with its linker (gfx942) ship inside Triton's wheel, so nothing else is needed.

Where the numbers come from. sm_90: registers and the per-thread stack frame from `cuobjdump -res-usage` on the
cubin; where there is a frame, the bytes of spill stores in it from ptxas's own report on the PTX (the frame also
holds local arrays: libdevice's sin/cos keep the 28-byte table of their range reduction there, spilling nothing);
shared memory is Triton's allocation (`metadata.shared`, what a launch checks against the device's opt-in limit).
gfx942: the code object's metadata in the AMDGCN assembly (VGPRs including AGPRs, SGPRs, spill counts, private
segment = scratch, LLVM's occupancy); LDS is `metadata.shared`.
"""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import triton
from triton.backends.compiler import GPUTarget

from eaglet.kernels._compile_cases import CompileCase, all_cases

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}


@dataclass(frozen=True)
class Limits:
    max_threads: int  # per block / workgroup
    shared_per_block: int  # bytes a block may allocate (sm_90: the opt-in maximum; gfx942: LDS per workgroup)
    max_regs: int  # per thread (sm_90) / unified VGPRs + AGPRs per lane (gfx942)


# H100: 228 KB shared memory per SM, of which a block may take 227 KB (1 KB per block is reserved for the system),
# 64K registers per SM, at most 255 a thread. MI300X (CDNA3): 64 KB LDS per CU, 512 VGPRs per lane per SIMD.
LIMITS = {"sm_90": Limits(1024, 227 * 1024, 255), "gfx942": Limits(1024, 64 * 1024, 512)}


@dataclass
class Result:
    """One case compiled for one target (picklable: the pool returns these)."""

    kernel: str
    config: str
    specialised: str
    target: str
    used_by: tuple[str, ...]
    num_warps: int
    error: str | None = None  # the compiler's first line when it failed
    shared: int = 0  # bytes of shared memory / LDS per block
    regs: int = 0  # sm_90: registers a thread; gfx942: VGPRs a lane (arch + AGPRs)
    agprs: int = 0  # gfx942
    sgprs: int = 0  # gfx942
    stack: int = 0  # sm_90: stack-frame bytes a thread (spills and local arrays)
    spills: int = 0  # sm_90: bytes of spill stores a thread; gfx942: VGPRs + SGPRs spilled
    scratch: int = 0  # gfx942: private-segment bytes a lane
    occupancy: int | None = None  # sm_90: warps per SM; gfx942: waves per SIMD (computed from the numbers above)
    llvm_occupancy: int | None = None  # gfx942: the waves per SIMD LLVM reports for the binary
    waves_per_eu: int = 0  # gfx942: the launch's occupancy hint (0: none), which LLVM reports as the occupancy

    @property
    def compiled(self) -> bool:
        return self.error is None

    @property
    def name(self) -> str:
        return f"{self.kernel}[{self.config}]{{{self.specialised}}} on {self.target}"


def _specialise(case: CompileCase, target: GPUTarget):
    """(options, signature, constexprs, attrs) of the launch `case` stands for, from the kernel's own binder."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = case.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**case.args, **case.options}
    bound, specialization, options = binder(**kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, options)


def _specialised(case: CompileCase, signature: dict, attrs: dict) -> str:
    """What tells this binary from others of its config: the scalars Triton specialised (== 1: a constant; a
    multiple of 16), the pointers it could not assume 16-byte aligned."""
    ones, div16, unaligned = [], [], []
    for i, p in enumerate(case.kernel.params):
        if p.is_constexpr:
            continue
        divisible = any(a[0] == "tt.divisibility" for a in attrs.get((i,), []))
        if signature[p.name] == "constexpr":
            ones.append(p.name)
        elif signature[p.name].startswith("*"):
            if not divisible:
                unaligned.append(p.name)
        elif divisible:
            div16.append(p.name)
    parts = [f"=1: {', '.join(ones)}" if ones else "", f"%16: {', '.join(div16)}" if div16 else "",
             f"unaligned: {', '.join(unaligned)}" if unaligned else ""]
    return "; ".join(p for p in parts if p)


@dataclass(frozen=True)
class Job:
    """One binary to build: a case, its target, and its specialisation (`_specialised`)."""

    case: CompileCase
    target: str
    specialised: str

    @property
    def name(self) -> str:
        return f"{self.case.name}{{{self.specialised}}} on {self.target}"


@functools.lru_cache(maxsize=None)
def unique_jobs(target: str) -> tuple[Job, ...]:
    """The registry's cases for `target`, one per binary: cases that specialise alike are merged, their `used_by`
    joined (first-seen order)."""
    merged: dict[tuple, Job] = {}
    for case in all_cases(TARGETS[target].backend == "hip"):
        try:
            options, signature, constexprs, attrs = _specialise(case, TARGETS[target])
        except (KeyError, TypeError, ValueError) as e:  # an option the backend lacks, a missing argument
            raise ValueError(f"{case.name} on {target}: {e!r} (fix its compile_cases)") from e
        k = case.kernel_name, str(signature), str(constexprs), str(attrs), options.hash()
        old = merged.get(k)
        if old is None:
            merged[k] = Job(case, target, _specialised(case, signature, attrs))
        else:
            used = old.case.used_by + tuple(u for u in case.used_by if u not in old.case.used_by)
            merged[k] = replace(old, case=replace(old.case, used_by=used))
    return tuple(merged.values())


def compile_binary(case: CompileCase, target: str):
    """`case` compiled for `target` ("sm_90" or "gfx942"): Triton's compiled kernel (its .asm holds the binary)."""
    tgt = TARGETS[target]
    options, signature, constexprs, attrs = _specialise(case, tgt)
    return triton.compile(triton.compiler.ASTSource(case.kernel, signature, constexprs, attrs), target=tgt,
                          options=options.__dict__)


def compile_case(case: CompileCase, target: str) -> Result:
    """Compile `case` for `target` ("sm_90" or "gfx942") and read the binary's resources."""
    tgt = TARGETS[target]
    options, signature, constexprs, attrs = _specialise(case, tgt)
    res = Result(case.kernel_name, case.config, _specialised(case, signature, attrs), target, case.used_by,
                 options.num_warps, waves_per_eu=getattr(options, "waves_per_eu", 0))
    try:
        k = compile_binary(case, target)
    except Exception as e:  # noqa: BLE001 - a failure to compile is a result to report
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        res.error = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
        return res
    res.shared = k.metadata.shared
    if tgt.backend == "cuda":
        _read_cubin(res, k.asm["cubin"], k.asm["ptx"], options)
    else:
        _read_amdgcn(res, k.asm["amdgcn"])
    res.occupancy = occupancy(res)
    return res


def _read_cubin(res: Result, cubin: bytes, ptx: str, options) -> None:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-res-usage", f.name], check=True,
                             capture_output=True, text=True).stdout
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", out))
    res.regs, res.stack = int(usage["REG"]), int(usage["STACK"]) + int(usage["LOCAL"])
    if res.stack:  # spills go to the stack frame: without one there are none (and no second ptxas run)
        res.spills = _ptxas_spill_stores(ptx, options, res)


def _ptxas_spill_stores(ptx: str, options, res: Result) -> int:
    """Bytes of spill stores a thread, from `ptxas -v` on the PTX with the flags Triton's make_cubin passes; its
    registers and stack frame must equal the cubin's (else those flags drifted: update them here)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    flags = ["-v", "--regAllocOptLevel=2"] + ([] if options.enable_fp_fusion else ["--fmad=false"]) \
        + (options.ptx_options.split(" ") if options.ptx_options else [])
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run([get_ptxas(90).path, *flags, f"--gpu-name={sm_arch_from_capability(90)}", f.name, "-o",
                              os.devnull], check=True, capture_output=True, text=True).stderr
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    if frame is None or regs is None or (int(regs.group(1)), int(frame.group(1))) != (res.regs, res.stack):
        raise ValueError(f"{res.kernel}: ptxas -v does not reproduce the cubin's {res.regs} registers / {res.stack} B "
                         f"stack frame (Triton's ptxas flags changed?):\n{log}")
    return int(frame.group(2))


def _read_amdgcn(res: Result, asm: str) -> None:
    def meta(key: str) -> int:
        m = re.search(rf"^\s*\.{key}:\s*(\d+)", asm, re.M)
        if m is None:
            raise ValueError(f"no .{key} in the AMDGCN metadata of {res.kernel}")
        return int(m.group(1))

    res.regs, res.sgprs = meta("vgpr_count"), meta("sgpr_count")
    res.spills = meta("vgpr_spill_count") + meta("sgpr_spill_count")
    res.scratch = meta("private_segment_fixed_size")
    res.shared += meta("group_segment_fixed_size")  # static LDS, beside Triton's allocation
    agprs = re.search(r"^; NumAgprs:\s*(\d+)", asm, re.M)
    res.agprs = int(agprs.group(1)) if agprs else 0
    occ = re.search(r"^; Occupancy:\s*(\d+)", asm, re.M)
    res.llvm_occupancy = int(occ.group(1)) if occ else None


def occupancy(res: Result) -> int:
    """sm_90: resident warps per SM; gfx942: waves per SIMD; from registers and shared memory / LDS."""
    warps = res.num_warps
    if res.target == "sm_90":
        # 64 warps and 32 blocks per SM; registers are allocated per warp in units of 256, shared memory per block
        # in units of 128 bytes plus the 1 KB the system reserves
        regs_per_warp = max(1, math.ceil(res.regs * 32 / 256)) * 256
        by_regs = (65536 // regs_per_warp) // warps
        by_shared = (228 * 1024) // (math.ceil(res.shared / 128) * 128 + 1024)
        return min(32, 64 // warps, by_regs, by_shared) * warps
    # CDNA3: at most 8 waves per SIMD, 4 SIMDs per CU; 512 VGPRs per lane per SIMD in units of 8, 800 SGPRs per SIMD
    # in units of 16; the 64 KB of LDS are shared by the CU's workgroups, whose waves spread over its 4 SIMDs
    by_vgprs = 512 // max(8, math.ceil(res.regs / 8) * 8)
    by_sgprs = 800 // max(16, math.ceil(res.sgprs / 16) * 16)
    by_lds = 8 if res.shared == 0 else max(1, (65536 // res.shared) * warps // 4)
    return min(8, by_vgprs, by_sgprs, by_lds)


def problems(res: Result) -> list[str]:
    """The limits `res` breaks (empty: it fits), one line each: '<kernel>[<config>] on <target>: <what>'."""
    if not res.compiled:
        return [f"{res.name}: does not compile: {res.error}"]
    lim, out = LIMITS[res.target], []
    amd = res.target == "gfx942"
    threads = res.num_warps * (64 if amd else 32)
    if threads > lim.max_threads:
        out.append(f"{threads} threads a block > {lim.max_threads}")
    if res.shared > lim.shared_per_block:
        out.append(f"{'LDS' if amd else 'shared memory'} {res.shared} B > {lim.shared_per_block} B")
    if res.spills or res.scratch:
        what = f"{res.spills} registers spilled, {res.scratch} B scratch" if amd else \
            f"{res.spills} B of spill stores a thread ({res.stack} B stack frame)"
        out.append(what)
    if res.regs > lim.max_regs:
        out.append(f"{res.regs} {'VGPRs' if amd else 'registers'} > {lim.max_regs}")
    if amd and res.shared <= lim.shared_per_block and math.ceil(res.num_warps / 4) > res.occupancy:
        out.append(f"a workgroup of {res.num_warps} waves needs {math.ceil(res.num_warps / 4)} waves per SIMD, "
                   f"its {res.regs} VGPRs / {res.sgprs} SGPRs / {res.shared} B LDS allow {res.occupancy}")
    if not amd and res.regs * threads > 65536:
        out.append(f"{res.regs} registers x {threads} threads > 65536 a block")
    return [f"{res.name}: {p}" for p in out]


def _compile_index(target: str, index: int) -> Result:
    return compile_case(unique_jobs(target)[index].case, target)


def compile_all(targets=tuple(TARGETS), processes: int | None = None, progress=lambda results: results) -> list[Result]:
    """Every unique job of every target, compiled `processes` at a time (default: one per CPU), in registry order;
    `progress` wraps the iterator of results (e.g. tqdm). Triton's on-disk cache makes a second run cheap."""
    jobs = [(t, i) for t in targets for i in range(len(unique_jobs(t)))]
    processes = processes or os.cpu_count() or 1
    if processes == 1:
        return list(progress(_compile_index(t, i) for t, i in jobs))
    # spawn: a forked child would inherit the parent's torch and Triton state (threads, caches) mid-use
    import multiprocessing

    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(progress(pool.map(_compile_index, *zip(*jobs))))
