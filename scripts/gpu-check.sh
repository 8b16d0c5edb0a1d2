#!/usr/bin/env bash
# The CUDA paths in a few minutes, with the tiny model (docs/SCALING.md, "The GPU check"):
#   1. the project's dependencies from .whl/ (scripts/gpu-wheels.sh), for a machine that
#      reaches no registry and has torch, transformers and peft already;
#   2. torch sees a GPU (the first CUDA call: without one the script stops here, exit 3), then
#      bench/decode_step.py: HFGenerator against the slot generator, eager and as CUDA graphs
#      (checked equal first), bfloat16, sampled at temperature 1, beside the step's bandwidth
#      floor; then with replies of spread lengths; then a rollout of SmolLM2's shape through
#      each generator backend against per-turn generate (bench/gpu_rollout.py);
#   3. one GRPO step with run.device=cuda in bfloat16 (warm-up, rollout, update, validation),
#      then the same with rollout.generator=slots (continuous turns over CUDA graphs);
#   4. eval of its checkpoint on the GPU, and the README's one-GPU recipe with --smoke on it;
#   5. torchrun with one process: an NCCL process group, the learner sharded by FSDP2 over it;
#   6. serve-model on the GPU, and a greedy eval through it beside the in-process one.
# Every part runs under a timeout, within BUDGET seconds in all (default 480: a loan is minutes),
# and a part that fails or runs out of time is reported without stopping the parts after it;
# the script exits 1 at the end if any did (their names in $OUT/failed.txt).
# Writes under OUT (default runs/gpu-check); every step prints its command and wall time.
# DEVICE=cpu runs the same steps on the CPU (gloo instead of NCCL): a check of the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-runs/gpu-check}
SITE=${SITE:-/tmp/agentgym-rl-site}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-480}
mkdir -p "$OUT"
FAILED="$OUT/failed.txt"
: > "$FAILED"

# step LIMIT COMMAND...: COMMAND under a timeout of LIMIT seconds or what is left of BUDGET,
# whichever is less; a failure (or a timeout: exit 124) is written to $FAILED, not raised, so
# that one broken path does not hide the others. It appends to a file rather than a variable so
# that a step inside a pipeline (`step ... | tee`) reports too.
step() {
    local limit=$1 left=$((BUDGET - SECONDS)) start=$SECONDS rc=0
    shift
    if [ "$left" -le 0 ]; then
        echo "== skipped (BUDGET of $BUDGET s spent): $*"
        echo "skipped, no time left: $*" >> "$FAILED"
        return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $* (at most $limit s)"
    timeout -k 10 "$limit" "$@" || rc=$?  # -k: a process that ignores SIGTERM (NCCL stuck) is killed
    echo "== done in $((SECONDS - start)) s, exit $rc"
    [ "$rc" -eq 0 ] || echo "exit $rc after $((SECONDS - start)) s: $*" >> "$FAILED"
}

if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    step 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "no wheels in $WHEELS: using the installed packages" >&2
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
CLI=("$PYTHON" -m agentgym_rl.cli)
"$PYTHON" -c "import agentgym_rl.cli, minigrid, fastapi, uvicorn, torch, transformers, peft
print('torch', torch.__version__, 'transformers', transformers.__version__)"

if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import torch, sys; ok = torch.cuda.is_available(); print('CUDA:', torch.cuda.get_device_name(0) if ok else 'none'); sys.exit(0 if ok else 3)"; then
    echo "torch sees no CUDA device: the CUDA checks need a GPU" >&2
    exit 3
fi

# The benchmark first, while the loan is fresh: a SmolLM2-shaped decoding step, HFGenerator
# against the slot generator eager and replaying CUDA graphs, bfloat16, 128 rows of ~1,024 cached
# tokens, sampled from per-row streams at temperature 1, after checking that graphs and eager give
# the same replies (--check-graphs: exit 5 if not, or if no graph was captured). Its table, with
# the bandwidth floor of each row, goes to docs/BENCHMARKS.md.
if [ "$DEVICE" = cuda ]; then
    step 100 "$PYTHON" bench/decode_step.py --device cuda --dtype bfloat16 --rows 128 --context 1024 \
        --new-tokens 16 --reps 2 --temperature 1 --generator hf slots graphs --check-graphs | tee "$OUT/decode_step.md"
    # Replies of spread lengths (5% of the vocabulary ends one): the graphs of the smaller batch
    # buckets a call compacts into, checked against eager, then timed against HFGenerator.
    step 60 "$PYTHON" bench/decode_step.py --device cuda --dtype bfloat16 --rows 128 --context 1024 \
        --new-tokens 48 --stop-share 0.05 --reps 2 --temperature 1 --generator hf graphs --check-graphs \
        | tee "$OUT/decode_step_stops.md"
    # A rollout of issue 73's workload (16 BabyAI tasks x 8 samples, 8 turns, 32 new tokens, every
    # episode in flight) through each backend against per-turn generate (TRL's way), SmolLM2's
    # shape with random weights: its config and tokenizer travel in $WHEELS (gpu-wheels.sh).
    if [ -f "$WHEELS/smollm2-config/config.json" ]; then
        step 100 "$PYTHON" bench/gpu_rollout.py --model "$WHEELS/smollm2-config" --random-weights --device cuda \
            --dtype bfloat16 --reps 1 | tee "$OUT/gpu_rollout.md"
    else
        echo "no $WHEELS/smollm2-config (scripts/gpu-wheels.sh): the rollout benchmark not run" >> "$FAILED"
    fi
