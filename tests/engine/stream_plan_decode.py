"""One stream plan's greedy decode on the GPU, against plain decoding, in a process of its own (so that
TORCH_CUDA_SANITIZER, which torch reads at import, applies to it alone). test_stream_plan.py runs it by path, which
puts this folder on sys.path for `engine_testing`:

    python tests/engine/stream_plan_decode.py --plan overlap_event [--drafter ngram|block] [--sleep CYCLES]
                                              [--no-graphs] [--max-new N]

Prints IDENTICAL or MISMATCH, then PHASES and the step's draft, plan, plan-wait and verify ms and the plan's hidden
fraction.
"""

from __future__ import annotations

import argparse

import torch
from engine_testing import PROMPTS, TREES, ar_outputs, oracle_block, oracle_like, oracle_target

from eaglet.engine.drafters.block import BlockDrafter
from eaglet.engine.drafters.eagle import EagleDrafter
from eaglet.engine.drafters.ngram import NgramDrafter
from eaglet.engine.requests import Request
from eaglet.engine.speculative import SpeculativeEngine
from eaglet.engine.stream_plan import ResolvedPlan, StreamPlan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="a stream plan's name, unsafe_no_sync included")
    ap.add_argument("--sleep", type=int, default=0, help="stress mode: GPU cycles slept on main after the draft")
    ap.add_argument("--no-graphs", action="store_true", help="decode eagerly (CSAN tracks eager kernels only)")
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--drafter", choices=("eagle", "ngram", "block"), default="eagle",
                    help="an oracle-like EAGLE-1 head, the n-gram drafter or an oracle-like block drafter")
    args = ap.parse_args()
    graphs = not args.no_graphs
    target = oracle_target().cuda()
    drafter = {"eagle": lambda: EagleDrafter(oracle_like("eagle1", target)), "ngram": lambda: NgramDrafter(n_max=3),
               "block": lambda: BlockDrafter(oracle_block(target, block_size=6))}[args.drafter]()
    want = ar_outputs(target, PROMPTS, args.max_new, use_cuda_graph=graphs)
    plan = StreamPlan(ResolvedPlan(args.plan, args.plan, "test"), torch.device("cuda"), args.sleep)
    eng = SpeculativeEngine(target, drafter, TREES["eagle2"], max_batch=2, max_context=256, page_size=8,
                            use_cuda_graph=graphs, stream_plan=plan)
    eng.warmup()
    reqs = [Request(p, args.max_new, rid=i) for i, p in enumerate(PROMPTS)]
    summary = eng.generate(reqs).summary(TREES["eagle2"].steps)
    print("IDENTICAL" if [r.output_ids for r in reqs] == want else "MISMATCH")
    print("PHASES", *(summary[k] for k in ("draft_ms", "plan_ms", "plan_wait_ms", "verify_ms", "plan_hidden_fraction")))


if __name__ == "__main__":
    main()
