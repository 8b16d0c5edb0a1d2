#!/usr/bin/env bash
# A model zero-shot on the environments' test splits, greedy, at the system's turn limits
# (docs/RESULTS.md, "SmolLM2-135M-Instruct zero-shot"), in three reply modes:
#   free      the environment's ReAct instruction as a system message, replies as the model writes them
#   prefixed  every reply continues from "Action:" (context, not trained): what the RL recipes start from
#   listed    replies restricted to "Action: A" for a listed action A (constrained decoding)
# free and prefixed go through `bench-agent` (its table.md: success, turns, invalid actions, time,
# peak memory; a rerun plays only the items not yet played), listed through `eval
# --listed-actions-only` on the environments that list their actions.
#   MODEL     a named model, .gguf file or model folder (default smollm2-135m-instruct)
#   ENVS      comma-separated environment ids (default babyai,textcraft)
#   MODES     default "free prefixed listed"
#   EPISODES  items of each split, stratified over its categories (default 0: the whole split)
#   DEVICE    cpu (default) or cuda
#   OUT       output folder (default runs/zero-shot): OUT/MODE/ENVS/ (bench-agent's, so that a rerun
#             of the same environments plays only what is missing) and OUT/listed/ENV.json
#   KEEP      a folder that receives each mode's table (a GPU machine's $OUT)
# Arguments are more overrides (rollout.*, run.*) for every command.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/agentgym-rl-site}
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" \
    || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
CLI=("$PYTHON" -m agentgym_rl.cli)
MODEL=${MODEL:-smollm2-135m-instruct}
ENVS=${ENVS:-babyai,textcraft}
MODES=${MODES:-free prefixed listed}
EPISODES=${EPISODES:-0}
DEVICE=${DEVICE:-cpu}
OUT=${OUT:-runs/zero-shot}
if [ -d "$MODEL" ]; then FOLDER=$MODEL; else FOLDER=$("${CLI[@]}" models prepare "$MODEL"); fi
COMMON=(run.device="$DEVICE" rollout.system_prompt=true "$@")
for mode in $MODES; do
    start=$SECONDS
    case $mode in
        free | prefixed)
            prefix=()
            [ "$mode" = prefixed ] && prefix=('rollout.reply_prefix="Action:"')
            # BabyAI lists its actions in every observation, as the SmolLM2 recipe has it.
            folder="$OUT/$mode/${ENVS//,/_}"
            "${CLI[@]}" bench-agent "$FOLDER" --envs "$ENVS" --samples 0 --episodes "$EPISODES" \
                --out "$folder" 'suite.env_kwargs={babyai: {list_actions: true}}' "${COMMON[@]}" "${prefix[@]}"
            [ -z "${KEEP:-}" ] || cp "$folder/table.md" "$KEEP/$mode-${ENVS//,/_}.md"
            ;;
        listed)
            for env in ${ENVS//,/ }; do
                turns=$("$PYTHON" -c "from agentgym_rl.config.evaluation import SYSTEM_TURN_LIMITS as L; print(L['$env'])")
                args=(--env "$env" --max-turns "$turns" --temperature 0 --listed-actions-only
                      --json "$OUT/listed/$env.json" --trajectories "$OUT/listed/$env.jsonl")
                [ "$EPISODES" = 0 ] || args+=(--episodes "$EPISODES")
                [ "$env" = babyai ] && args+=(--env-arg list_actions=true)
                "${CLI[@]}" eval --policy "$FOLDER" "${args[@]}" "${COMMON[@]}" \
                    || echo "== $env: no listed-actions evaluation (exit $?)"
                [ -z "${KEEP:-}" ] || [ ! -f "$OUT/listed/$env.json" ] || cp "$OUT/listed/$env.json" "$KEEP/listed-$env.json"
            done
            ;;
        *) echo "unknown mode $mode (free, prefixed, listed)" >&2; exit 2 ;;
    esac
    echo "== $mode: $((SECONDS - start)) s"
done
