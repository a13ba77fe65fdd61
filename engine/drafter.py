"""The drafter interface: what the speculative engine (engine/speculative.py) knows of a drafting method.

A drafter proposes a tree of candidate tokens per request; the engine verifies it with one target forward, accepts
the longest matching path, commits its KV and hands the result back. The engine owns the plan, verify, accept and
commit, the stream plans, CUDA graphs, batching, sampling and metrics, and meets a drafter only here:

- what it needs from the target: `capture_layers()` (layers whose residual stream the prefill and the verify
  return) and `target_feature(hidden, captured)` (its per-token input from them, `feature_size` wide; 0: none);
- its own state: `setup` (buffers sized for the run: a KV pool, a token history), `alloc_request` /
  `free_request` / `reserve` (per request row, the same row index as the target's KV), `state_spec` (per-request
  tensors the engine carries from step to step, batched by row), `prefill` (their first values);
- `propose(seq_lens, roots, rows, **state)` -> the tree the verify takes (`DraftTree`), device tensors only,
  captured in a CUDA graph by the engine; `num_nodes(tree)`: the nodes of that tree, by which the engine sizes the
  verify (default tree.num_draft_tokens; a drafter that adds nodes to the tree spec's, as n-gram branches do, says
  how many);
- `update(tokens, feats, accept_index, accept_len, bonus, seq_lens, rows, **state)` -> the next state, after
  accept (EAGLE's draft-extend, an n-gram drafter's history), also captured;
- for drafters that wrap another (n-gram branches): `propose_widened(..., spare, **state)` -> the tree and, from the
  same candidates, the tree of `spare` more nodes (None where the drafter has none), so that slots the wrapper would
  leave as padding hold the drafter's next candidates instead.

A request's sequence: `seq_lens` tokens cached, then its root (the last emitted token, not yet cached). A tree of
N nodes has the root at node 0, parents before children, node j at position seq_len + depth(j).

Registry: `conf/draft/<name>.yaml` names a drafter module (`drafter: <module>`), `eaglet.engine.drafters.<module>`,
which registers its class with `@register("<module>")`; `drafter_class(module)` imports it on first use. A new
drafter is that module and its config file; nothing here or in the engine names it.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

from eaglet.engine.drafters import drafter_modules
from eaglet.kernels.build_tree import build_tree, build_tree_pair, num_candidates


class DraftTree(NamedTuple):
    """A proposal, as the verify takes it (SGLang's tree tensors, the mask as ancestor-or-self)."""

    tokens: torch.Tensor  # [B, N] int64, node 0 = the root token
    positions: torch.Tensor  # [B, N] int64, seq_lens + depth
    next_token: torch.Tensor  # [B, N] int64, first child or -1
    next_sibling: torch.Tensor  # [B, N] int64, next sibling or -1
    mask: torch.Tensor  # [B, N, N] bool, mask[b, i, j]: node j is node i or one of its ancestors


class PrefillBatch(NamedTuple):
    """The target's prefill of newly admitted requests, padded to the longest prompt T."""

    tokens: torch.Tensor  # [n, T] int64 prompt tokens (0 past a prompt's end)
    positions: torch.Tensor  # [n, T] int64
    valid: torch.Tensor  # [n, T] bool, inside the prompt
    lengths: torch.Tensor  # [n] int64 prompt lengths
    rows: torch.Tensor  # [n] int64 KV rows
    hidden: torch.Tensor  # [n, T, H] the target's final-normed hidden states
    captured: list  # [n, T, H] each: the residual stream after each of `capture_layers()`
    roots: torch.Tensor  # [n] int64 the first generated token (the target's, sampled)


def check_root_children(root_children: int | None, cls) -> None:
    """tree.root_children only for a drafter class that proposes more children of the root than tree.topk."""
    if root_children is not None and not cls.ROOT_CHILDREN:
        raise ValueError(f"tree.root_children={root_children}: the {cls.name} drafter gives the root tree.topk "
                         f"children; set tree.root_children=null")


class Drafter:
    """Base class of drafting methods (module doc). Subclasses set `name` and implement the methods that raise."""

    name: str = ""
    ROOT_CHILDREN = False  # proposes tree.root_children children of the root (TreeSpec.root_children)
    feature_size: int = 0  # width of `target_feature`'s output; 0: the drafter takes no target features

    @classmethod
    def from_config(cls, draft, target_cfg, target, *, invariant: bool, fold_norms: bool) -> "Drafter":
        """The drafter `draft` (its conf/draft group) describes, beside `target` (a Transformer)."""
        raise NotImplementedError

    @classmethod
    def check_config(cls, c, cfg, target) -> None:
        """Report the run config's bad draft.* values through `c` (runner/checks.py's Checks) before anything
        loads; `target` is the target built on the meta device (shapes only)."""

    @classmethod
    def kv_layers(cls, draft) -> int:
        """Layers of the drafter's own KV pool, at the target's KV shape (the memory estimate); 0: none."""
        return 0

    def capture_layers(self, n_layers: int) -> tuple[int, ...]:
        """Target layers (of n_layers) whose residual stream the prefill and the verify must return."""
        return ()

    def target_feature(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor | None:
        """hidden [B, T, H] and the captured layers [B, T, H] each -> features [B, T, feature_size] (None: none)."""
        return None

    def check_tree(self, tree) -> None:
        """Raise ValueError (naming the `tree.*` key) when this drafter cannot fill the TreeSpec `tree`."""
        check_root_children(tree.root_children, type(self))

    def num_nodes(self, tree) -> int:
        """N, the nodes of each tree `propose` returns for the TreeSpec `tree` (the verify's width)."""
        return tree.num_draft_tokens

    def depth(self, tree) -> int:
        """The deepest node of the trees `propose` returns for `tree`: an accepted path emits up to depth + 1 tokens
        (the verify's accept_index has depth + 1 columns)."""
        return tree.steps

    def setup(self, *, target, tree, depth: int, max_batch: int, max_context: int, page_size: int,
              num_pages: int | None, device: torch.device) -> None:
        """Allocate the run's buffers: `max_context` positions a request (the engine's, lookahead included);
        `depth` is the engine's (`depth(tree)` of the outermost drafter: the accept_index `update` gets has depth + 1
        columns)."""
        raise NotImplementedError

    def alloc_request(self, row: int) -> None:
        """Take request row `row` (the target's KV row) for a new request."""

    def free_request(self, row: int) -> None:
        """Give row `row` back."""

    def reserve(self, bounds: list[tuple[int, int]]) -> None:
        """(row, positions) pairs: room for that many positions of each row, before the next step."""

    def state_spec(self, device: torch.device) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-request state carried between steps: name -> (shape past the batch dimension, dtype)."""
        raise NotImplementedError

    def prefill(self, batch: PrefillBatch) -> dict[str, torch.Tensor]:
        """The new requests' state [n, ...] for each name of `state_spec`."""
        raise NotImplementedError

    def propose(self, seq_lens: torch.Tensor, roots: torch.Tensor, rows: torch.Tensor,
                **state: torch.Tensor) -> DraftTree:
        """seq_lens [B] int32, roots [B] int64, rows [B] int64 and the state -> the tree (device only, no sync)."""
        raise NotImplementedError

    def propose_widened(self, seq_lens: torch.Tensor, roots: torch.Tensor, rows: torch.Tensor, spare: int,
                        **state: torch.Tensor) -> tuple[DraftTree, DraftTree | None]:
        """`propose`'s tree and the tree of num_nodes + spare nodes from the same candidates (None: this drafter
        has no wider tree)."""
        return self.propose(seq_lens, roots, rows, **state), None

    def update(self, tokens: torch.Tensor, feats: torch.Tensor, accept_index: torch.Tensor, accept_len: torch.Tensor,
               bonus: torch.Tensor, seq_lens: torch.Tensor, rows: torch.Tensor,
               **state: torch.Tensor) -> dict[str, torch.Tensor]:
        """After accept: tokens [B, N] (the tree), feats [B, N, feature_size] (the verify's), accept_index [B, depth+1]
        (-1 padded), accept_len [B], bonus [B] (the next root), seq_lens [B] (before this step) -> the next state."""
        raise NotImplementedError


def _engine_tree(tree) -> DraftTree:
    """kernels/build_tree.py's tree as the engine's (its parents are not passed on)."""
    return DraftTree(tree.draft_tokens, tree.positions, tree.retrieve_next_token, tree.retrieve_next_sibling,
                     tree.tree_mask)


class ModelDrafter(Drafter):
    """A drafter with a model (`head`: an EAGLE head, a block drafter) that reads the target's features and keeps
    its own paged KV pool `kv` (made in `setup`) on the target's request rows."""

    def __init__(self, head):
        self.head = head
        self.feature_size = head.feature_size

    @staticmethod
    def head_config(c, draft, path) -> dict | None:
        """config.json of the head directory `path` the run will load for `draft` (its conf/draft group), when it
        holds a head of kind draft.name; else the problem is reported through `c` (runner/checks.py) and None."""
        import json

        from eaglet.models.head_checkpoint import head_class

        key = "draft.path" if draft.get("path") else f"target.heads.{draft.name}"
        try:
            raw = json.loads((path / "config.json").read_text())
            kind = head_class(raw, path).KIND
        except (OSError, ValueError) as e:  # a bad config.json, an unknown architecture (CheckpointError)
            c.bad(key, str(path), str(e).splitlines()[0])
            return None
        if kind != draft.name:
            c.bad("draft", draft.name, f"{path} holds a {kind} head; use draft={kind}")
            return None
        return raw

    def capture_layers(self, n_layers: int) -> tuple[int, ...]:
        return tuple(self.head.capture_layers(n_layers))

    def target_feature(self, hidden, captured):
        return self.head.target_feature(hidden, captured)  # [B, T, F]

    def candidates(self, seq_lens, roots, rows, **state) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree's candidates in kernels/build_tree.py's layout: scores, tokens (target ids), parents [B, C]."""
        raise NotImplementedError

    def propose(self, seq_lens, roots, rows, **state) -> DraftTree:
        S, K, N = self.tree.steps, self.tree.topk, self.tree.num_draft_tokens
        cand = self.candidates(seq_lens, roots, rows, **state)
        return _engine_tree(build_tree(*cand, roots, seq_lens, N, K, S, root_children=self.tree.root_children))

    def propose_widened(self, seq_lens, roots, rows, spare: int, **state) -> tuple[DraftTree, DraftTree | None]:
        S, K, N = self.tree.steps, self.tree.topk, self.tree.num_draft_tokens
        cand = self.candidates(seq_lens, roots, rows, **state)
        k1 = self.tree.root_children
        if N + spare > num_candidates(K, S, k1) + 1:  # no more candidates than that
            return _engine_tree(build_tree(*cand, roots, seq_lens, N, K, S, root_children=k1)), None
        tree, wide = build_tree_pair(*cand, roots, seq_lens, N, N + spare, K, S,
                                     root_children=k1)  # [B, N], [B, N + spare] ...
        return _engine_tree(tree), _engine_tree(wide)

    def alloc_request(self, row: int) -> None:
        if self.kv.alloc_request() != row:
            raise RuntimeError("target and draft KV rows diverged")

    def free_request(self, row: int) -> None:
        self.kv.free_request(row)


_REGISTRY: dict[str, type[Drafter]] = {}


def register(module: str):
    """Class decorator: the drafter that `drafter: <module>` in a conf/draft file selects."""

    def deco(cls: type[Drafter]) -> type[Drafter]:
        _REGISTRY[module] = cls
        return cls

    return deco


def drafter_class(module: str) -> type[Drafter]:
    """The class `eaglet.engine.drafters.<module>` registers (imported on first use)."""
    if module not in _REGISTRY:
        if module not in drafter_modules():
            raise ValueError(f"no drafter module {module!r}; there are {', '.join(drafter_modules())}")
        importlib.import_module(f"eaglet.engine.drafters.{module}")
    if module not in _REGISTRY:
        raise ValueError(f"eaglet.engine.drafters.{module} registers no drafter (@register({module!r}))")
    return _REGISTRY[module]
