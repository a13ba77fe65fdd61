"""Helpers shared by the benchmark and probe scripts, which run as modules from the repository root
(`python -m benchmarks.bench_linear`, `python -m benchmarks.probes.probe_tree_attention`) and import this as
`benchmarks._common`."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import triton


def command() -> str:
    """The command line that runs this script, as a table records it: `python -m benchmarks.<script> args`."""
    main = sys.modules["__main__"].__spec__  # None when run by path (with the repository root on PYTHONPATH)
    script = f"-m {main.name}" if main else os.path.relpath(sys.argv[0])
    return " ".join(["python", script, *sys.argv[1:]])


def provenance() -> str:
    """The first lines of every recorded table: the command that made it, the date and the device."""
    return (f"Command: `{command()}`  \n"
            f"Date: {datetime.date.today()}  \n"
            f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}  \n")


def bench(fn) -> float:
    """Median microseconds, eager (host launch included), cold L2."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fmt(x, spec: str = ".1f") -> str:
    """A table cell: None = the provider ran and failed; a string (e.g. "not run") as it is."""
    return "failed" if x is None else x if isinstance(x, str) else format(x, spec)


def report(header: str, md: str, md_path: str | None, rows: list[dict]) -> None:
    """Print the table (and write it to md_path); exit non-zero if a row's rel err vs the torch reference is not
    below 1e-2."""
    if md_path:
        with open(md_path, "w") as f:
            f.write(header + "\n" + md + "\n")
    print(header)
    print(md)
    bad = [r for r in rows if not r["err"] < 1e-2]
    if bad:
        raise SystemExit(f"eaglet disagrees with the torch reference in {len(bad)} rows")
