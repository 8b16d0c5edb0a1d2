#!/usr/bin/env bash
# SmolLM2-135M-Instruct trained by GRPO on BabyAI on a GPU, from the instruct model, no SFT
# (docs/SCALING.md, "The GPU check"): a SmolLM2 BabyAI recipe (CONFIG) on the GPU, every episode
# of a step in flight, validated greedily on the 90 test items.
#   CONFIG  the recipe (default configs/smollm2_babyai_grpo.yaml, replies continued from "Action:";
#           configs/smollm2_babyai_grpo_free.yaml: free replies after a worked example;
#           configs/gpu/smollm2_*_study.yaml: the settings of the H200 studies, run as they are)
#   MODEL   a named model, a .gguf file or a model folder (default smollm2-135m-instruct; the
#           wheel that holds it is too large to travel to the GPU machines, so give its .gguf)
#   STEPS   GRPO steps, the recipe's horizons spread over them, validated before, midway and after
#           (default: the config's own steps, schedule and validation)
#   LIMIT   minutes (train.time_limit_min; default 0, none): the first step past them validates,
#           saves and ends the run, so that a call with a time limit still ends with a test figure
#   RUNS    the folder of the run (default runs/gpu-check; not $OUT, which the GPU machines set)
#   SEEDS   seeds trained at once on the one GPU, e.g. "0 1 2" (default: one run, the recipe's seed):
#           `agentgym-rl compare --jobs`, a process a seed, into RUNS/<recipe>_s<seed>, then the
#           seeds' table with paired standard errors (RUNS/comparison.md); the KV-cache budget
#           (rollout.kv_cache_mb, 32 GB for one run) is shared out, 72 GB in all
#   KEEP    a folder (the GPU machine's $OUT) that receives run.tgz every 30 s and at the end:
#           the run's config, metrics and validation episodes, without checkpoints and training
#           trajectories (a call brings back at most 8 files, and nothing if it is killed mid-pipe)
# The parameters stay float32: at the recipe's learning rate (5e-6) most AdamW updates are
# smaller than bfloat16's rounding step at the weights' scale and would be lost.
# Arguments are more overrides of the train command.
# Run scripts/gpu-check.sh first on the same machine: it installs the dependencies (SITE).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/agentgym-rl-site}
RUNS=${RUNS:-runs/gpu-check}
DEVICE=${DEVICE:-cuda}
CONFIG=${CONFIG:-configs/smollm2_babyai_grpo.yaml}
MODEL=${MODEL:-smollm2-135m-instruct}
STEPS=${STEPS:-}
LIMIT=${LIMIT:-0}
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" \
    || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
CLI=("$PYTHON" -m agentgym_rl.cli)

start=$SECONDS
# `models prepare` takes a name or a .gguf file; a folder is used as it is.
if [ -d "$MODEL" ]; then FOLDER=$MODEL; else FOLDER=$("${CLI[@]}" models prepare "$MODEL"); fi
echo "== model folder $FOLDER ($((SECONDS - start)) s)"
read -ra SEED_LIST <<< "${SEEDS:-}"
KV_MB=32768
[ "${#SEED_LIST[@]}" -gt 1 ] && KV_MB=$(( 73728 / ${#SEED_LIST[@]} ))
# Every episode of a group in flight at once: the GPU holds their KV caches easily.
SETTINGS=(model.path="$FOLDER" run.device="$DEVICE" train.time_limit_min="$LIMIT" rollout.max_envs=0
          rollout.kv_cache_mb="$KV_MB")
[ -n "$STEPS" ] && SETTINGS+=(train.steps="$STEPS" train.validate_every=$(( STEPS / 2 )) train.save_every="$STEPS"
                              schedule.every=$(( (STEPS + 2) / 3 )))
SETTINGS+=("$@")
start=$SECONDS
if [ "${#SEED_LIST[@]}" -gt 0 ]; then
    seeds=$(IFS=,; echo "${SEED_LIST[*]}")
    "${CLI[@]}" compare "$CONFIG" "${SETTINGS[@]}" --seeds "$seeds" --jobs "${#SEED_LIST[@]}" --out "$RUNS" &
else
    "${CLI[@]}" train "$CONFIG" "${SETTINGS[@]}" run.output_dir="$RUNS" run.name=smollm2 &
fi
TRAIN=$!
pack() {
    [ -n "${KEEP:-}" ] || return 0
    tar -czf "$KEEP/run.tgz.part" -C "$RUNS" --exclude=checkpoints --exclude=trajectories . 2>/dev/null \
        && mv "$KEEP/run.tgz.part" "$KEEP/run.tgz"
}
while kill -0 "$TRAIN" 2>/dev/null; do sleep 30; pack; done >/dev/null 2>&1 &
PACKER=$!
status=0
wait "$TRAIN" || status=$?
kill "$PACKER" 2>/dev/null || true
pack
echo "== training (steps: ${STEPS:-as configured}${SEEDS:+; seeds $SEEDS}) ended after $((SECONDS - start)) s (exit $status)"
exit "$status"
