#!/usr/bin/env bash
# Stages of a GPU session, each sized to fit one 10-minute call on an offline GPU machine (the H200 box):
#   bash benchmarks/gpu_session.sh STAGE [OUT]
#   tests      GPU tests: kernels (bf16, graphs), CUDA-graph decode, EAGLE losslessness, stream plans (CSAN, stress)
#   ar         benchmarks/bench_ar.py (needs the SmolLM2 GGUF and MT-bench; see benchmarks/offline_gpu_env.sh)
#   kernels    tree attention, tree/verify and model-kernel benchmarks
#   ablation   the overlap ablation on random Llama-3.1-8B weights, then its report
#   train      regenerate ShareGPT answers with SmolLM2, train its EAGLE-3 head, evaluate it (MT-bench B=1/8,
#              HumanEval, held-out ShareGPT); results packed into OUT/train.tgz.* parts (needs the ShareGPT
#              subset in .asset4, see offline_gpu_env.sh)
# Results go to OUT (default $OUT, else ./gpu_out); tables are printed last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage=${1:?stage: tests | ar | kernels | ablation}
out=${2:-${OUT:-gpu_out}}
mkdir -p "$out"
source benchmarks/offline_gpu_env.sh
case $stage in
  tests)
    # one line per test as it ends, so a call cut short still says what passed; default kernel configs
    # (EAGLET_AUTOTUNE=0): tuning every test shape costs minutes of compilation
    EAGLET_AUTOTUNE=0 python -m pytest -v -rf -p no:cacheprovider tests/kernels tests/spec 2>&1 | tee "$out/tests.log" \
      | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -60 ;;
  ar)
    python benchmarks/bench_ar.py --batch 1 8 --max-new 256 --hf-max-new 32 --out "$out/ar_h200.md" ;;
  kernels)
    python benchmarks/bench_tree_attention.py --md "$out/tree_attention_h200.md" 2>&1 | tail -30
    python benchmarks/bench_model_kernels.py --md "$out/model_kernels_h200.md" 2>&1 | tail -30
    python benchmarks/bench_linear.py --ms 1,2,4,8 --md "$out/linear_h200.md" 2>&1 | tail -30
    python benchmarks/bench_tree_verify.py --out "$out/tree_verify_h200.md" 2>&1 | tail -15 ;;
  ablation)
    python run_spec.py +experiment=ablate_overlap logger=none hydra.sweep.dir=/tmp/ablate_overlap 2>&1 \
      | grep -E "stream plan|tau|Error" | tee "$out/ablation.log"
    python -m eaglet.experiments.report /tmp/ablate_overlap --out "$out/ablate_overlap"
    cat "$out/ablate_overlap/overlap.md" ;;
  train)
    T=/tmp/train; head=$T/run/head; deadline=$((SECONDS + ${BUDGET_S:-560}))
    left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
    # the GGUF once as an HF directory (the same weights): a load then takes ~2 s instead of the 20-25 s the
    # H200 box spent per run on GGUF dequantisation and tokenizer conversion, six runs in this stage
    smol=$KEEP/smollm2_hf
    [[ -f $smol/model.safetensors ]] || python -m eaglet.models.checkpoint convert "$gguf" "$smol" --dtype float32
    python train_draft.py hydra.run.dir=$T/run logger=none target.path="$smol" data.path="$SHAREGPT" data.limit=5000 \
      data.max_turns=1 data.regen.max_new_tokens=512 data.regen.batch_size=128 data.cache_dir=$T/regen \
      train.steps=${TRAIN_STEPS:-2400} train.time_limit_s=${TRAIN_S:-240} eval.every=800 eval.num_prompts=16 \
      train.progress=false train.profile_steps=3 2>&1 | grep -v Warning | tail -60
    spec() {  # name, overrides...
      local name=$1; shift
      timeout "$(left)" python run_spec.py draft=eagle3 draft.path=$head target.path="$smol" logger=none print_answers=1 \
        hydra.run.dir=$T/eval/$name "$@" 2>&1 | grep -E "^\[eaglet\]|^---|^>>>|Error" | tail -8
    }
    spec mt_bench_b1 tree=eagle2 data=mt_bench data.max_turns=1 gen.batch_size=1
    spec mt_bench_b8 tree=eagle2 data=mt_bench data.max_turns=1 gen.batch_size=8
    spec humaneval_b8 tree=eagle2 data=humaneval gen.batch_size=8 gen.compare_ar=false
    spec sharegpt_b8 tree=eagle2 data=sharegpt data.path="$SHAREGPT" gen.batch_size=8 gen.compare_ar=false
    spec mt_bench_b1_wide tree=eagle2_wide data=mt_bench data.max_turns=1 gen.batch_size=1
    # the regenerated answers come back too (a later run skips regeneration with data.cache_dir); in 15 MB
    # parts, as a device call returns files of at most 16 MiB (cat train.tgz.* | tar xz to unpack)
    tar cz -C $T --exclude=wandb --exclude=checkpoints --exclude=trace.json run eval regen | split -b 15M - "$out/train.tgz."
    gzip -c $T/run/trace.json | split -b 15M - "$out/train_trace.json.gz."
    ls -la "$out" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
