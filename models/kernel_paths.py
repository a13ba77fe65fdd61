"""The two numerics paths a model runs, chosen here (`path_for`): models/llama.py and models/eagle.py both read it.

    INVARIANT  run_spec's `invariant=true`, the default. eaglet's kernels: kernels/projection.py for every projection
               (a block's four launches: each norm inside the projection after it, RoPE and the K/V store in qkv's
               epilogue, SiLU·mul in gate_up's, the residual adds in o's and down's) and for the LM head, and the
               invariant tree attention. A row's result does not depend on the other rows of the call
               (models/llama.py's module doc).
    STOCK      `invariant=false`. The rmsnorm kernel (the residual add fused in), torch / cuBLAS nn.Linear, the RoPE /
               K-V store kernel, silu_and_mul and the split-KV tree attention: the baseline of the benchmarks and the
               bulk path of training features and synthesis.

Every layer kind runs the path of its model's `invariant`: a target block and the LM head (`Transformer.set_invariant`);
a draft head's layers, fc and LM head (`DraftHead.set_invariant`, which engine/run.py sets to the target's: not for the
draft's numerics, since only the verify decides which tokens are emitted, but so that one set of kernels serves both).
Folded norm weights (`fold_norm_weights`) change neither path: the invariant kernels take `projection.FOLDED` for the
norm weight (only each row's 1/rms is left to apply), the stock path runs the rmsnorm kernel with the unit weights the
folding leaves (the same function).
"""

from __future__ import annotations

import enum


class KernelPath(enum.Enum):
    INVARIANT = "invariant"
    STOCK = "stock"


def path_for(invariant: bool) -> KernelPath:
    """The path of a layer whose model runs with `invariant` (module doc)."""
    if not isinstance(invariant, bool):
        raise TypeError(f"invariant must be a bool, got {invariant!r}")
    return KernelPath.INVARIANT if invariant else KernelPath.STOCK
