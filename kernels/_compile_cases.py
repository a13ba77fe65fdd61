"""The registry of compile cases: every launch configuration of every Triton kernel in kernels/, at the model shapes
eaglet runs, so that CI can compile each one ahead of time for GPUs it does not have (kernels/_aot.py,
tests/portability/, scripts/portability_report.py).

The interface, for a kernel module:

    def compile_cases(hip: bool) -> list[CompileCase]

returns one `CompileCase` per configuration its launchers can launch at the shapes in `model_shapes()` and the trees
in `TREES`: every entry of every autotune grid (the HIP grid when `hip`), every fixed config. Build each case from
the same functions the launcher takes its meta-parameters from (block sizes, warps, the autotune config list), so
that a new config is compiled without editing anything here: `CompileCase.of(kernel, used_by, **launch)` takes the
launch's keyword arguments as the launcher passes them, `CompileCase.from_config` expands a `triton.Config`.
A config builder that branches on `_utils.is_hip()` takes a `hip: bool | None = None` argument (None: the running
torch) so that it can be asked for either vendor's configs without a GPU. Then name the module in `MODULES`.

A case gives every kernel parameter a value, as the launcher would pass it: a tensor as `Ptr(dtype)` (its element
type; 16-byte aligned, like a fresh allocation), an int or float scalar as a value it takes at that shape (Triton
specialises an int on == 1 and on divisibility by 16, so the value picks the variant), a constexpr as itself. Launch
options (num_warps, num_stages, waves_per_eu, ...) go in `options`, as the launcher's keyword arguments.

Launched kernels are the @triton.jit functions named `*_kernel` (helpers called from kernels are not); a test checks
that each one in `MODULES` has a case, and that every module with a kernel is in `MODULES`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

MODULES = ("activation", "block_tree", "build_tree", "draft_expand", "kv_ops", "ngram_match", "projection", "rmsnorm",
           "rope", "topk", "tree_attention_invariant", "tree_attention_splitkv", "trie_graft", "verify")

# The SM (CU) count the launch planners fill when a case is built for a GPU this machine lacks: H100 / H200 (sm_90,
# 132 SMs) when False, MI300X (gfx942, 304 CUs) when `hip`.
TARGET_SMS = {False: 132, True: 304}


@dataclass(frozen=True)
class Ptr:
    """A tensor argument: its element type, and whether its address is 16-byte aligned (views at an odd offset are
    not; Triton specialises pointers on it)."""

    dtype: torch.dtype
    aligned: bool = True

    def data_ptr(self) -> int:  # what Triton's specialiser reads, with the dtype
        return 1 << 20 if self.aligned else (1 << 20) + 4


@dataclass(frozen=True)
class CompileCase:
    """One launch configuration of one kernel. `kernel` is the @triton.jit function (an autotuner's `.fn`), `args`
    every parameter by name (module doc), `options` the launch options, `used_by` the shapes it stands for."""

    kernel: Any
    args: dict
    options: dict
    used_by: tuple[str, ...] = ()

    def __post_init__(self):
        names = list(self.kernel.arg_names)
        missing, extra = [n for n in names if n not in self.args], [n for n in self.args if n not in names]
        if missing or extra:
            raise ValueError(f"{self.kernel.__name__}: args missing {missing}, unknown {extra}")

    @classmethod
    def of(cls, kernel, used_by: tuple[str, ...], **launch) -> "CompileCase":
        """The case of a launch `kernel[grid](**launch)`: its parameters by name, the rest launch options."""
        args = {k: v for k, v in launch.items() if k in kernel.arg_names}
        return cls(kernel, args, {k: v for k, v in launch.items() if k not in args}, used_by)

    @classmethod
    def from_config(cls, kernel, args: dict, config, used_by: tuple[str, ...] = ()) -> "CompileCase":
        """The case of one autotune entry: `config` (a triton.Config) supplies its constexprs and launch options,
        `args` the rest of the parameters."""
        return cls.of(kernel, used_by, **args, **{k: v for k, v in config.all_kwargs().items() if v is not None})

    @property
    def module(self) -> str:
        return self.kernel.fn.__module__.rsplit(".", 1)[-1]

    @property
    def kernel_name(self) -> str:
        return f"{self.module}.{self.kernel.__name__}"

    @property
    def config(self) -> str:
        """The constexprs and options that pick this variant, e.g. `BLOCK=1024 HAS_RESIDUAL=True num_warps=4`."""
        consts = [f"{p.name}={self.args[p.name]}" for p in self.kernel.params if p.is_constexpr]
        return " ".join(consts + [f"{k}={v}" for k, v in sorted(self.options.items())])

    @property
    def name(self) -> str:
        return f"{self.kernel_name}[{self.config}]"


class Shape(NamedTuple):
    """The per-model sizes the kernels see. Draft heads share the target's hidden size and heads."""

    name: str
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    draft_vocab: int  # an EAGLE-3 head's reduced vocabulary (EAGLE-1 / multi-layer heads use `vocab`)


# SmolLM2-135M and Llama-3.1-8B as models/llama.py's transformer_configs has them (kernels/ imports no model code:
# tests/portability/test_cases.py checks that they agree); EAGLE-3 draft vocabularies of the head eaglet ships for
# SmolLM2 (heads/smollm2_135m_eagle3/config.json) and of the public Llama-3.1-8B EAGLE-3 heads.
SHAPES = (
    Shape("smollm2_135m", hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn=1536, vocab=49152, draft_vocab=8192),
    Shape("llama3_8b", hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
          draft_vocab=32000),
)


def model_shapes() -> list[Shape]:
    """The model shapes the compile cases are built for (`SHAPES`)."""
    return list(SHAPES)


class Tree(NamedTuple):
    name: str
    steps: int
    topk: int
    num_draft_tokens: int
    root_children: int | None = None  # tree.root_children (None: topk)


# conf/tree's trees (tests/portability checks that each one is here) and the EAGLE-2 paper's (the largest); of
# "block"'s 16 root children only grow_tree and build_tree see anything (the candidate layout)
TREES = (Tree("chain", 5, 1, 6), Tree("eagle2", 5, 4, 8), Tree("eagle2_wide", 6, 8, 32), Tree("simulate", 7, 1, 8),
         Tree("simulate_wide", 6, 4, 32), Tree("eagle2_paper", 6, 10, 60), Tree("block", 4, 4, 16, 16))


def all_cases(hip: bool) -> list[CompileCase]:
    """Every module's cases for one vendor (HIP: AMD; else NVIDIA). Several may compile to one binary: kernels/_aot.py
    merges those per target."""
    cases = []
    for m in MODULES:
        cases += importlib.import_module(f"eaglet.kernels.{m}").compile_cases(hip)
    return cases


def launched_kernels(module: str) -> list[str]:
    """The launched kernels (@triton.jit functions named *_kernel, autotuned or not) defined in kernels/<module>.py."""
    import triton

    mod = importlib.import_module(f"eaglet.kernels.{module}")
    names = set()
    for obj in vars(mod).values():
        fn = getattr(obj, "fn", None) if isinstance(obj, triton.runtime.Autotuner) else obj
        if isinstance(fn, triton.runtime.JITFunction) and fn.__name__.endswith("_kernel") \
                and fn.fn.__module__ == mod.__name__:
            names.add(fn.__name__)
    return sorted(names)
