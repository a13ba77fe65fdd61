"""Which kernel path a layer runs: the one table that models/llama.py and models/eagle.py read (`path_for`).

A path is a set of kernels for a layer's norms and projections (the attention's kernel follows `invariant`):

    INVARIANT     kernels/projection.py, 4 launches a block, and invariant tree attention: a row's result does not
                  depend on the other rows of the call (models/llama.py's module doc); for the LM head
                  `projection.linear`; a draft head beside an invariant target runs it too (`DraftHead.set_invariant`:
                  its layers, fc and LM head)
    FUSED_LINEAR  kernels/linear.py: each norm inside the projection after it, SiLU·mul inside down
    FOLDED        the norm weights folded into the projections (`fold_norm_weights`): kernels/folded_linear.py's
                  4 fused launches up to its MAX_M rows, cuBLAS and the RoPE / SiLU kernels above (that split is
                  the kernels' own)
    PLAIN         the rmsnorm kernel, cuBLAS, the RoPE and SiLU·mul kernels; for the LM head cuBLAS

The inputs are what the layer is (a target block, the LM head, a draft layer), whether the target runs invariant
numerics (`Transformer.set_invariant`), whether the layer's norm weights are folded, and the rows of the call
(B * T). The row limits are module constants; `override_limits` changes them for a `with` block (benchmarks time
the other paths, tests compare them).
"""

from __future__ import annotations

import enum
from contextlib import contextmanager

from eaglet.kernels.folded_linear import MAX_M as FOLDED_KERNEL_MAX_M


class Path(enum.Enum):
    INVARIANT = "invariant"
    FUSED_LINEAR = "fused_linear"
    FOLDED = "folded"
    PLAIN = "plain"


class Layer(enum.Enum):
    BLOCK = "block"  # a target TransformerBlock
    LM_HEAD = "lm_head"  # the target's LM head (`Transformer.logits`)
    DRAFT = "draft"  # a draft head's DraftLayer


# Rows up to which a target block runs the fused projections (kernels/linear.py) instead of the rmsnorm kernel +
# cuBLAS. SmolLM2 decode on an H200 (results/ar_h200.md, CUDA graphs): 1 token per step 1.187 -> 0.936 ms fused
# (842 -> 1,068 tokens/s); 8 tokens 1.204 -> 1.621 ms, so cuBLAS above 1. A folded block takes it too at one row
# (its norm weights are ones: the same function).
FUSED_LINEAR_MAX_ROWS = 1

# Rows up to which a folded draft layer runs the folded path; above, its plain path (unit norm weights: the same
# function), because folded_linear's kernels stop at MAX_M rows and an EAGLE-3 midlayer's folded fallback is two
# GEMMs and elementwise ops. SmolLM2's EAGLE-3 head on an H200, B=1 (results/fold_norms_smollm2_h200): the draft
# 0.26 against 0.31 ms a step folded (its 4 rows a step in the fused launches); the 8B head's midlayer 129.0 against
# 146.4 µs a draft step (kernels/folded_linear.py).
DRAFT_FOLDED_MAX_ROWS = FOLDED_KERNEL_MAX_M

_limits = {"fused_linear_max_rows": FUSED_LINEAR_MAX_ROWS, "draft_folded_max_rows": DRAFT_FOLDED_MAX_ROWS}


def path_for(layer: Layer, *, invariant: bool, folded: bool, rows: int) -> Path:
    """The path `layer` runs for a call of `rows` rows. A draft layer of a head beside an invariant target runs the
    invariant kernels too (`DraftHead.set_invariant`): not for its numerics, since only the target's decide which
    tokens are emitted (the draft proposes, the verify decides), but so that one set of kernels serves both."""
    if layer is Layer.LM_HEAD:
        return Path.INVARIANT if invariant else Path.PLAIN
    if layer is Layer.DRAFT:
        if invariant:
            return Path.INVARIANT
        return Path.FOLDED if folded and rows <= _limits["draft_folded_max_rows"] else Path.PLAIN
    if layer is not Layer.BLOCK:
        raise ValueError(f"layer must be a Layer ({', '.join(m.name for m in Layer)}), got {layer!r}")
    if invariant:
        return Path.INVARIANT
    if rows <= _limits["fused_linear_max_rows"]:
        return Path.FUSED_LINEAR
    return Path.FOLDED if folded else Path.PLAIN


@contextmanager
def override_limits(*, fused_linear_max_rows: int | None = None, draft_folded_max_rows: int | None = None):
    """Within the block, `path_for` uses these row limits (None: the current one; 0: that path never runs, or only
    for an empty call); the previous limits come back on exit, also on an exception. Decided when a layer runs:
    a CUDA graph keeps the paths of its capture."""
    new = {k: v for k, v in (("fused_linear_max_rows", fused_linear_max_rows),
                             ("draft_folded_max_rows", draft_folded_max_rows)) if v is not None}
    for k, v in new.items():
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{k} must be an int >= 0, got {v!r}")
    old = dict(_limits)
    _limits.update(new)
    try:
        yield
    finally:
        _limits.clear()
        _limits.update(old)
