"""Probe: what the installed Triton emits for a kernel's compile cases on sm_90, counted from the SASS, on a CPU.

    python -m benchmarks.probes.sass_counts block_tree "Vd=49152 chain" "MERGE=True MERGE_ROOT=False"
    python -m benchmarks.probes.sass_counts block_tree "Vd=49152 chain" --over "{'KP': 2}"

Each case of kernels/<module>.compile_cases whose label and config contain every given string is compiled for sm_90
(kernels/_aot.py) and disassembled with the nvdisasm Triton ships; the table counts instructions by class: shared
stores and loads (STS / LDS, layout conversions through shared memory), barriers (BAR), global loads and stores.
`--over` replaces entries of the module's `_launch_meta` (the probe of a launch setting). Another Triton version on
PYTHONPATH shows what that version emits: the GPU machines run triton 3.6, this one may have a newer one.
Why: the block tree's chain (K = 1) took ~50 µs a depth on an H100 only at the larger vocabularies; its SASS there
held 530 shared stores (results/block_tree_k1_sass.md).
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import subprocess
import tempfile

import triton
from triton import knobs

from eaglet.kernels import _aot

CLASSES = ("STS", "LDS", "BAR", "LDG", "STG", "SHFL")


def opcodes(cubin: bytes) -> list[str]:
    """The opcode of each instruction of a cubin (`nvdisasm -c`, the one Triton ships), without its predicate and
    modifiers: "@!P0 STS.128 [R1], R4 ;" -> "STS"."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([knobs.nvidia.nvdisasm.path, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    out = []
    for ln in text.splitlines():
        words = ln.split("*/", 1)[1].split() if "*/" in ln else []
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            out.append(words[0].split(".")[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", help="a kernels/ module with compile_cases, e.g. block_tree")
    ap.add_argument("select", nargs="*", help="strings every selected case's label and config contain")
    ap.add_argument("--over", default="{}", help="a dict literal merged into the module's _launch_meta")
    args = ap.parse_args()
    mod = importlib.import_module(f"eaglet.kernels.{args.module}")
    over = ast.literal_eval(args.over)
    if over:
        meta = mod._launch_meta
        mod._launch_meta = lambda *a: {**meta(*a), **over}
    print(f"triton {triton.__version__}, sm_90{f', _launch_meta + {over}' if over else ''}\n")
    print("| case | config | instructions | " + " | ".join(CLASSES) + " |")
    print("|---|---|---|" + "---|" * len(CLASSES))
    seen = set()
    for case in mod.compile_cases(False):
        key = f"{', '.join(case.used_by)} {case.config}"
        if case.config in seen or not all(s in key for s in args.select):
            continue
        seen.add(case.config)
        ops = opcodes(_aot.compile_binary(case, "sm_90").asm["cubin"])
        n = collections.Counter(ops)
        print(f"| {case.used_by[0]} | {case.config} | {len(ops)} | " + " | ".join(str(n[c]) for c in CLASSES) + " |")


if __name__ == "__main__":
    main()
