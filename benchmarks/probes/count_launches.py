"""Device launches of each drafter's propose and update, counted on the CPU: at decode sizes a launch inside a CUDA
graph costs 2-4 µs however small (BENCHMARKS.md), so a draft graph's launch count bounds its time from below.

    TRITON_INTERPRET=1 python benchmarks/probes/count_launches.py [run_spec.py overrides]
    # e.g. the default drafter's graphs on random SmolLM2 weights, 4 new tokens:
    TRITON_INTERPRET=1 python benchmarks/probes/count_launches.py target=random_llama3_8b \
        target.random=smollm2_135m target.name=random_smollm2 data=synthetic data.limit=1 data.prompt_len=64 \
        tree=simulate tree.topk=4 tree.num_draft_tokens=16 draft=block draft.random_init=true \
        draft.draft_vocab_size=8192 gen.max_new_tokens=4 gen.compare_ar=false logger=none print_answers=0

A run_spec.py run whose drafter methods are wrapped: inside them every Triton launch and every aten op that is not a
view or an allocation is counted (what a GPU would run as a kernel), per method and call, with the source line of
the latest call's launches. The speculative engine's step is wrapped too: its own launches (`SpeculativeEngine._step`)
are those outside its phase functions (`_*_fn`), i.e. what a GPU runs eagerly between the CUDA graphs every step;
the phase functions' own are the graphs' engine-side launches (the verify's include the target forward). Under the
interpreter the Triton kernels run (their launches are counted as one each; the interpreter's own tensor copies are
not counted); without it the torch references run, whose ops are counted instead.
"""

from __future__ import annotations

import collections
import runpy
import sys
import traceback

import triton
from torch.utils._python_dispatch import TorchDispatchMode

import eaglet.engine.cuda_graph as cuda_graph
import eaglet.engine.drafters.block as block
import eaglet.engine.drafters.eagle as eagle
import eaglet.engine.drafters.ngram as ngram
import eaglet.engine.speculative as speculative

# not kernels: allocations, metadata, and what Triton's interpreter does to move its arguments
NOT_LAUNCHES = {"detach", "lift_fresh", "lift_fresh_copy", "empty", "empty_strided", "alias", "set_", "new_empty",
                "_local_scalar_dense", "is_same_size", "copy_"}
counts = collections.Counter()  # (method, launch) -> total
calls = collections.Counter()  # method -> calls
last = collections.defaultdict(list)  # method -> launches of its latest call, in order, with the source line
stack: list[str] = []
in_triton = [False]  # inside an interpreted Triton launch: its argument copies are not launches
STEP = "SpeculativeEngine._step"


def where() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if f.filename != __file__ and any(
        f"/{d}/" in f.filename for d in ("engine", "models", "kernels"))]
    f = frames[-1] if frames else None
    return "" if f is None else f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"


def note(name: str) -> None:
    tag = stack[-1]
    counts[tag, name] += 1
    last[tag].append(f"{name:36s} {where()}")


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if stack and not func.is_view and (name not in NOT_LAUNCHES or (
                name == "copy_" and stack[-1] == STEP and not in_triton[0])):  # the step's copies are real
            note("aten." + name)
        return out


def wrap(cls, method: str) -> None:
    fn, tag = getattr(cls, method), f"{cls.__name__}.{method}"

    def counted(self, *args, **kwargs):
        outer = not stack
        last[tag] = []
        stack.append(tag)
        try:
            if outer:  # one mode for the outermost call: nested modes would count an op once per level
                with Count():
                    return fn(self, *args, **kwargs)
            return fn(self, *args, **kwargs)
        finally:
            stack.pop()
            calls[tag] += 1

    setattr(cls, method, counted)


def main() -> None:
    interp = getattr(triton.runtime, "interpreter", None)
    if interp is not None:
        run = interp.InterpretedFunction.run

        def launch(self, *args, **kwargs):
            if stack:
                note("triton." + self.fn.__name__)
            in_triton[0] = True
            try:
                return run(self, *args, **kwargs)
            finally:
                in_triton[0] = False

        interp.InterpretedFunction.run = launch
    for cls in (ngram.NgramBranches, ngram.NgramDrafter, block.BlockDrafter, eagle.EagleDrafter):
        for method in ("propose", "update"):
            wrap(cls, method)
    for method in ("_step", "_draft_fn", "_verify_fn", "_extend_fn"):
        wrap(speculative.SpeculativeEngine, method)
    # what only runs without CUDA graphs (a CPU run): the static buffers' first allocation and the copy of a phase's
    # outputs into them; counted apart, so the step's own are what a GPU runs between its graphs
    for method in ("_static", "_to_static"):
        wrap(cuda_graph.GraphRunner, method)
    sys.argv = ["run_spec.py"] + sys.argv[1:]
    try:
        runpy.run_path("run_spec.py", run_name="__main__")
    except SystemExit:
        pass
    for tag in sorted(calls):
        own = {k: v / calls[tag] for (t, k), v in counts.items() if t == tag}
        print(f"\n== {tag}: {calls[tag]} calls, {sum(own.values()):.1f} launches a call of its own (nested methods "
              f"apart); the latest call's, in order:")
        print("\n".join(f"   {line}" for line in last[tag]))


if __name__ == "__main__":
    main()