fi

GPU=(run.device="$DEVICE" run.dtype=bfloat16)
# Two key/value heads for the four query heads, so that decoding takes the grouped path
# (`grouped_decode_attention` on CUDA, agent/attention.py) as SmolLM2's does.
SHORT=(model.tiny.num_kv_heads=2 model.corpus_episodes=40 warmup.episodes=40 warmup.epochs=1
       algo.tasks_per_step=2 algo.group_size=2 'schedule.horizons=[3]' train.steps=1 train.validate_every=1
       train.save_every=1 eval.episodes=4)
step 150 "${CLI[@]}" train configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" run.output_dir="$OUT" run.name=grpo
# The slot generator end to end: the rollout and validation in continuous turns, each decoding
# step a captured CUDA graph.
step 150 "${CLI[@]}" train configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" rollout.generator=slots \
    run.output_dir="$OUT" run.name=slots
MODEL="$OUT/grpo/checkpoints/step_000001/model"
if [ -d "$MODEL" ]; then
    step 60 "${CLI[@]}" eval --run "$OUT/grpo" --episodes 8 --max-turns 6 --temperature 0 "${GPU[@]}" \
        --json "$OUT/eval.json"
    # The README's "your model on one GPU" command, the step's checkpoint standing in for the
    # user's model: run.device is auto there, so its first line must name the GPU.
    step 90 "${CLI[@]}" train configs/gpu/one_gpu_babyai_grpo.yaml --smoke model.path="$MODEL" \
        run.output_dir="$OUT" | tee "$OUT/one_gpu.log"
    grep -q "^device $DEVICE" "$OUT/one_gpu.log" || echo "the one-GPU recipe did not take $DEVICE" >> "$FAILED"
else
    echo "the GRPO step left no checkpoint: eval and the one-GPU recipe not run" >> "$FAILED"
fi
step 120 "$PYTHON" -m torch.distributed.run --nproc_per_node 1 --master_port 29517 -m agentgym_rl.cli train \
    configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" run.parallel=fsdp run.output_dir="$OUT" run.name=fsdp

PORT=${PORT:-8517}
if [ -d "$MODEL" ] && [ $((BUDGET - SECONDS)) -gt 30 ]; then
    "${CLI[@]}" serve-model "$MODEL" --port "$PORT" --device "$DEVICE" &
    SERVER=$!
    trap 'kill $SERVER 2>/dev/null || true' EXIT
    healthy=no
    while [ $((BUDGET - SECONDS)) -gt 20 ]; do
        "$PYTHON" -c "import httpx; httpx.get('http://127.0.0.1:$PORT/health').raise_for_status()" 2>/dev/null \
            && { healthy=yes; break; }
        sleep 2
    done
    [ "$healthy" = yes ] || echo "serve-model did not answer /health within the budget" >> "$FAILED"
    # float32 on both sides, so that their greedy replies may be compared.
    EVAL=(--policy "$MODEL" --episodes 8 --max-turns 6 --temperature 0 run.device="$DEVICE")
    step 60 "${CLI[@]}" eval "${EVAL[@]}" rollout.generator_url="http://127.0.0.1:$PORT/v1" --json "$OUT/served.json"
    step 60 "${CLI[@]}" eval "${EVAL[@]}" --json "$OUT/local.json"
    if [ -f "$OUT/served.json" ] && [ -f "$OUT/local.json" ]; then
        "$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
served, local = (json.load(open(f"{out}/{name}.json")) for name in ("served", "local"))
same = "the same" if served["success"] == local["success"] else "DIFFERENT (compare the two files)"
print(f"greedy success: served {served['success']}, in process {local['success']}: {same}")
PY
    fi
else
    echo "serve-model and its evals not run (no checkpoint, or under 30 s of BUDGET left)" >> "$FAILED"
fi
if [ -s "$FAILED" ]; then
    echo "GPU check finished in $SECONDS s; these parts failed or did not run:" >&2
    cat "$FAILED" >&2
    exit 1
fi
echo "GPU check finished in $SECONDS s: every part passed"
