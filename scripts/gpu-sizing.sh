#!/usr/bin/env bash
# A one-GPU recipe sized on the card it is written for (docs/SCALING.md, "The GPU check"): a model
# of a shipped shape (MODEL_CONFIG, default Qwen2.5-1.5B-Instruct's) with random weights, written
# by bench/random_model.py with SmolLM2's tokenizer (carried in $WHEELS/smollm2-config by
# scripts/gpu-wheels.sh), then STEPS GRPO steps of RECIPE as it is (16 tasks x 8, float32
# parameters, every episode in flight), without validation, every row updated though random
# replies tie at reward 0 (algo.skip_zero_advantage=false); then the steps' peak GPU memory
# (memory/device_peak_gb, and what the allocator held: memory/device_reserved_gb; the CUDA
# context's few hundred MB come on top) against the card's, and their times. Random replies run to the token
# limit and every action is refused, so the episodes are as long as the horizon allows: an upper
# bound on a trained model's.
# Run scripts/gpu-check.sh first on the same machine: it installs the dependencies (SITE).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/agentgym-rl-site}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-runs/gpu-sizing}
DEVICE=${DEVICE:-cuda}
MODEL_CONFIG=${MODEL_CONFIG:-configs/gpu/models/qwen2.5-1.5b-instruct.json}
RECIPE=${RECIPE:-configs/gpu/one_gpu_babyai_grpo.yaml}
STEPS=${STEPS:-1}
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" \
    || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
MODEL=${MODEL:-/tmp/random-model}
mkdir -p "$OUT"
start=$SECONDS
timeout 300 "$PYTHON" bench/random_model.py "$MODEL_CONFIG" --tokenizer "$WHEELS/smollm2-config" --out "$MODEL" \
    --device "$DEVICE"
echo "== random model written in $((SECONDS - start)) s"
start=$SECONDS
status=0
timeout 480 "$PYTHON" -m agentgym_rl.cli train "$RECIPE" model.path="$MODEL" run.device="$DEVICE" \
    train.steps="$STEPS" eval.episodes=0 train.save_every=0 algo.skip_zero_advantage=false run.output_dir="$OUT" \
    run.name=sizing --overwrite \
    || status=$?
echo "== $STEPS step(s) of $RECIPE ended after $((SECONDS - start)) s (exit $status)"
METRICS="$OUT/sizing/metrics.jsonl"
[ -f "$METRICS" ] || { echo "no $METRICS: the step did not finish" >&2; exit "$((status > 0 ? status : 1))"; }
"$PYTHON" - "$METRICS" "$DEVICE" <<'PY'
import json, sys
import torch
rows = [json.loads(line) for line in open(sys.argv[1]) if '"time/step_s"' in line]
card = torch.cuda.get_device_properties(0).total_memory / 1e9 if sys.argv[2] == "cuda" else float("nan")
nan = float("nan")
for row in rows:
    print(f"step {row['step']}: tensors at most {row.get('memory/device_peak_gb', nan):.1f} GB, the allocator "
          f"{row.get('memory/device_reserved_gb', nan):.1f} GB, of the card's {card:.0f}; "
          f"rollout {row['time/rollout_s']:.1f} s, update {row['time/update_s']:.1f} s, "
          f"{row['train/turns']:.1f} turns an episode, {row['train/reply_tokens']:.1f} tokens a reply")
PY
exit "$status"
