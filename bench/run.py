"""Throughput benchmarks of the pieces a CPU training run spends its time in.

Run by hand (`make bench`); copy the printed table into docs/BENCHMARKS.md with the date
and machine. Nothing here is asserted in tests.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.envs import make, tasks
from agentgym_rl.train.learner import token_logprobs
from agentgym_rl.train.demonstrations import collect_expert, conversation_text
from agentgym_rl.agent.tiny import train_tokenizer


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def cache_rows(model, params: int) -> list[tuple[str, str]]:
    """Greedy sampling with transformers' DynamicCache (torch.cat every step) vs ours (in place)."""
    from transformers import GenerationConfig
    from transformers.cache_utils import DynamicCache

    from agentgym_rl.agent.kv_cache import appending_cache

    config = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=[], pad_token_id=0)
    ids = torch.full((64, 1024), 5)
    rows = []
    for name, make_cache in [("DynamicCache", DynamicCache), ("appending cache", lambda: appending_cache(model.config))]:
        with torch.no_grad():
            seconds = timed(lambda: model.generate(ids, generation_config=config, past_key_values=make_cache()), 2)
        rows.append((f"tiny model ({params / 1e6:.2f}M) greedy 24 tokens, batch 64 × context 1024, {name}",
                     f"{seconds:.2f} s"))
    return rows


def padding_rows(model) -> list[tuple[str, str]]:
    """Forward+backward over right-padded rows of rollout-like lengths, with the padding mask
    given to the model vs left out (what `token_outputs` does for a right-padded batch)."""
    lengths = [400, 800, 1200, 1600, 2000, 2400, 2800, 3100]
    ids = torch.randint(5, 400, (len(lengths), max(lengths)))
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
    rows = []
    for name, inputs in [("with its padding mask", {"attention_mask": mask}), ("mask left out", {})]:
        seconds = timed(lambda: model(input_ids=ids, **inputs).logits.sum().backward(), 2)
        rows.append((f"forward+backward, 8 right-padded rows of 400-3100 tokens, {name}", f"{seconds:.2f} s"))
    return rows


def main() -> None:
    rows = []
    env = make("babyai")
    items = [t.index for t in tasks("babyai", "train")[:200]]

    def resets():
        for i in items:
            env.reset(i)
    rows.append(("BabyAI reset", f"{len(items) / timed(resets, 1):.0f} resets/s"))

    began = time.perf_counter()
    demos = collect_expert("babyai", "train", 100)
    seconds = time.perf_counter() - began
    steps = sum(t.turns for t in demos)
    rows.append(("BabyAI expert episodes (100, train)", f"{100 / seconds:.1f} episodes/s, {steps / seconds:.0f} turns/s"))

    tokenizer = train_tokenizer(conversation_text(demos), 1024)
    model = build_model(tokenizer, TinyModelConfig()).eval()
    params = sum(p.numel() for p in model.parameters())
    generator = HFGenerator(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], 1.0)
    for batch, context in [(64, 256), (64, 1024), (16, 2048)]:
        prompts = [[5] * context for _ in range(batch)]
        seconds = timed(lambda: generator.generate(prompts, 24), 2)
        rows.append((f"tiny model ({params / 1e6:.2f}M) sample 24 tokens, batch {batch} × context {context}",
                     f"{seconds:.2f} s ({batch * 24 / seconds:.0f} new tokens/s)"))
    rows += cache_rows(model, params)
    model.train()
    rows += padding_rows(model)
    for batch, length in [(16, 512), (8, 2048)]:
        ids = torch.randint(5, len(tokenizer), (batch, length))
        batch_dict = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        def step():
            token_logprobs(model, batch_dict).sum().backward()
        seconds = timed(step, 2)
        rows.append((f"forward+backward, batch {batch} × {length} tokens",
                     f"{seconds:.2f} s ({batch * length / seconds:.0f} tokens/s)"))

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| what | measured |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
