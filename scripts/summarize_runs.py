"""One table line per run_spec.py run directory, from its metrics.json: what the end-to-end rows of BENCHMARKS.md
quote (decode tokens/s, tau, the AR pass, losslessness, step and phase times, the weight-read floor).

    python scripts/summarize_runs.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(d: Path) -> str | None:
    f = d / "metrics.json"
    if not f.is_file():
        return None
    m = json.loads(f.read_text())
    get = lambda k, spec=".3f": format(m[k], spec) if isinstance(m.get(k), (int, float)) else ""  # noqa: E731
    phases = " / ".join(get(f"{p}_ms", ".2f") for p in ("draft", "plan", "verify", "extend"))
    return (f"| {d.name} | {m.get('target')} | {m.get('draft')} | {m.get('batch_size')} | {m.get('invariant')} | "
            f"{get('decode_tokens_per_s', ',.0f')} | {get('tau', '.2f')} | {get('ar_decode_tokens_per_s', ',.0f')} | "
            f"{get('speedup_vs_ar', '.2f')} | {get('ar_identical_fraction')} | {get('step_median_ms')} | "
            f"{phases if m.get('draft') != 'none' else ''} | {get('weight_read_floor_ms')} |")


def main() -> None:
    print("| run | target | draft | B | invariant | decode tok/s | tau | AR decode tok/s (same run) | speedup vs AR | "
          "identical to AR | step ms (median) | draft / plan / verify / extend ms | weight floor ms |")
    print("|" + "---|" * 13)
    for d in sorted(Path(a) for a in sys.argv[1:]):
        r = row(d) if d.is_dir() else None
        if r:
            print(r)


if __name__ == "__main__":
    main()
