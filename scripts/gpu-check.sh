#!/usr/bin/env bash
# The CUDA paths in a few minutes, with the tiny model (docs/SCALING.md, "The GPU check"):
#   1. the project's dependencies from .whl/ (scripts/gpu-wheels.sh), for a machine that
#      reaches no registry and has torch, transformers and peft already;
#   2. torch sees a GPU (the first CUDA call: without one the script stops here, exit 3), then
#      bench/decode_step.py: HFGenerator against the slot generator, eager and as CUDA graphs
#      (checked equal first), bfloat16 (at most 5 minutes), then with replies of spread lengths;
#   3. one GRPO step with run.device=cuda in bfloat16 (warm-up, rollout, update, validation),
#      then the same with rollout.generator=slots (continuous turns over CUDA graphs);
#   4. eval of its checkpoint on the GPU, and the README's one-GPU recipe with --smoke on it;
#   5. torchrun with one process: an NCCL process group, the learner sharded by FSDP2 over it;
#   6. serve-model on the GPU, and a greedy eval through it beside the in-process one.
# Writes under OUT (default runs/gpu-check); every step prints its command and wall time.
# DEVICE=cpu runs the same steps on the CPU (gloo instead of NCCL): a check of the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-runs/gpu-check}
SITE=${SITE:-/tmp/agentgym-rl-site}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"

step() {
    echo "== $*"
    local start=$SECONDS
    "$@"
    echo "== done in $((SECONDS - start)) s"
}

if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    step "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
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
# tokens, after checking that graphs and eager give the same replies (--check-graphs: exit 5 if
# not, or if no graph was captured). Its table goes to docs/BENCHMARKS.md; a failure here does not
# stop the checks.
if [ "$DEVICE" = cuda ]; then
    step timeout 300 "$PYTHON" bench/decode_step.py --device cuda --dtype bfloat16 --rows 128 --context 1024 \
        --new-tokens 16 --reps 2 --generator hf slots graphs --check-graphs | tee "$OUT/decode_step.md" \
        || echo "decode_step.py failed" >&2
    # Replies of spread lengths (5% of the vocabulary ends one): the graphs of the smaller batch
    # buckets a call compacts into, checked against eager, then timed against HFGenerator.
    step timeout 150 "$PYTHON" bench/decode_step.py --device cuda --dtype bfloat16 --rows 128 --context 1024 \
        --new-tokens 48 --stop-share 0.05 --reps 2 --generator hf graphs --check-graphs \
        | tee "$OUT/decode_step_stops.md" || echo "decode_step.py --stop-share failed" >&2
fi

GPU=(run.device="$DEVICE" run.dtype=bfloat16)
# Two key/value heads for the four query heads, so that decoding takes the grouped path
# (`grouped_decode_attention` on CUDA, agent/attention.py) as SmolLM2's does.
SHORT=(model.tiny.num_kv_heads=2 model.corpus_episodes=40 warmup.episodes=40 warmup.epochs=1
       algo.tasks_per_step=2 algo.group_size=2 'schedule.horizons=[3]' train.steps=1 train.validate_every=1
       train.save_every=1 eval.episodes=4)
step "${CLI[@]}" train configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" run.output_dir="$OUT" run.name=grpo
# The slot generator end to end: the rollout and validation in continuous turns, each decoding
# step a captured CUDA graph. A failure is reported and does not stop the checks.
step "${CLI[@]}" train configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" rollout.generator=slots \
    run.output_dir="$OUT" run.name=slots || echo "the GRPO step with rollout.generator=slots failed" >&2
step "${CLI[@]}" eval --run "$OUT/grpo" --episodes 8 --max-turns 6 --temperature 0 "${GPU[@]}" --json "$OUT/eval.json"
# The README's "your model on one GPU" command, the step's checkpoint standing in for the user's
# model: run.device is auto there, so its first line must name the GPU.
step "${CLI[@]}" train configs/gpu/one_gpu_babyai_grpo.yaml --smoke model.path="$OUT/grpo/checkpoints/step_000001/model" \
    run.output_dir="$OUT" | tee "$OUT/one_gpu.log"
grep -q "^device $DEVICE" "$OUT/one_gpu.log" || { echo "the one-GPU recipe did not take $DEVICE" >&2; exit 4; }
step "$PYTHON" -m torch.distributed.run --nproc_per_node 1 --master_port 29517 -m agentgym_rl.cli train \
    configs/babyai_grpo.yaml "${GPU[@]}" "${SHORT[@]}" run.parallel=fsdp run.output_dir="$OUT" run.name=fsdp

MODEL="$OUT/grpo/checkpoints/step_000001/model"
PORT=${PORT:-8517}
"${CLI[@]}" serve-model "$MODEL" --port "$PORT" --device "$DEVICE" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do
    "$PYTHON" -c "import httpx; httpx.get('http://127.0.0.1:$PORT/health').raise_for_status()" 2>/dev/null && break
    sleep 2
done
# float32 on both sides, so that their greedy replies may be compared.
EVAL=(--policy "$MODEL" --episodes 8 --max-turns 6 --temperature 0 run.device="$DEVICE")
step "${CLI[@]}" eval "${EVAL[@]}" rollout.generator_url="http://127.0.0.1:$PORT/v1" --json "$OUT/served.json"
step "${CLI[@]}" eval "${EVAL[@]}" --json "$OUT/local.json"
"$PYTHON" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
served, local = (json.load(open(f"{out}/{name}.json")) for name in ("served", "local"))
same = "the same" if served["success"] == local["success"] else "DIFFERENT (compare the two files)"
print(f"greedy success: served {served['success']}, in process {local['success']}: {same}")
EOF
echo "GPU check finished"
