"""A SmolLM2 rollout of BabyAI episodes through each generator backend against per-turn
`generate` (TRL's way without vLLM): the same engine, environments, tasks and dtype, only
generation differing. Written for a GPU loan (`--device cuda`); it runs on the CPU too.

Run by hand; its table goes into docs/BENCHMARKS.md with the date and machine.

    python bench/gpu_rollout.py [--model smollm2-135m-instruct] [--random-weights] [--device cuda]
                                [--dtype bfloat16] [--tasks 16] [--samples 8] [--turns 8] [--new-tokens 32]
                                [--arms hf slots per-turn] [--reps 2]

The workload is issue 73's: BabyAI training items with the actions listed, `--tasks` x `--samples`
episodes from per-episode streams at temperature 1, `--turns` turns of replies of at most
`--new-tokens` tokens, every episode in flight at once. Arms:
- `hf`, `slots`: `rollout.generator` (the slot generator replays CUDA graphs on a GPU and plays
  continuous turns), as a training run builds them (`rollout.backends.model_policy`);
- `per-turn`: each turn, every episode's whole history left-padded into one `model.generate` call
  (sampling at the temperature with top-k 0 and top-p 1, the end of turn as EOS), no cache kept
  between turns, no logprobs: what TRL 1.16's `GRPOTrainer._generate_single_turn` does each turn
  of its multi-turn loop, written here without TRL, which does not travel to the GPU machines
  (bench/rollout_vs_trl.py times TRL's own call on the CPU).
Each arm's policy is built once and plays one turn of every episode before the timed runs (a slot
generator's cache allocated, its CUDA graphs captured); per-turn `generate` runs transformers' own
`sdpa` attention, the backends the project's. `--random-weights` keeps the model folder's config
and tokenizer and draws new weights (so only the tokenizer travels): replies then run to
`--new-tokens` and every action is refused, a heavier workload than a trained model's but the
same for every arm. Columns: the rollout's
seconds, generated tokens a second and that as a multiple of `per-turn`'s; medians of `--reps`
interleaved repetitions.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from agentgym_rl.agent.attention import use_grouped_attention
from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.generator import Generation
from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.rollout.backends import model_policy, reply_stop_ids
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import ModelPolicy
from random_model import random_model  # bench/ is on the path: the script's own folder

ARMS = ("hf", "slots", "per-turn")


class PerTurnGenerate:
    """Every turn from scratch: all prompts left-padded into one `model.generate` call, each
    completion cut after its first stop id; no KV cache kept across turns, no logprobs."""

    def __init__(self, model, pad_id: int, stop_ids: list[int], temperature: float):
        self.model, self.pad_id, self.stop_ids, self.temperature = model, pad_id, list(stop_ids), temperature

    def generate(self, prompts: list[list[int]], max_new_tokens: int, streams: list[int] | None = None
                 ) -> list[Generation]:
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=self.temperature,
                                      top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids,
                                      pad_token_id=self.pad_id)
        return [cut(row, set(self.stop_ids)) for row in out[:, width:].tolist()]

    def sync_weights(self, model) -> None:
        pass


def cut(ids: list[int], stops: set[int]) -> Generation:
    """A completion up to and with its first stop id (padding after it dropped)."""
    for i, token in enumerate(ids):
        if token in stops:
            return Generation(ids[:i + 1], [0.0] * (i + 1), True)
    return Generation(ids, [0.0] * len(ids), False)


def load(folder, dtype: str, device: str, random_weights: bool):
    from agentgym_rl.agent.loading import load_model_and_tokenizer, load_tokenizer, resolve_device

    if random_weights:
        model, tokenizer = random_model(Path(folder) / "config.json", dtype), load_tokenizer(folder)
    else:
        model, tokenizer = load_model_and_tokenizer(folder, dtype)
    return model.to(resolve_device(device)).eval(), tokenizer


def rollout_settings(arm: str, episodes: int, args) -> RolloutConfig:
    return RolloutConfig(max_new_tokens=args.new_tokens, max_context=args.max_context, max_envs=episodes,
                         generator="hf" if arm == "per-turn" else arm)


def arm_policy(arm: str, model, tokenizer, episodes: int, args) -> ModelPolicy:
    """The arm's policy, built once and reused by every repetition (the engine resets it):
    a slot generator's cache is allocated, and its graphs captured, before the timing."""
    if arm != "per-turn":
        return model_policy(model, tokenizer, 1.0, rollout_settings(arm, episodes, args))
    encoder = ChatEncoder(tokenizer)
    return ModelPolicy(PerTurnGenerate(model, tokenizer.pad_token_id, reply_stop_ids(encoder, []), 1.0), encoder)


def attend_for(arm: str, model) -> None:
    """Per-turn `generate` runs transformers' own attention, as TRL does; the backends run the
    one they install (`agent.attention`), set again since the arms share the model."""
    if arm == "per-turn":
        model.set_attn_implementation("sdpa")
    else:
        use_grouped_attention(model)


def play(arm: str, policy: ModelPolicy, model, tasks, turns: int, args) -> dict:
    rollout = rollout_settings(arm, len(tasks) * args.samples, args)
    engine = RolloutEngine(registry.env_factory("babyai", {"list_actions": True}), rollout)
    attend_for(arm, model)
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    try:
        synchronize()
        began = time.perf_counter()
        trajectories = engine.run(tasks, policy, turns, samples=args.samples, sampling_seed=args.seed)
        synchronize()
        seconds = time.perf_counter() - began
    finally:
        engine.close()
    generated = sum(sum(t.loss_mask) for t in trajectories)
    return {"seconds": seconds, "tokens_per_s": generated / seconds, "turns": sum(t.turns for t in trajectories)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a named model, .gguf file or model folder")
    parser.add_argument("--random-weights", action="store_true", help="the folder's config and tokenizer, new weights")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if "per-turn" not in args.arms:
        parser.error("--arms must include per-turn: every figure is a multiple of it")
    from agentgym_rl.agent.models import model_folder

    model, tokenizer = load(model_folder(args.model), args.dtype, args.device, args.random_weights)
    tasks = registry.tasks("babyai", "train")[:args.tasks]
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    policies = {arm: arm_policy(arm, model, tokenizer, len(tasks) * args.samples, args) for arm in args.arms}
    for arm in args.arms:  # one turn of every episode first: allocation, kernels and graphs outside the timing
        play(arm, policies[arm], model, tasks, 1, args)
    for rep in range(args.reps):
        for arm in (args.arms if rep % 2 == 0 else reversed(args.arms)):
            results[arm].append(play(arm, policies[arm], model, tasks, args.turns, args))
            print(f"  rep {rep} {arm}: {results[arm][-1]['seconds']:.1f} s", flush=True)
    where = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else platform.processor()
    print(f"\nmachine: {where or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; {args.model}"
          f"{' (random weights)' if args.random_weights else ''}, {args.dtype}; BabyAI train items, listed actions, "
          f"{args.tasks} tasks x {args.samples} samples, at most {args.turns} turns, {args.new_tokens} new tokens, "
          f"T 1; medians of {args.reps}")
    base = statistics.median(r["tokens_per_s"] for r in results["per-turn"])
    print("| generator | rollout (s) | turns played | generated tokens/s | x per-turn |")
    print("|---|---|---|---|---|")
    for arm, runs in results.items():
        speed = statistics.median(r["tokens_per_s"] for r in runs)
        print(f"| {arm} | {statistics.median(r['seconds'] for r in runs):.1f} | {runs[0]['turns']} | {speed:.0f} "
              f"| {speed / base:.2f} |")


if __name__ == "__main__":
    main()
