"""Long SciWorld episodes with and without context management (`rollout.keep_turns`,
`window_turns`, `summarize`): what the rollout holds, what training reads, and what each costs.

Run by hand on a quiet machine; its table goes into docs/BENCHMARKS.md with the date and machine.
Each setting runs in a process of its own, so that its peak memory is its own:

    python bench/context_windows.py [--model smollm2-135m-instruct] [--env sciworld] [--episodes 4]
                                    [--turns 30] [--new-tokens 32] [--list-actions] [--settings NAME ...]

Per setting: greedy episodes of the test split's first items, then one scoring pass with its
backward (`learner.token_outputs`, a row at a time, with gradient checkpointing, as the SmolLM2
recipes' micro-batches would) over them. Columns: mean turns; context windows an episode;
tokens an episode (its windows back to back: what training reads); the longest window (the most
a prompt held: what the KV cache and attention grow with); seconds of rollout and of scoring; the
process' peak resident memory after the rollout and after scoring (the Python process: a
SciWorld JVM is not counted).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SETTINGS = {
    "whole": {},
    "keep 4": {"keep_turns": 4},
    "keep 4, window 8": {"keep_turns": 4, "window_turns": 8},
    "keep 4, window 8, summaries": {"keep_turns": 4, "window_turns": 8, "summarize": True, "summary_tokens": 64},
}


def measure(args: argparse.Namespace, setting: str) -> dict:
    from agentgym_rl.agent.loading import load_model_and_tokenizer
    from agentgym_rl.agent.models import model_folder
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.eval.evaluate import evaluate
    from agentgym_rl.train.batch import collate
    from agentgym_rl.train.learner import token_outputs

    path = model_folder(args.model, log=lambda _: None)
    rollout = RolloutConfig(max_new_tokens=args.new_tokens, max_context=32768, system_prompt=True,
                            **SETTINGS[setting])
    began = time.perf_counter()
    _, played = evaluate(args.env, str(path), split="test", episodes=args.episodes, max_turns=args.turns,
                         temperature=0.0, progress=False, rollout=rollout,
                         env_kwargs={"list_actions": True} if args.list_actions else None)
    rollout_s = time.perf_counter() - began
    rollout_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    model, tokenizer = load_model_and_tokenizer(path)
    model.gradient_checkpointing_enable()
    model.train()
    began = time.perf_counter()
    for trajectory in played:
        batch = collate([trajectory], tokenizer.pad_token_id)
        token_outputs(model, batch, positions=batch.loss_mask > 0).logprobs.sum().backward()
    model.zero_grad(set_to_none=True)
    scoring_s = time.perf_counter() - began
    return {"setting": setting, "episodes": len(played),
            "turns": sum(t.turns for t in played) / len(played),
            "tokens": sum(len(t.input_ids) for t in played) / len(played),
            "longest_window": max(end - start for t in played for start, end in t.windows()),
            "windows": sum(len(t.windows()) for t in played) / len(played),
            "success": sum(t.success for t in played) / len(played),
            "rollout_s": rollout_s, "scoring_s": scoring_s, "rollout_mb": rollout_mb,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="sciworld")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--list-actions", action="store_true", help="BabyAI: observations list every action")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--setting", choices=sorted(SETTINGS), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.setting:
        print(json.dumps(measure(args, args.setting)))
        return
    rows = []
    for setting in args.settings:
        command = [sys.executable, __file__, "--setting", setting, *(["--list-actions"] if args.list_actions else []),
                   "--model", args.model, "--env", args.env, "--episodes", str(args.episodes), "--turns",
                   str(args.turns), "--new-tokens", str(args.new_tokens)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{setting}: {done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{setting}: done", file=sys.stderr)
    print(f"| setting | episodes | mean turns | windows | tokens an episode | longest window | success | rollout s | "
          f"scoring s | peak MB, rollout | peak MB, scoring |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['setting']} | {row['episodes']} | {row['turns']:.1f} | {row['windows']:.1f} | {row['tokens']:.0f} "
              f"| {row['longest_window']} | {row['success']:.0%} | {row['rollout_s']:.1f} | {row['scoring_s']:.1f} "
              f"| {row['rollout_mb']:.0f} | {row['peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
