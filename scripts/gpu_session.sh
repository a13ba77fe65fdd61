#!/usr/bin/env bash
# Stages of a GPU session, each sized to fit one 10-minute call on an offline GPU machine (the H200 box):
#   bash scripts/gpu_session.sh STAGE [OUT]
#   tests      GPU tests: kernels (bf16, graphs), CUDA-graph decode, every drafter's losslessness, stream plans (CSAN,
#              stress); TEST_PATHS (default "tests/kernels tests/engine"): a part, to split them over two calls
#   invariant  the invariant kernels' GPU tests, then the benchmarks of PARTS (default "proj step attn": projections,
#              whole forwards, tree attention invariant against split-KV; SWEEP=1 adds the tuning sweeps "sweep
#              attn_sweep"); PROJ_ARGS / STEP_ARGS / ATTN_ARGS / SWEEP_ARGS: more, e.g. STEP_ARGS="--trace /tmp/trace"
#              for the per-kernel time inside the step graphs
#   e2e        run_spec.py with the defaults (SmolLM2 B=1/8 with AR passes, the fastest plain decoding) and random
#              Llama-3.1-8B (plain; EAGLE-3 tree=simulate); a table of their metrics. E2E_SMOL=0 / E2E_L8B=0 skip
#              either half (the 8B half needs no model file: it can run while the GGUF is still being carried)
#   ar         benchmarks/bench_ar.py (needs the SmolLM2 GGUF and MT-bench; see scripts/offline_gpu_env.sh)
#   kernels    the kernel benchmarks: tree attention, model kernels, tree/verify, top-k, build_tree, n-gram match, trie graft,
#              block tree, pool slots
#   ablation   the overlap ablations (ABLATION_EXP, default both: ablate_overlap on random Llama-3.1-8B weights,
#              ablate_overlap_smollm2 on the embedded default), one tree shape per GPU (ABLATION_GPUS=1: all on one),
#              then their report
#   train      regenerate ShareGPT answers with SmolLM2, measure training tokens/s on one GPU and all (DDP; PROBES=0
#              skips that), train its EAGLE-3 head; results packed into OUT/train.tgz.* parts (needs a ShareGPT
#              subset, see offline_gpu_env.sh); SELFGEN=<synthesize.py out_dir>: on its finished chunks instead
#   regen      only the regeneration of `train`'s data, on every GPU, for BUDGET_S seconds (it resumes by chunk), packed
#              into OUT/regen.txz.* parts: carry them to a later session's `train` as REGEN_CACHE (a call cannot
#              regenerate all ShareGPT user turns, ~3.4x the first exchanges, and train in its 10 minutes)
#   synth      self-generated training data (synthesize.py: SmolLM2's Magpie prompts + ShareGPT's train split, deduplicated,
#              clear of the evaluation sets, answered greedily) on every GPU for BUDGET_S seconds (it resumes by chunk:
#              SYNTH_CACHE continues an earlier session's), packed into OUT/synth.txz.* parts; train on it with
#              data.source=selfgen data.selfgen.dir=<the unpacked folder>
#   experiments after train: EAGLE-1 and multi-layer heads, then compare_heads, datasets and sweep_tree
#   trees      sweep_tree with the shipped head (TREE_ARGS: more overrides), then its fastest tree by decode tokens/s
#              on the 80 MT-bench first turns at B=1 and 8, each with its AR pass (the issue-level run of a tree);
#              TREES="5/4/8 6/8/16" (steps/topk/tokens): those trees so, without the sweep (TREE_BATCHES, default
#              "1 8"); TREE_ARGS reach these runs too, e.g. "draft=block draft.path=DIR" for a trained block drafter
#   scaling    training tokens/s on one GPU and on all (DDP), the throughput probes of `train` alone
#   drafters   the drafter table: each drafter of DRAFTERS (default "eagle3 ngram eagle3+ng2") on MT-bench first turns,
#              HumanEval and held-out ShareGPT (DATASETS) at B=1 and 8 (BATCHES), each run with its AR pass, defaults
#              otherwise (invariant numerics, tree 5/4/8; DRAFTER_ARGS: more overrides), one line per run
#              (summarize_runs.py); an entry <draft>+ng<K> is draft=<draft> draft.ngram_branches=K (K n-gram branches
#              added to the head's tree; `block` has its config's, one of 15 tokens, unless `block+ng0`), +ng<K>x<L>
#              also draft.ngram_depth=L (branches of L tokens; `block+ng2x7`: the former default), <draft>@S/K/N its
#              tree (block@S/K/N/K1: also tree.root_children=K1; without K1 the block tree keeps its 16); `block`: the
#              shipped block drafter or BLOCK_RUN's (a `block` stage's), at BLOCK_TREE (default: its config's) unless
#              named;
#              PROFILE=1: each drafter's per-kernel graph times; ALT=<dir>: every run also with ALT's files overlaid on a
#              copy of this tree (runs *_alt, each right after its own: an interleaved A/B on one machine)
#   block      the block drafter (train/head=block; BLOCK_ARGS: more overrides) trained on every GPU for what is left of
#              BUDGET_S minus EVAL_S, on the finished chunks of SELFGEN (a synthesize.py out_dir) or else regenerated
#              ShareGPT, one held-out evaluation at its end, its cosine schedule BLOCK_STEPS long (unset: sized to the
#              time left) and resumable: BLOCK_RUN (default $KEEP/block_run) continues in the next call while the
#              machine is warm (its checkpoints, ~200 MB with AdamW's state, do not travel back); then
#              the exported drafter on the 80 MT-bench first turns at B=1 (each run with its AR pass) for each tree of
#              BLOCK_TREES (steps/topk/tokens) beside the EAGLE-3 head's default run; OUT/block.tgz.* parts
#   block_l8b  benchmarks/probes/probe_block_tree.py (grow_tree's launch variants; PROBE_ALT: other versions'
#              kernels/block_tree.py beside it, space-separated file paths; its rows also go to
#              OUT/probe_block_tree.log as they come, so a probe cut by its 300 s still returns them; PROBE_ARGS: e.g.
#              --cases SmolLM2_Vd,Llama --trees 7/4), benchmarks/bench_draft.py (the draft phase of EAGLE-3 and block
#              drafters at SmolLM2's and Llama-3.1-8B's shapes, B 1 and 8), then random Llama-3.1-8B weights,
#              tree=simulate, B=1: a random block drafter (L8B_LAYERS layers, default 2, at L8B_TREE, S/K/N[/K1],
#              default 4/4/16/16, the block tree; no n-gram branches: the random prompts match nothing and the simulated acceptance follows the
#              drafter's tree, so they would only widen the verify) beside the EAGLE-3 head, both over a draft
#              vocabulary of 32,000 tokens (the public 8B EAGLE-3 heads'), step and draft times against the weight floors
#   smol_sim   random SmolLM2-135M weights, tree=simulate (mean accepted SIM_TAU, default 3.3), B=1, no model file: the
#              block drafter (2 layers, 8,192 draft ids, tree 4/4/16 with 16 root children, its n-gram branch of 15) and
#              EAGLE-3 (5/4/8, 8,192
#              ids), REPS (default 2) runs each: step, draft and extend times; then the block drafter's per-kernel graph
#              times. ALT=<dir>: its files overlaid on a copy of this tree run the same beside (an A/B on one machine);
#              TAUS (default "3.75 4.2"): the block runs again at those simulated taus; accept 0: inside the verify;
#              last, plain decoding's per-kernel graph times (prof_ar.txt) and benchmarks/probes/probe_pdl.py
#   lossless   bf16 greedy speculative vs plain decoding on the 80 MT-bench first turns (invariant numerics):
#              each head kind of LOSSLESS_HEADS (default eagle3 eagle1 multi_layer) x chain/eagle2 x B 1/8; the
#              shipped EAGLE-3 head, EAGLE-1 and multi-layer heads trained here for HEAD_S seconds each
# Results go to OUT (default $OUT, else ./gpu_out); tables are printed last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage=${1:?stage: tests | invariant | e2e | ar | kernels | ablation | regen | synth | train | experiments | trees | scaling | lossless | drafters | block | block_l8b | smol_sim}
out=${2:-${OUT:-gpu_out}}
mkdir -p "$out"
source scripts/offline_gpu_env.sh
# train and experiments: SmolLM2 as an HF directory (made by train), and the training overrides both stages use
# (the regeneration settings are part of the regenerated data's cache key); TRAIN_ARGS: more (a CPU dry run);
# MAX_TURNS: exchanges per conversation (default 1; null: all, with SHAREGPT_XZ from sharegpt_subset.py --user-turns)
T=/tmp/train smol=$KEEP/smollm2_hf
train_args=(logger=none target.path="$smol" data.path="$SHAREGPT" data.max_turns=${MAX_TURNS:-1} data.regen.max_new_tokens=512
            data.regen.batch_size=128 data.cache_dir=$T/regen train.progress=false train.optim.lr=${LR:-3e-4}
            eval.num_prompts=16 train.compile=${COMPILE:-false} ${TRAIN_ARGS:-})
