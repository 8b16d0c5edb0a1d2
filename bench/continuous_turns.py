"""A rollout of the slot generator in lock-step turns against continuous turns
(`rollout.continuous_turns`): the same episodes, model and streams, only how turns are batched
differing.

Run by hand; its table goes into docs/BENCHMARKS.md with the date and machine.

    python bench/continuous_turns.py [--model smollm2-135m-instruct] [--recipe free] [--tasks 8] [--samples 4]
                                     [--turns 4] [--rows 16] [--reps 2] [--temperature 0.8] [--device cpu]

The workload is a SmolLM2 BabyAI recipe's: `--recipe free` (`configs/smollm2_babyai_grpo_free.yaml`:
the system prompt, the listed actions, one worked example, babyai_91, and 48-token replies) or
`prefix` (`configs/smollm2_babyai_grpo.yaml`: replies of up to 16 tokens continued from
"Action:"); `--tasks` training items x `--samples` samples from per-episode streams, `--rows`
episodes in flight (the slots). `--model` takes a named model, a .gguf file or a model folder
(on a GPU machine, SmolLM2's .gguf, `--device cuda`). In lock-step turns every episode's turn waits for the batch's longest reply and each
turn is one generator call (its rows still replying move into smaller batch buckets as the
others stop); continuously, an episode's next turn, or a waiting episode, takes its row as soon
as its reply ends, in one call for the whole rollout. Columns: the rollout's seconds, generated
tokens a second, decoding steps (forwards of one new token a row) and the rows they ran on
average, the prompt tokens run through the model and those read from a slot's cache instead; medians of `--reps` interleaved repetitions. Both arms' trajectories are checked equal
(each episode samples from its own stream whatever it is batched with).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.rollout.backends import load_model, model_policy
from agentgym_rl.rollout.engine import RolloutEngine


def play(model, tokenizer, tasks, args, continuous: bool) -> dict:
    recipe = ({"max_new_tokens": 48, "example": "babyai_91", "example_turns": 2} if args.recipe == "free"
              else {"max_new_tokens": 16, "reply_prefix": "Action:"})
    rollout = RolloutConfig(max_context=args.max_context, system_prompt=True, max_envs=args.rows, generator="slots",
                            continuous_turns=continuous, **recipe)
    policy = model_policy(model, tokenizer, args.temperature, rollout)
    rows = []
    hook = model.register_forward_pre_hook(
        lambda module, inputs, kwargs: rows.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    engine = RolloutEngine(registry.env_factory("babyai", {"list_actions": True}), rollout)
    try:
        began = time.perf_counter()
        trajectories = engine.run(tasks, policy, args.turns, samples=args.samples, sampling_seed=args.seed)
        seconds = time.perf_counter() - began
    finally:
        hook.remove()
        engine.close()
    generated = sum(sum(t.loss_mask) for t in trajectories)
    return {"seconds": seconds, "tokens_per_s": generated / seconds, "steps": len(rows),
            "rows_per_step": sum(rows) / max(len(rows), 1), "ids": [t.input_ids for t in trajectories],
            "prefilled": policy.generator.prefilled_columns, "reused": policy.generator.reused_columns,
            "turns": sum(len(t.turn_rewards) for t in trajectories)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--recipe", choices=["free", "prefix"], default="free")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16, help="episodes in flight (the slots)")
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from agentgym_rl.agent.models import model_folder

    model, tokenizer = load_model(model_folder(args.model), device=args.device)
    model.eval()
    tasks = registry.tasks("babyai", "train")[:args.tasks]
    results: dict[str, list[dict]] = {"lock-step turns": [], "continuous turns": []}
    for rep in range(args.reps):
        for name in (results if rep % 2 == 0 else reversed(list(results))):
            results[name].append(play(model, tokenizer, tasks, args, name == "continuous turns"))
            print(f"  rep {rep} {name}: {results[name][-1]['seconds']:.1f} s", flush=True)
    lockstep, continuous = results.values()
    same = all(a["ids"] == b["ids"] for a, b in zip(lockstep, continuous))
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.device}; "
          f"{args.model}, the {args.recipe} recipe's replies, BabyAI train items, {args.tasks} tasks x {args.samples} samples, at most {args.turns} turns "
          f"({lockstep[0]['turns']} played), {args.rows} rows, T {args.temperature}; medians of {args.reps}; "
          f"trajectories equal: {same}")
    print("| turns | rollout (s) | generated tokens/s | decoding steps | rows a step | prompt tokens run | read from cache |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r['seconds'] for r in runs):.1f} "
              f"| {statistics.median(r['tokens_per_s'] for r in runs):.1f} | {runs[0]['steps']} "
              f"| {runs[0]['rows_per_step']:.1f} | {runs[0]['prefilled']:,} | {runs[0]['reused']:,} |")
    print(f"continuous / lock-step time: "
          f"{statistics.median(r['seconds'] for r in continuous) / statistics.median(r['seconds'] for r in lockstep):.2f}")


if __name__ == "__main__":
    main()
