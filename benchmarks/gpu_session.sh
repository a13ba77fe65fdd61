#!/usr/bin/env bash
# Stages of a GPU session, each sized to fit one 10-minute call on an offline GPU machine (the H200 box):
#   bash benchmarks/gpu_session.sh STAGE [OUT]
#   tests      GPU tests: kernels (bf16, graphs), CUDA-graph decode, EAGLE losslessness, stream plans (CSAN, stress)
#   ar         benchmarks/bench_ar.py (needs the SmolLM2 GGUF and MT-bench; see benchmarks/offline_gpu_env.sh)
#   kernels    tree attention, tree/verify and model-kernel benchmarks
#   ablation   the overlap ablation on random Llama-3.1-8B weights, then its report
# Results go to OUT (default $OUT, else ./gpu_out); tables are printed last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage=${1:?stage: tests | ar | kernels | ablation}
out=${2:-${OUT:-gpu_out}}
mkdir -p "$out"
source benchmarks/offline_gpu_env.sh
case $stage in
  tests)
    python -m pytest -q -p no:cacheprovider tests/kernels tests/spec 2>&1 | tee "$out/tests.log" | tail -25 ;;
  ar)
    python benchmarks/bench_ar.py --batch 1 8 --max-new 256 --hf-max-new 32 --out "$out/ar_h200.md" ;;
  kernels)
    python benchmarks/bench_tree_attention.py --md "$out/tree_attention_h200.md" 2>&1 | tail -30
    python benchmarks/bench_model_kernels.py --md "$out/model_kernels_h200.md" 2>&1 | tail -30
    python benchmarks/bench_tree_verify.py --out "$out/tree_verify_h200.md" 2>&1 | tail -15 ;;
  ablation)
    python run_spec.py +experiment=ablate_overlap logger=none hydra.sweep.dir=/tmp/ablate_overlap 2>&1 \
      | grep -E "stream plan|tau|Error" | tee "$out/ablation.log"
    python -m eaglet.experiments.report /tmp/ablate_overlap --out "$out/ablate_overlap"
    cat "$out/ablate_overlap/overlap.md" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