rate() {  # training tokens/s of a run: the mean of its log windows after the first (warm-up, autotuning)
  python -c "import json; r = [json.loads(l)['train/tokens_per_s'] for l in open('$1/train_log.jsonl')]
r = r[1:] or r
print(round(sum(r) / len(r)))"
}
train_setup() {  # regenerated data (REGEN_CACHE: an earlier run's data.cache_dir files), threads, the HF copy
  mkdir -p $T/regen
  [[ -n ${REGEN_CACHE:-} ]] && cp -r "$REGEN_CACHE"/. $T/regen/
  # torchrun's default of one OpenMP thread per process slowed the host side of each step (host-bound here)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
  # the GGUF once as an HF directory (the same weights): a load then takes ~2 s instead of the 20-25 s the
  # H200 box spent per run on GGUF dequantisation and tokenizer conversion
  [[ -f $smol/model.safetensors ]] || python -m eaglet.models.checkpoint convert "$gguf" "$smol" --dtype float32
}
bs=${BATCH:-16} deadline=$((SECONDS + ${BUDGET_S:-560})) ngpu=$(nvidia-smi -L | wc -l)
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
launch() {  # nproc, run dir, overrides...: train_draft.py under torchrun within the time left
  local n=$1 dir=$2; shift 2
  timeout "$(left)" torchrun --standalone --nproc-per-node "$n" train_draft.py hydra.run.dir="$dir" \
    "${train_args[@]}" train.batch_size=$bs "$@" 2>&1 | tee "$dir.log" | grep -E "^\[eaglet\]|Error|error" | tail -12
}
probes() {  # one-GPU and DDP throughput: PROBE_STEPS steps each, batches drawn at random (length-grouped
  # batches made 10-step windows swing 2x with their lengths), the mean of the windows after the first
  local probe=(train.steps=4000 train.stop_at_step=${PROBE_STEPS:-60} eval.every=0 train.ckpt_every=0
               train.group_by_length=false)
  launch "$ngpu" $T/probe_ddp "${probe[@]}"  # the regeneration happens here, split over the GPUs
  CUDA_VISIBLE_DEVICES=0 launch 1 $T/probe_1gpu "${probe[@]}"
  r1=$(rate $T/probe_1gpu); rn=$(rate $T/probe_ddp)
  [[ -n $rn ]] || { echo "[gpu_session] the DDP probe failed: training on one GPU"; ngpu=1; rn=$r1; }
  echo "[gpu_session] training tokens/s: 1 GPU $r1, $ngpu GPUs (DDP) $rn = $(python -c "print(f'{$rn/$r1:.2f}')")x"
}
train_head() {  # kind, heads folder [, overrides...]: an EAGLE-1 or multi-layer head trained for HEAD_S seconds
  # on one GPU into <heads>/smollm2_135m_<kind> (these heads train on the default 8 sequences per step)
  local k=$1 heads=$2 hs=${HEAD_S:-120}; shift 2
  # one GPU's training tokens/s and tokens per sequence: `train`'s probe, else the H200's (39-48 k at 16 sequences)
  local r1 per_seq steps
  r1=$([[ -f $T/probe_1gpu/train_log.jsonl ]] && rate $T/probe_1gpu || echo 40000)
  per_seq=$([[ -f $T/probe_1gpu/metrics.json ]] && python -c "import json; m = json.load(open('$T/probe_1gpu/metrics.json'))
print(m['num_tokens'] / m['num_sequences'])" || echo 586)
  # steps that fit HEAD_S at the kind's rate over EAGLE-3's (2 for EAGLE-1, 1 for 3 layers: a guess; the time
  # limit holds either way), so that the LR schedule ends near the limit
  steps=$(python -c "print(int(($hs - 40) * {'eagle1': 2}.get('$k', 1) * $r1 / ($per_seq * 8)))")
  python train_draft.py hydra.run.dir=$T/$k train/head=$k "${train_args[@]}" train.steps=$steps \
    train.time_limit_s=$hs "$@" > $T/$k.log 2>&1 || tail -3 $T/$k.log
  grep "^\[eaglet\]" $T/$k.log | tail -2 | sed "s/^/[$k] /"
  cp -r $T/$k/head "$heads/smollm2_135m_$k"
}
selfgen_args() {  # SELFGEN's finished chunks 0..n_sg-1 of its recipe into train_args; per_sg: tokens per sequence
  # (a synth call cut by its time limit leaves the later chunks missing: training reads the finished prefix)
  read -r n_sg per_sg < <(python - "$SELFGEN" <<'PY'
import json, sys
from pathlib import Path
from eaglet.training.synth_store import chunk_meta, chunk_path
root = Path(sys.argv[1]); index = json.loads((root / "index.json").read_text())
n, tokens, seqs = 0, 0, 0
while n < index["num_chunks"] and (m := chunk_meta(chunk_path(root, n))) and m.get("recipe") == index["recipe"]:
    tokens, seqs, n = tokens + m["stats"]["tokens"], seqs + m["stats"]["sequences"], n + 1
print(n, round(tokens / max(seqs, 1)))
PY
)
  (( n_sg > 0 )) || { echo "[gpu_session] SELFGEN=$SELFGEN has no finished chunk 0"; exit 1; }
  echo "[gpu_session] self-generated data: chunks 0..$((n_sg - 1)) of $SELFGEN, $per_sg tokens per sequence"
  train_args+=(data.source=selfgen data.selfgen.dir="$SELFGEN" data.selfgen.chunks=$n_sg)
}
sweep() {  # log file, sweep dir, overrides...: one Hydra multirun of run_spec.py (within SWEEP_S seconds)
  local log=$1 dir=$2; shift 2
  timeout "${SWEEP_S:-36000}" python run_spec.py -m logger=none print_answers=0 \
    hydra.sweep.dir="$dir" "$@" ${EXP_ARGS:-} > "$log" 2>&1 || tail -5 "$log"  # EXP_ARGS: as TRAIN_ARGS
  grep -E "^\[eaglet\] done:|Error" "$log" | sed "s|^|[$(basename "$log" .log)] |"
}
alt_setup() {  # ALT's files over a copy of this tree in /tmp/alt/tree, importable as eaglet from /tmp/alt/ns
  rm -rf /tmp/alt && mkdir -p /tmp/alt/ns/eaglet && cp -a . /tmp/alt/tree && cp -a "$ALT"/. /tmp/alt/tree/
  for d in kernels models engine runner training data experiments; do ln -sfn /tmp/alt/tree/$d /tmp/alt/ns/eaglet/$d; done
}
in_code() {  # here | alt, command...: the command in this tree, or in alt_setup's copy
  local code=$1; shift
  if [[ $code == alt ]]; then (cd /tmp/alt/tree && PYTHONPATH=/tmp/alt/ns "$@"); else "$@"; fi
}
case $stage in
  tests)
    # one line per test as it ends, and its seconds in OUT/test_times.txt (tests/conftest.py), so a call cut short
    # still says what passed and where the time went; default kernel configs (EAGLET_AUTOTUNE=0): tuning every test
    # shape costs minutes of compilation
    EAGLET_AUTOTUNE=0 EAGLET_TEST_TIMES="$out/test_times.txt" python -m pytest -v -rf -p no:cacheprovider \
      ${TEST_PATHS:-tests/kernels tests/engine} 2>&1 \
      | tee "$out/tests.log" \
      | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -60 ;;
  invariant)
    # the invariant kernels' GPU tests (bf16 bit-identity across M, graphs), then one benchmark per part, each within
    # the time left (BUDGET_S): proj = benchmarks/bench_projection.py, step = bench_step.py, attn =
    # bench_tree_attention.py --invariant; the sweeps (tuning the launch tables) only with SWEEP=1 or in PARTS
    EAGLET_AUTOTUNE=0 timeout ${TEST_S:-200} python -m pytest -v -rf -p no:cacheprovider tests/kernels/test_projection.py \
      tests/kernels/test_invariant_model.py "tests/kernels/test_tree_attention.py::test_invariant_node_equals_its_decode" \
      2>&1 | tee "$out/invariant_tests.log" | grep -E "passed|failed|^E |FAILED" | tail -20
    parts=${PARTS:-proj step attn}; (( ${SWEEP:-0} )) && parts+=" sweep attn_sweep"
    for part in ${parts//,/ }; do
      case $part in
        proj) cmd=(benchmarks.bench_projection --md "$out/projection_h200.md" ${PROJ_ARGS:-}) ;;
        step) cmd=(benchmarks.bench_step --md "$out/step_h200.md" ${STEP_ARGS:-}) ;;
        attn) cmd=(benchmarks.bench_tree_attention --invariant --md "$out/attn_invariant_h200.md" ${ATTN_ARGS:-}) ;;
        sweep) cmd=(benchmarks.probes.sweep_projection --md "$out/sweep_projection_h200.md" ${SWEEP_ARGS:-}) ;;
        attn_sweep) cmd=(benchmarks.probes.sweep_tree_attention ${ATTN_SWEEP_ARGS:-}) ;;
        *) echo "[gpu_session] unknown part $part"; continue ;;
      esac
      timeout "$(left)" python -m "${cmd[@]}" 2>&1 | tee "$out/invariant_$part.log" | grep -E "^\||Error|error" \
        | tail -60
    done ;;
  e2e)
    # the issue-level end-to-end runs of the defaults (SmolLM2 + the shipped head, MT-bench, B=1 and 8, each with its
    # AR pass), the fastest plain decoding beside them, and random Llama-3.1-8B (plain decoding; EAGLE-3 with
    # tree=simulate); one line per run from its metrics.json (scripts/summarize_runs.py)
    train_setup >/dev/null 2>&1
    R=/tmp/e2e; mkdir -p $R
    one() { local name=$1; shift; timeout ${RUN_S:-240} python run_spec.py hydra.run.dir=$R/$name logger=none "$@" \
              > $R/$name.log 2>&1 || tail -3 $R/$name.log; }
    if (( ${E2E_SMOL:-1} )); then
      for b in ${E2E_BATCHES:-1 8}; do
        one smol_b$b target.path="$smol" gen.batch_size=$b ${E2E_ARGS:-}
        one smol_ar_b$b target.path="$smol" draft=none gen.batch_size=$b ${AR_ARGS:-}
      done
    fi
    r8=(target=random_llama3_8b data=synthetic data.limit=1 data.prompt_len=1024 gen.max_new_tokens=256)
    if (( ${E2E_L8B:-1} )); then
      one l8b_ar "${r8[@]}" draft=none ${AR8_ARGS:-}
      one l8b_eagle3_sim +experiment=ablate_overlap hydra.mode=RUN gen.batch_size=1 stream=serial tree=simulate \
        ${SIM_ARGS:-}
    fi
    python scripts/summarize_runs.py $R/* | tee "$out/e2e.md"
    tar cz -C $R --exclude=wandb --exclude=trace.json --exclude=.hydra . > "$out/e2e.tgz" ;;
  ar)
    python -m benchmarks.bench_ar --batch 1 8 --max-new 256 --hf-max-new 32 --out "$out/ar_h200.md" ;;
  kernels)
    python -m benchmarks.bench_tree_attention --md "$out/tree_attention_h200.md" 2>&1 | tail -30
    python -m benchmarks.bench_model_kernels --md "$out/model_kernels_h200.md" 2>&1 | tail -30
    python -m benchmarks.probes.profile_decode --context 512 --invariant 2>&1 | tail -30
    python -m benchmarks.bench_tree_verify --out "$out/tree_verify_h200.md" 2>&1 | tail -15
    python -m benchmarks.bench_topk --md "$out/topk_h200.md" 2>&1 | tail -20
    python -m benchmarks.bench_build_tree --md "$out/build_tree_h200.md" 2>&1 | tail -20
    python -m benchmarks.bench_ngram_match --md "$out/ngram_match_h200.md" 2>&1 | tail -20
    python -m benchmarks.bench_trie_graft --md "$out/trie_graft_h200.md" 2>&1 | tail -20
    python -m benchmarks.bench_pool_slots --md "$out/pool_slots_h200.md" 2>&1 | tail -20
    python -m benchmarks.bench_block_tree --md "$out/block_tree_h200.md" 2>&1 | tail -20 ;;
  ablation)
    # each experiment's tree shapes split over the GPUs (all on one GPU when there is one), so that every plan and
    # repeat of a (target, tree) point runs on the same GPU; ABLATION_S: a time limit per sweep (the report then
    # covers the runs that finished). 24 runs took ~400 s on one H200 (random Llama-3.1-8B).
    exps=${ABLATION_EXP:-ablate_overlap ablate_overlap_smollm2}
    # only the SmolLM2 ablation needs the GGUF (random Llama-3.1-8B runs without any file)
    [[ $exps != *smollm2* || -f $smol/model.safetensors ]] ||
      python -m eaglet.models.checkpoint convert "$gguf" "$smol" --dtype float32
    # ABLATION_GPUS=1 runs the trees one after the other on one GPU: the SmolLM2 step is close to host-bound, and two
    # sweeps at once share the host
    ab_gpus=${ABLATION_GPUS:-$ngpu}
    for e in $exps; do
      read -ra trees <<< "$(sed -n 's/^ *tree: *//p' conf/experiment/$e.yaml | tr , ' ')"
      (( ab_gpus > 1 )) || trees=("$(IFS=,; echo "${trees[*]}")")
      extra=(); [[ $e == *smollm2* ]] && extra=(target.path="$smol")
      for i in "${!trees[@]}"; do
        CUDA_VISIBLE_DEVICES=$((i % ab_gpus)) SWEEP_S=${ABLATION_S:-3600} sweep /tmp/${e}_$i.log /tmp/ablation/$e \
          +experiment=$e tree="${trees[$i]}" "${extra[@]}" &
      done
      wait
    done
    python -m eaglet.experiments.report /tmp/ablation/* --out "$out/ablate_overlap"
    tar cz -C /tmp --exclude=wandb --exclude=trace.json --exclude=outputs.jsonl --exclude=.hydra ablation > "$out/ablate_runs.tgz"
    cat "$out/ablate_overlap/overlap.md" ;;
  regen)
    # one optimiser step after the data is complete (the regeneration happens while the run loads its data); a
    # cut-off run keeps its finished chunks
    train_setup
    launch "$ngpu" $T/regen_run train.steps=1 eval.every=0 train.ckpt_every=0 train.group_by_length=false
    # the records only: their rendering (samples-*.safetensors) is remade on load (~20 s for 10k multi-turn chats)
    tar cJ -C $T/regen --exclude='samples-*' . | split -b 15M - "$out/regen.txz."
    grep -h "regenerating chunk" $T/regen_run.log | tail -2; ls -la "$out" ;;
  synth)
    # SYNTH_ARGS: more overrides (magpie.num=..., answers.sampled=..., see conf/synthesize.yaml); a changed recipe
    # needs its own folder (SYNTH_DIR). PACK_S: seconds kept for packing. The Magpie files, the chunks, recipe.json
    # and index.json are packed (cat synth.txz.* | tar xJ -C DIR; DIR is then data.selfgen.dir and SYNTH_CACHE);
    # pool.json is not: it is remade from them in about a minute. Training on it, on the same machine:
    #   TRAIN_ARGS="data.source=selfgen data.selfgen.dir=/tmp/synth" bash scripts/gpu_session.sh train
    train_setup
    S=${SYNTH_DIR:-/tmp/synth}; mkdir -p "$S"
    [[ -n ${SYNTH_CACHE:-} ]] && cp -r "$SYNTH_CACHE"/. "$S"/
    # no new piece of work starts past time_limit_s (30 s are kept for loading); the timeout is the backstop (every
    # file is written atomically, so a killed run loses only the pieces in flight)
    run_s=$(( $(left) - ${PACK_S:-45} )); (( run_s > 90 )) || run_s=90
    timeout "$run_s" torchrun --standalone --nproc-per-node "$ngpu" synthesize.py hydra.run.dir="$S.hydra" \
      target.path="$smol" sharegpt.path="$SHAREGPT" out_dir="$S" progress=false time_limit_s=$((run_s - 30)) \
      ${SYNTH_ARGS:-} 2>&1 | tee "$S.log" | grep -E "^\[eaglet\]|Error|error" | tail -12
    XZ_OPT="-T0 -2" tar cJ -C "$S" --exclude=pool.json . | split -b 15M - "$out/synth.txz."
    cp "$S/index.json" "$S/recipe.json" "$S.log" "$out/" 2>/dev/null
    python -c "import json; i = json.load(open('$S/index.json')); t = i['totals']
print(f\"[gpu_session] synth: {i['chunks_done']} of {i['num_chunks']} chunks, {t.get('sequences', 0)} sequences, \"
      f\"{t.get('tokens', 0)} tokens; answers at {i['answer_tokens_per_s'] or 0:.0f} tokens/s per process\")"
    ls -la "$out" ;;
  train)
    # regeneration on every GPU (REGEN_CACHE: a folder of an earlier run's data.cache_dir files, which skips it), a
    # one-GPU and a DDP throughput probe (60 steps each), the EAGLE-3 head trained on every GPU for what is left of
    # BUDGET_S minus EVAL_S (its LR schedule sized to fit), then it decodes MT-bench at B=1 and 8 against AR and
    # HumanEval and held-out ShareGPT at B=8 (and head_best/ on MT-bench); full logs in $T/*.log, results packed into
    # OUT/train.tgz.* parts
    # PROBES=0 skips the probes (DDP scaling is in results/ddp_scaling_h200/): the step count then comes
    # from RATE (tokens/s on all GPUs; the shipped head's run: 163 k on two at 32 sequences) and PER_SEQ (tokens per
    # regenerated first exchange: 583 there), and the regeneration (REGEN_S, ~100 s for 10,952 first exchanges on
    # two H200s) happens inside the training run
    # SELFGEN: a synthesize.py out_dir (the synth stage's /tmp/synth, or its unpacked synth.txz.*): the head trains
    # on its finished chunks 0..N-1 instead of regenerated ShareGPT (PER_SEQ then defaults to their tokens per
    # sequence). The H200 trained at 92.5 k tokens/s on one GPU at BATCH=24 on such data (RATE=90000).
    train_setup
    ev=${EVAL_S:-100} regen_s=0
    if [[ -n ${SELFGEN:-} ]]; then
      selfgen_args
      PER_SEQ=${PER_SEQ:-$per_sg}
    fi
    if [[ ${PROBES:-1} == 0 ]]; then
      rn=${RATE:-150000} per_seq=${PER_SEQ:-583}
      [[ -n ${REGEN_CACHE:-}${SELFGEN:-} ]] || regen_s=${REGEN_S:-120}  # self-generated data: none to wait for
    else
      probes
      per_seq=$(python -c "import json; m=json.load(open('$T/probe_1gpu/metrics.json'))
print(m['num_tokens'] / m['num_sequences'])")
    fi
    # optimiser steps that fit the time left (minus loading, evaluations, export): the cosine decay ends on time
    steps=$(python -c "print(int(($(left) - $ev - 40 - $regen_s) * $rn / ($per_seq * $bs * $ngpu)))")
    echo "[gpu_session] EAGLE-3: $steps steps on $ngpu GPUs"
    launch "$ngpu" $T/eagle3 train.steps=$steps eval.every=$((steps / 2)) train.ckpt_every=$((steps / 2)) \
      train.profile_steps=3 train.time_limit_s=$(($(left) - ev - 10))
    mkdir -p $T/heads && cp -r $T/eagle3/head $T/heads/smollm2_135m_eagle3
    export CUDA_VISIBLE_DEVICES=0
    e3=(target.path="$smol" draft=eagle3 draft.path=$T/heads/smollm2_135m_eagle3)
    SWEEP_S=$(left) sweep $T/eval_compare.log $T/eval/compare_heads +experiment=compare_heads "${e3[@]}" \
      gen.batch_size=1,8
    SWEEP_S=$(left) sweep $T/eval_humaneval.log $T/eval/datasets +experiment=datasets "${e3[@]}" data=humaneval \
      gen.compare_ar=false
    SWEEP_S=$(left) sweep $T/eval_sharegpt.log $T/eval/datasets +experiment=datasets "${e3[@]}" data=sharegpt \
      data.path="$SHAREGPT" gen.compare_ar=false
    # the head of the best held-out eval/acc_0 (it may be an earlier one than the last) on MT-bench: early stopping
    [[ -d $T/eagle3/head_best ]] && SWEEP_S=$(left) sweep $T/eval_best.log $T/eval/datasets_best +experiment=datasets \
      "${e3[@]}" draft.path=$T/eagle3/head_best data=mt_bench gen.compare_ar=false
    # in 15 MB parts, as a device call returns files of at most 16 MiB (cat train.tgz.* | tar xz to unpack)
    tar cz -C $T --exclude=wandb --exclude=checkpoints --exclude=trace.json --exclude=.hydra --exclude='*/head' \
      --exclude='head_best/*.safetensors' \
      --exclude=outputs.jsonl --exclude=regen $(cd $T && ls -d probe_ddp probe_1gpu 2>/dev/null) eagle3 $(cd $T && ls ./*.log) heads eval \
      | split -b 15M - "$out/train.tgz."
    [[ -f $T/eagle3/trace.json ]] && gzip -c $T/eagle3/trace.json | split -b 15M - "$out/train_trace.json.gz."
    # the regenerated data and its rendering, for REGEN_CACHE next time (cat regen.txz.* | tar xJ)
    tar cJ -C $T/regen . | split -b 15M - "$out/regen.txz."
    ls -la "$out" ;;
  experiments)
    # after `train` on the same machine (its heads, regenerated data and throughput probe in /tmp/train): GPU 1
    # trains an EAGLE-1 and a multi-layer head for HEAD_S seconds each, then the head comparison, the dataset runs
    # and the tree sweep are split over the GPUs; each sweep's runs land in one folder, reported into
    # OUT/<experiment>/ and packed into OUT/runs.tgz
    # Without `train` before it: the shipped EAGLE-3 head, REGEN_CACHE for the data, and guessed training rates
    X=/tmp/exp heads=$T/heads; mkdir -p $X $heads
    train_setup
    [[ -d $heads/smollm2_135m_eagle3 ]] || cp -r heads/smollm2_135m_eagle3 $heads/
    smol_run=(target.path="$smol")  # SmolLM2 runs
    e3=("${smol_run[@]}" draft.path=$heads/smollm2_135m_eagle3)  # ... with the EAGLE-3 head of `train`
    (
      export CUDA_VISIBLE_DEVICES=1
      train_head eagle1 $heads; train_head multi_layer $heads
      sweep $X/compare_heads_gpu1.log $X/compare_heads +experiment=compare_heads "${smol_run[@]}" heads_dir=$heads \
        draft=eagle1,multi_layer gen.batch_size=1,8
      sweep $X/sweep_tree_7.log $X/sweep_tree +experiment=sweep_tree "${e3[@]}" tree.steps=7
      sweep $X/datasets_sharegpt.log $X/datasets +experiment=datasets "${e3[@]}" data=sharegpt data.path="$SHAREGPT"
    ) &
    (
      export CUDA_VISIBLE_DEVICES=0
      sweep $X/compare_heads.log $X/compare_heads +experiment=compare_heads "${smol_run[@]}" heads_dir=$heads \
        draft=none,eagle3 gen.batch_size=1,8
      sweep $X/datasets.log $X/datasets +experiment=datasets "${e3[@]}" data=mt_bench,humaneval
      sweep $X/sweep_tree_35.log $X/sweep_tree +experiment=sweep_tree "${e3[@]}" tree.steps=3,5
    )
    wait
    for e in compare_heads datasets sweep_tree; do
      python -m eaglet.experiments.report $X/$e --out "$out/$e" | tail -1
    done
    # metrics and logs only: an EAGLE-1 head (63 MB, the target's vocabulary) is over a device call's 16 MiB per file
    tar cz -C /tmp --exclude=wandb --exclude=trace.json --exclude=outputs.jsonl exp train/{eagle1,multi_layer}.log \
      train/{eagle1,multi_layer}/{train_log.jsonl,metrics.json} > "$out/runs.tgz"
    cat "$out"/compare_heads/runs.md "$out"/datasets/runs.md ;;
  block)
    train_setup
    run_dir=${BLOCK_RUN:-$KEEP/block_run} ev=${EVAL_S:-150} R=/tmp/block
    # this call's runs only: a second call on the same machine would otherwise list the first one's in block.md
    rm -rf $R; mkdir -p $R "$run_dir"
    [[ -n ${SELFGEN:-} ]] && selfgen_args
    # the time limit counts from the trainer's start: loading and the export fit in the 40 s left over
    # one held-out evaluation at the end (per-row accuracy and tau for TRAINING.md's plot; BLOCK_EVAL_EVERY: more)
    # BLOCK_STEPS unset: the steps that fit the time left at BLOCK_RATE tokens/s a GPU (2 layers, 16 sequences of
    # self-generated data: 55 k on an H100), so that the cosine decay ends on time; a call that resumes BLOCK_RUN
    # must pass the first call's BLOCK_STEPS
    fit=$(python -c "print(int(($(left) - $ev - 70) * ${BLOCK_RATE:-55000} / (${per_sg:-490} * $bs)))")
    steps=${BLOCK_STEPS:-$fit}
    echo "[gpu_session] block drafter: $steps steps on $ngpu GPUs"
    launch "$ngpu" "$run_dir" train/head=block train.steps=$steps eval.every=${BLOCK_EVAL_EVERY:-$steps} \
      train.ckpt_every=250 train.keep_last=1 train.time_limit_s=$(($(left) - ev - 40)) \
      train.profile_steps=${BLOCK_PROFILE:-3} ${BLOCK_ARGS:-}
    # its log, with the profiler's top ops of 3 steps (a step of the first stage took 142 ms for ~3 TFLOP, ~10 ms of
    # an H100's bf16 peak: results/block_drafter_h100)
    cp "$run_dir.log" "$out/block_train.log"
    export CUDA_VISIBLE_DEVICES=0
    run1() { local name=$1; shift; timeout ${RUN_S:-120} python run_spec.py hydra.run.dir=$R/$name logger=none \
               print_answers=0 target.path="$smol" data.max_turns=1 gen.batch_size=1 "$@" > $R/$name.log 2>&1 ||
               tail -3 $R/$name.log; }
    run1 eagle3_b1 draft=eagle3
    for t in ${BLOCK_TREES:-5/4/8 7/4/16 6/8/32}; do
      IFS=/ read -r st k n <<< "$t"
      run1 block_${st}_${k}_${n}_b1 draft=block draft.path="$run_dir/head" tree.steps=$st tree.topk=$k \
        tree.num_draft_tokens=$n
    done
    python scripts/summarize_runs.py $R/* | tee "$out/block.md"
    # the exported drafter, its logs and the runs (cat block.tgz.* | tar xz)
    tar cz --exclude=wandb --exclude=.hydra --exclude=checkpoints --exclude=trace.json --exclude=outputs.jsonl \
      -C "$(dirname "$run_dir")" "$(basename "$run_dir")" -C /tmp block | split -b 15M - "$out/block.tgz." ;;
  block_l8b)
    R=/tmp/block_l8b; mkdir -p $R
    # grow_tree's chain (K = 1) over the larger vocabularies, ~50 µs a depth slower than at 8,192 ids: launch variants
    alts=(); for a in ${PROBE_ALT:-}; do alts+=(--alt "$a"); done
    timeout 300 python -u -m benchmarks.probes.probe_block_tree "${alts[@]}" ${PROBE_ARGS:-} \
      --md "$out/probe_block_tree.md" 2>&1 | grep --line-buffered -E "^\||Error" | tee "$out/probe_block_tree.log" |
      tail -80
    # the draft phase alone, each half a CUDA graph: EAGLE-3 against block drafters of 1-3 layers
    timeout $(($(left) / 2)) python -m benchmarks.bench_draft --md "$out/draft.md" ${DRAFT_ARGS:-} 2>&1 |
      grep -E "^\||Error" | tail -30
    r8=(target=random_llama3_8b data=synthetic data.limit=1 data.prompt_len=1024 gen.max_new_tokens=256 gen.batch_size=1
        stream=serial tree=simulate logger=none)
    for d in block eagle3; do
      # 32,000 LM-head rows (0.26 GB) per draft, not all 128,256 (1.05 GB, ~0.3 ms of the 0.6 ms draft budget)
      extra=(draft=$d draft.random_init=true draft.draft_vocab_size=32000)
      # the block drafter at its own tree (tree=simulate alone would give it 7/1/8, a chain)
      IFS=/ read -r st k n k1 <<< "${L8B_TREE:-4/4/16/16}"
      # ++: also where ALT's older tree configs have no root_children key
      [[ $d == block ]] && extra+=(draft.num_layers=${L8B_LAYERS:-2} tree.steps=$st tree.topk=$k tree.num_draft_tokens=$n
                                   ${k1:+++tree.root_children=$k1} draft.ngram_branches=0)
      timeout ${RUN_S:-240} python run_spec.py hydra.run.dir=$R/l8b_${d}_sim "${r8[@]}" "${extra[@]}" \
        > $R/l8b_$d.log 2>&1 || tail -3 $R/l8b_$d.log
    done
    python scripts/summarize_runs.py $R/* | tee "$out/block_l8b.md" ;;
  smol_sim)
    R=/tmp/smol_sim; mkdir -p $R
    rs=(target=random_llama3_8b target.random=smollm2_135m target.name=random_smollm2 data=synthetic data.limit=4
        tree=simulate tree.simulate.tau=${SIM_TAU:-3.3} gen.max_new_tokens=256 logger=none print_answers=0)
    # the block runs also time plain decoding (AR tok/s: the same shapes as the real SmolLM2)
    blk=(tree.steps=4 tree.topk=4 tree.num_draft_tokens=16 ++tree.root_children=16 draft=block draft.random_init=true
         draft.draft_vocab_size=8192 gen.compare_ar=true)  # ++: also where ALT's tree configs have no such key
    eag=(tree.steps=5 tree.topk=4 tree.num_draft_tokens=8 draft=eagle3 draft.random_init=true draft.draft_vocab_size=8192
         gen.compare_ar=false)
    codes=(here)
    [[ -n ${ALT:-} ]] && { alt_setup; codes+=(alt); }  # another version beside this one
    sim() {  # code (here | alt), run name, overrides...
      local code=$1 name=$2; shift 2
      in_code $code timeout ${RUN_S:-120} python run_spec.py hydra.run.dir=$R/$name "${rs[@]}" "$@" > $R/$name.log 2>&1 ||
        tail -3 $R/$name.log
      python - $R/$name <<'PY' | tee -a "$out/smol_sim.md"
import json, sys
from pathlib import Path
m = json.loads((Path(sys.argv[1]) / "metrics.json").read_text())
print(f"| {Path(sys.argv[1]).name} | {m['decode_tokens_per_s']:,.0f} | {m['step_ms']:.3f} | " + " | ".join(
    f"{m.get(p + '_ms', 0.0):.3f}" for p in ("draft", "plan", "verify", "accept", "extend")) + f" | {m['tau']:.2f} | "
    + (f"{m['ar_decode_tokens_per_s']:,.0f} |" if m.get("ar_decode_tokens_per_s") else "|"))
PY
    }
    echo "| run | decode tok/s | step ms | draft | plan | verify | accept | extend ms | tau | AR tok/s |" | tee "$out/smol_sim.md"
    echo "|---|---|---|---|---|---|---|---|---|---|" | tee -a "$out/smol_sim.md"
    for c in "${codes[@]}"; do sim $c warm_$c "${blk[@]}" gen.max_new_tokens=32; done  # the first run compiles
    for rep in $(seq ${REPS:-2}); do
      for c in "${codes[@]}"; do sim $c block_${c}_$rep "${blk[@]}"; sim $c eagle3_${c}_$rep "${eag[@]}"; done
    done
    # the tau the block drafter would need for a target speedup at today's step costs: the same runs at higher
    # simulated acceptance (TAUS; the AR rate is the rows above)
    for t in ${TAUS:-3.75 4.2}; do sim here block_here_tau${t//./_} "${blk[@]}" tree.simulate.tau=$t gen.compare_ar=false; done
    for c in "${codes[@]}"; do
      sim $c prof_block_$c "${blk[@]}" gen.compare_ar=false data.limit=1 profile_steps=5
      python -m benchmarks.probes.graph_trace $R/prof_block_$c/trace.json --by-grid --top 40 --graphs 4 --timeline \
        --sequence 80 > "$out/prof_block_$c.txt" 2>&1
    done
    # plain decoding's graph beside the verify's (what the verify's 30 nodes cost over one token), and its step
    timeout ${RUN_S:-120} python run_spec.py hydra.run.dir=$R/prof_ar "${rs[@]}" draft=none data.limit=1 profile_steps=5 \
      gen.compare_ar=false > $R/prof_ar.log 2>&1 || tail -3 $R/prof_ar.log
    python -m benchmarks.probes.graph_trace $R/prof_ar/trace.json --by-grid --top 40 --graphs 1 --timeline \
      > "$out/prof_ar.txt" 2>&1
    # what programmatic dependent launch takes off a chain of decode-sized kernels (a lead, not eaglet's kernels)
    timeout 120 python -m benchmarks.probes.probe_pdl --md "$out/probe_pdl.md" 2>&1 | grep -E "^\||Error" | tail -12 ;;
  drafters)
    train_setup >/dev/null 2>&1
    R=${DRAFTERS_DIR:-/tmp/drafters}; mkdir -p $R  # DRAFTERS_DIR: another, for a second BLOCK_RUN beside the first
    made=()  # this call's runs (an earlier call on the machine left its own in $R)
    codes=(here); [[ -n ${ALT:-} ]] && { alt_setup; codes+=(alt); }
    for d in ${DRAFTERS:-eagle3 ngram eagle3+ng2}; do
      spec=${d%@*} tree=()  # <draft>[+ng<K>][@steps/topk/tokens]
      draft=(draft=${spec%+ng*})
      if [[ $spec == *+ng* ]]; then  # +ng<K>[x<L>]: K branches [of L tokens]
        ng=${spec##*+ng}
        draft+=(draft.ngram_branches=${ng%x*})
        [[ $ng == *x* ]] && draft+=(draft.ngram_depth=${ng#*x})
      fi
      # the block drafter: the shipped one, or BLOCK_RUN's export (a `block` stage's), at BLOCK_TREE unless the entry
      # names a tree (default: conf/tree/block.yaml's, 4/4/16 with 16 root children)
      t=$([[ $d == *@* ]] && echo "${d#*@}")
      if [[ ${spec%+ng*} == block ]]; then
        [[ -n ${BLOCK_RUN:-} ]] && draft+=(draft.path="$BLOCK_RUN/head")  # else the shipped drafter
        t=${t:-${BLOCK_TREE:-}}
      fi
      if [[ -n $t ]]; then
        IFS=/ read -r st k n k1 <<< "$t"  # k1: the root's children (tree.root_children)
        tree=(tree.steps=$st tree.topk=$k tree.num_draft_tokens=$n ${k1:+tree.root_children=$k1})
      fi
      label=$spec${t:+_${t//\//_}}
      for data in ${DATASETS:-mt_bench humaneval sharegpt}; do
        for b in ${BATCHES:-1 8}; do
          for c in "${codes[@]}"; do
            name=${label}_${data}_b$b path=(); [[ $c == alt ]] && name+=_alt
            made+=("$R/$name")
            [[ $data == sharegpt ]] && path=(data.path="$SHAREGPT")  # its held-out split, from the carried subset
            in_code $c timeout ${RUN_S:-240} python run_spec.py hydra.run.dir=$R/$name logger=none print_answers=0 \
              target.path="$smol" "${draft[@]}" "${tree[@]}" data=$data data.max_turns=1 gen.batch_size=$b \
              "${path[@]}" ${DRAFTER_ARGS:-} > $R/$name.log 2>&1 || tail -3 $R/$name.log
            # the table after every run: a call cut at its time limit still returns the rows it finished
            python scripts/summarize_runs.py "${made[@]}" > "$out/drafters.md"
          done
        done
      done
      # PROFILE=1: where each graph's time goes (4 MT-bench prompts at B=1, 5 profiled steps; graph_trace.py)
      if [[ ${PROFILE:-0} == 1 ]]; then
        timeout 90 python run_spec.py hydra.run.dir=$R/prof_$label logger=none print_answers=0 target.path="$smol" \
          "${draft[@]}" "${tree[@]}" data=mt_bench data.limit=4 data.max_turns=1 gen.batch_size=1 gen.compare_ar=false \
          profile_steps=5 > $R/prof_$label.log 2>&1 || tail -3 $R/prof_$label.log
        python -m benchmarks.probes.graph_trace $R/prof_$label/trace.json --by-grid --top 30 \
          > "$out/profile_${label//+/_}.txt" 2>&1  # no "+" in a returned file's name
      fi
    done
    cat "$out/drafters.md"
    tar cz -C $R --exclude=wandb --exclude=trace.json . > "$out/drafters.tgz" ;;
  trees)
    train_setup >/dev/null 2>&1
    R=/tmp/trees; mkdir -p $R
    trees=${TREES:-}  # steps/topk/tokens, space-separated: these trees, without the sweep
    if [[ -z $trees ]]; then
      sweep $R/sweep_tree.log $R/sweep_tree +experiment=sweep_tree target.path="$smol" ${TREE_ARGS:-}
      python -m eaglet.experiments.report $R/sweep_tree --out "$out/sweep_tree" | tail -1
      # the sweep's run of the most decode tokens/s (its folder name is s<steps>_k<topk>_n<tokens>_b<B>)
      trees=$(python - $R/sweep_tree <<'PY'
import json, re, sys
from pathlib import Path
runs = [(json.loads((d / "metrics.json").read_text())["decode_tokens_per_s"], d.name)
        for d in Path(sys.argv[1]).iterdir() if (d / "metrics.json").is_file()]
print("/".join(re.match(r"s(\d+)_k(\d+)_n(\d+)_b", max(runs)[1]).groups()))
PY
)
      echo "[gpu_session] fastest tree: $trees"
    fi
    made=()  # this call's runs (an earlier call on the machine left its own in $R)
    for t in $trees; do
      IFS=/ read -r s k n <<< "$t"
      for b in ${TREE_BATCHES:-1 8}; do
        d=$R/tree_${s}_${k}_${n}_b$b; made+=("$d")
        timeout ${RUN_S:-240} python run_spec.py hydra.run.dir=$d logger=none print_answers=0 target.path="$smol" \
          data.max_turns=1 gen.batch_size=$b tree.steps=$s tree.topk=$k tree.num_draft_tokens=$n ${TREE_ARGS:-} \
          > $d.log 2>&1 ||
          tail -3 $d.log
      done
    done
    python scripts/summarize_runs.py "${made[@]}" | tee "$out/trees.md"
    tar cz -C $R --exclude=wandb --exclude=trace.json --exclude=.hydra . > "$out/trees.tgz" ;;
  scaling)
    train_setup
    probes
    tar cz -C $T --exclude=head --exclude=.hydra --exclude=checkpoints probe_ddp probe_1gpu > "$out/scaling.tgz" ;;
  lossless)
    # one head kind after another on each GPU (round robin); EAGLE-1 and multi-layer heads are trained here first:
    # HEAD_S seconds on ShareGPT's own answers (no regeneration), enough for the drafts to be accepted at times,
    # which is all losslessness needs of a head
    train_setup
    L=/tmp/lossless heads=$T/heads sub='hydra.sweep.subdir=${draft.name}_${tree.name}_b${gen.batch_size}'
    mkdir -p $L $heads && cp -r heads/smollm2_135m_eagle3 $heads/
    kinds=(${LOSSLESS_HEADS:-eagle3 eagle1 multi_layer})
    for g in $(seq 0 $((ngpu - 1))); do
      (
        export CUDA_VISIBLE_DEVICES=$g
        for ((j = g; j < ${#kinds[@]}; j += ngpu)); do
          k=${kinds[$j]}
          [[ -d $heads/smollm2_135m_$k ]] || train_head $k $heads data.regenerate=false data.limit=${HEAD_DATA:-3000}
          sweep $L/$k.log $L/runs target.path="$smol" data.max_turns=1 "$sub" draft=$k \
            draft.path=$heads/smollm2_135m_$k tree=chain,eagle2 gen.batch_size=1,8
        done
      ) &
    done
    wait
    python -m eaglet.experiments.report $L/runs --out "$out/lossless" | tail -1
    tar cz -C $L --exclude=wandb --exclude=trace.json --exclude=outputs.jsonl --exclude=.hydra runs > "$out/lossless.tgz"
    cat "$out/lossless/runs.md" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
