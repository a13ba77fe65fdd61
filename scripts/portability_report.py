"""Compile every registered Triton kernel case (kernels/_compile_cases.py) for H100 (sm_90) and MI300X (gfx942) on
this machine, no GPU needed, and write the resource table: PORTABILITY.md.

    python scripts/portability_report.py [--out PORTABILITY.md] [--procs N]

Per kernel x config x target: compiled or not, registers (VGPRs / AGPRs / SGPRs on AMD), spills / scratch, shared
memory / LDS, occupancy (warps per SM on sm_90, waves per SIMD on gfx942), and the limits a binary breaks
(kernels/_aot.py). Exits 1 when any does; the table is written either way. About 12 CPU-minutes (6 minutes on two
cores) for the 633 binaries; with Triton's cache warm, under one.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import triton
from tqdm import tqdm

from eaglet.kernels import _aot
from eaglet.kernels._compile_cases import TREES, model_shapes

REPO = Path(__file__).resolve().parents[1]


def _used_by(labels: tuple[str, ...], most: int = 3) -> str:
    shown = ", ".join(labels[:most])
    return shown + (f" (+{len(labels) - most})" if len(labels) > most else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "–"


def _table(results: list[_aot.Result], target: str) -> list[str]:
    amd = target == "gfx942"
    head = (["kernel", "config", "specialised", "used by", "compiled"]
            + (["VGPRs", "AGPRs", "SGPRs", "spills", "scratch B", "LDS B", "waves/SIMD"] if amd else
               ["registers", "stack B", "spill stores B", "shared B", "warps/SM"]) + ["limits"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.target != target:
            continue
        if not r.compiled:
            nums = ["–"] * (7 if amd else 5)
        elif amd:
            nums = [r.regs, r.agprs, r.sgprs, r.spills, r.scratch, r.shared, r.occupancy]
        else:
            nums = [r.regs, r.stack, r.spills, r.shared, r.occupancy]
        broken = _aot.problems(r)
        limits = "; ".join(p.split(": ", 1)[1] for p in broken) if broken else "ok"
        row = [f"`{r.kernel}`", _cell(r.config), _cell(r.specialised), _cell(_used_by(r.used_by)),
               "yes" if r.compiled else f"no: {r.error}"] + [str(n) for n in nums] + [_cell(limits)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render(results: list[_aot.Result], command: str) -> str:
    broken = [p for r in results for p in _aot.problems(r)]
    counts = {t: sum(r.target == t for r in results) for t in _aot.TARGETS}
    shapes = ", ".join(f"{s.name} (H={s.hidden}, {s.n_heads}/{s.n_kv_heads} heads of {s.head_dim}, FFN {s.ffn}, "
                       f"vocab {s.vocab}, draft vocab {s.draft_vocab})" for s in model_shapes())
    trees = ", ".join(f"{t.name} {t.steps}/{t.topk}/{t.num_draft_tokens}" for t in TREES)
    out = [
        "# Portability: the Triton kernels compiled for H100 (sm_90) and MI300X (gfx942)",
        "",
        "Every launch configuration of every registered kernel (`kernels/_compile_cases.py`), compiled ahead of time "
        "on a CPU for both targets and checked against their limits (`kernels/_aot.py`); "
        "`tests/portability/test_compile.py` runs the same check in CI. Nothing here ran on either GPU: these are "
        "the compilers' numbers (`cuobjdump -res-usage` and `ptxas -v` for sm_90, LLVM's AMDGPU code-object metadata "
        "for gfx942).",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.date.today()}  ",
        f"Triton {triton.__version__}; {counts['sm_90']} sm_90 and {counts['gfx942']} gfx942 binaries  ",
        f"Shapes: {shapes}  ",
        f"Trees (steps/top-k/tokens): {trees}",
        "",
        "Limits: sm_90 227 KB shared memory a block (228 KB an SM, 1 KB reserved a block), 255 registers a thread and "
        "64K a block, no spill stores (a stack frame without them holds local arrays, e.g. libdevice's sin/cos range "
        "reduction table); gfx942 64 KB LDS a workgroup, 512 VGPRs (arch + AGPRs) a lane, no spills or scratch, "
        "and a workgroup's waves must fit its SIMDs (4 a CU). Occupancy: resident warps per SM (of 64) on sm_90, "
        "waves per SIMD (of 8) on gfx942. *specialised*: the scalars Triton specialised (== 1, multiple of 16), which "
        "tell apart binaries of one config.",
        "",
        "## Limits broken",
        "",
    ]
    out += [f"- {p}" for p in broken] or ["None."]
    for target, title in (("sm_90", "sm_90 (H100)"), ("gfx942", "gfx942 (MI300X)")):
        out += ["", f"## {title}", ""] + _table(results, target)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "PORTABILITY.md", help="where to write the table")
    ap.add_argument("--procs", type=int, default=None, help="compiler processes (default: one per CPU)")
    args = ap.parse_args(argv)
    jobs = [job for t in _aot.TARGETS for job in _aot.unique_jobs(t)]
    print(f"compiling {len(jobs)} binaries for {', '.join(_aot.TARGETS)}")
    results = _aot.compile_all(processes=args.procs, progress=lambda it: tqdm(it, total=len(jobs), unit="binary"))
    command = "python scripts/portability_report.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    args.out.write_text(render(results, command))
    broken = [p for r in results for p in _aot.problems(r)]
    print("\n".join(broken) if broken else "every binary within its target's limits")
    print(f"wrote {args.out}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
