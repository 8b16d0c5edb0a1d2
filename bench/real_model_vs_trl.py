"""One GRPO iteration of SmolLM2-135M-Instruct on BabyAI side by side with TRL 1.16: episodes per
hour of rollout and update together, and each process's peak memory; with our generation against
a forward-only floor.

Run by hand (`make bench` installs the `bench` extra, TRL itself); its table goes into
docs/BENCHMARKS.md with the date and machine. Each arm runs in its own process (its peak RSS is
its own), arms interleaved in every repetition.

    python bench/real_model_vs_trl.py [--reps 3] [--tasks 4] [--samples 4] [--turns 4] [--rollout-threads 1]
                                      [--ours KEY=VALUE ...]

Arms, on the same tasks (TRL plays the items our run sampled), samples, turns and prompts (the
recipe's system prompt, listed actions and "Action:" reply prefix, 16-token replies):
- ours: `agentgym-rl train configs/smollm2_babyai_grpo.yaml` for one step, the recipe's defaults
  (gradient checkpointing, micro-batches by token budget, logits in chunks at the trained
  positions only, a group's shared prompt run once, the old logprobs taken from the one
  optimizer step's own pass, memory setting "auto"), updating on every episode
  (`algo.skip_zero_advantage=false`: the instruct model's groups often tie, and a skipped update
  would look free).
- TRL 1.16: a real `GRPOTrainer` with its defaults (gradient checkpointing, 8 rows a micro-batch,
  loss "dapo", no old logprobs at one iteration) except float32 instead of bfloat16 (as ours:
  this CPU has no bfloat16 arithmetic) and the completion length: its generation
  (`_generate_single_turn`, the whole prefix every turn) played through our rollout engine,
  then one optimizer step of its `_compute_loss` over the episodes as its multi-turn path lays
  them out (bench/update_vs_trl.py), with each episode's group-normalised reward as advantage.
- floor: one no-grad forward pass over our arm's final episodes, sorted by length and 8 a batch.
With `--rollout-threads N` both sides generate on N threads (ours: `rollout.threads`; TRL: torch
pinned while it generates) and update at torch's default count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "configs" / "smollm2_babyai_grpo.yaml"


def measured(command: list[str], log: Path) -> tuple[str, float]:
    """Run `command` under /usr/bin/time -v; (its output, peak RSS in GB)."""
    with log.open("w") as sink:
        result = subprocess.run(["/usr/bin/time", "-v", *command], stdout=sink, stderr=subprocess.STDOUT, cwd=REPO)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        raise SystemExit(f"{command[:4]} failed; see {log}")
    return text, int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1e6


def ours(args, out: Path) -> dict:
    command = [sys.executable, "-m", "agentgym_rl.cli", "train", str(RECIPE), "train.steps=1",
               "train.validate_every=0", "eval.episodes=0", f"schedule.horizons=[{args.turns}]",
               f"algo.tasks_per_step={args.tasks}", f"algo.group_size={args.samples}",
               f"algo.minibatch_size={args.tasks * args.samples}", "algo.skip_zero_advantage=false",
               f"run.output_dir={out}", "run.name=ours", "--overwrite"]
    if args.rollout_threads:
        command.append(f"rollout.threads={args.rollout_threads}")
    command += args.ours
    _, peak = measured(command, out / "ours.log")
    step = next(json.loads(line) for line in (out / "ours" / "metrics.jsonl").read_text().splitlines()
                if "time/rollout_s" in line)
    return {"rollout_s": step["time/rollout_s"], "update_s": step["time/update_s"], "peak_gb": peak,
            "trajectories": str(next((out / "ours" / "trajectories").glob("*.jsonl")))}


def trl(args, trajectories: str, out: Path) -> dict:
    text, peak = measured([sys.executable, __file__, "--child", "trl", "--trajectories", trajectories,
                           "--turns", str(args.turns), "--rollout-threads", str(args.rollout_threads)],
                          out / "trl.log")
    return {**json.loads(text.split("RESULT ")[1].splitlines()[0]), "peak_gb": peak}


def floor(trajectories: str, out: Path) -> float:
    text, _ = measured([sys.executable, __file__, "--child", "floor", "--trajectories", trajectories], out / "floor.log")
    return json.loads(text.split("RESULT ")[1].splitlines()[0])["floor_s"]


def _records(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def child_floor(path: str) -> None:
    import torch

    from agentgym_rl.agent.loading import load_model_and_tokenizer
    from agentgym_rl.config import RLConfig, load_config

    config = load_config(RLConfig, RECIPE)
    model, tokenizer = load_model_and_tokenizer(config.model.path)
    rows = sorted((r["input_ids"] for r in _records(path)), key=len)
    began = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(rows), 8):
            batch = rows[start:start + 8]
            width = max(map(len, batch))
            ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in batch])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch])
            model(input_ids=ids, attention_mask=mask)
    print("RESULT " + json.dumps({"floor_s": time.perf_counter() - began}), flush=True)


def child_trl(path: str, turns: int, threads: int) -> None:
    import torch
    from rollout_vs_trl import TRLGenerator
    from update_vs_trl import trl_inputs

    from agentgym_rl.agent.chat import ChatEncoder
    from agentgym_rl.agent.loading import load_model_and_tokenizer
    from agentgym_rl.algos.advantages import grpo_advantages
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.envs import registry
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.policy import ModelPolicy

    config = load_config(RLConfig, RECIPE)
    ours_played = _records(path)
    items = [r["item_id"] for r in ours_played]
    by_item = {t.item_id: t for t in registry.tasks(config.env.id, config.env.train_split, config.env.kwargs)}
    picked = [by_item[item] for item in dict.fromkeys(items)]
    samples = len(items) // len(picked)
    model, tokenizer = load_model_and_tokenizer(config.model.path)
    encoder = ChatEncoder(tokenizer)
    trainer = trl_trainer_defaults(model, tokenizer, [encoder.end_of_turn_id], config.rollout.max_new_tokens,
                                   samples, len(items))
    engine = RolloutEngine(registry.env_factory(config.env.id, config.env.kwargs), config.rollout)
    torch.manual_seed(0)
    began = time.perf_counter()
    with engine:
        played = engine.run(picked, ModelPolicy(TRLGenerator(trainer, threads), encoder), turns, samples)
    rollout_s = time.perf_counter() - began
    began = time.perf_counter()
    rewards = torch.tensor([sum(t.turn_rewards) for t in played], dtype=torch.float32)
    advantages = grpo_advantages(rewards, torch.tensor([t.group for t in played]))[0]
    kept = [i for i, t in enumerate(played) if sum(t.loss_mask)]  # a row with no generated token has no loss
    played, advantages = [played[i] for i in kept], advantages[kept]
    inputs = trl_inputs(played, advantages, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=trainer.args.learning_rate)
    micro = trainer.args.per_device_train_batch_size
    model.train()
    for start in range(0, len(played), micro):
        part = {k: v[start:start + micro] if v.dim() else v for k, v in inputs.items()}
        trainer._compute_loss(model, part).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
    optimizer.step()
    update_s = time.perf_counter() - began
    generated = sum(sum(t.loss_mask) for t in played)
    print("RESULT " + json.dumps({"rollout_s": rollout_s, "update_s": update_s, "episodes": len(items),
                                  "generated": generated,
                                  "self_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}),
          flush=True)


def trl_trainer_defaults(model, tokenizer, stop_ids: list[int], max_new_tokens: int, samples: int, rows: int):
    """`GRPOTrainer` with TRL's defaults but for the CPU, float32, the completion length and the
    batch: `samples` generations a task, `rows` of them in one optimizer step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", bf16=False,
                      num_generations=samples, max_completion_length=max_new_tokens,
                      per_device_train_batch_size=min(8, rows), gradient_accumulation_steps=max(1, rows // 8),
                      generation_batch_size=rows)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["unused"] * rows}), processing_class=tokenizer)
    trainer.eos_token_ids = list(stop_ids)
    trainer.generation_kwargs["eos_token_id"] = trainer.generation_config.eos_token_id = list(stop_ids)
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    # `Trainer.train` turns gradient checkpointing on; this bench calls the loss itself.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
    model.config.use_cache = False
    return trainer


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rollout-threads", type=int, default=0,
                        help="threads both sides generate on (0: each side's default)")
    parser.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for our arm only (repeatable), e.g. run.malloc_mmap_threshold_kb=16384")
    parser.add_argument("--child", choices=["trl", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--trajectories", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "trl":
        return child_trl(args.trajectories, args.turns, args.rollout_threads)
    if args.child == "floor":
        return child_floor(args.trajectories)
    runs: dict[str, list[dict]] = {"ours": [], "TRL 1.16": []}
    floors = []
    for rep in range(args.reps):
        out = Path(tempfile.mkdtemp(prefix=f"real_vs_trl_{rep}_"))
        mine = ours(args, out)
        theirs = trl(args, mine["trajectories"], out)
        floors.append(floor(mine["trajectories"], out))
        runs["ours"].append(mine)
        runs["TRL 1.16"].append(theirs)
        episodes = args.tasks * args.samples
        print(f"  rep {rep}: ours rollout {mine['rollout_s']:.0f} s, update {mine['update_s']:.0f} s, "
              f"{mine['peak_gb']:.2f} GB; TRL rollout {theirs['rollout_s']:.0f} s, update {theirs['update_s']:.0f} s, "
              f"{theirs['peak_gb']:.2f} GB; floor {floors[-1]:.1f} s ({episodes} episodes)", flush=True)
    episodes = args.tasks * args.samples
    rows = []
    for arm, results in runs.items():
        per_hour = [3600 * episodes / (r["rollout_s"] + r["update_s"]) for r in results]
        vs = [(t["rollout_s"] + t["update_s"]) / (r["rollout_s"] + r["update_s"])
              for r, t in zip(results, runs["TRL 1.16"])]
        over_floor = [r["rollout_s"] / f for r, f in zip(results, floors)]
        rows.append(f"| {arm} | {spread(per_hour)} | {spread(vs, 2)}× | {spread([r['rollout_s'] for r in results])} s "
                    f"| {spread([r['update_s'] for r in results])} s | {spread([r['peak_gb'] for r in results], 2)} GB "
                    f"| {spread(over_floor, 2)}× |")
    import torch

    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; SmolLM2-135M-Instruct "
          f"float32, BabyAI, {args.tasks} tasks × {args.samples} samples, {args.turns} turns, generating on "
          f"{args.rollout_threads or 'the default number of'} thread(s); median (min–max) of "
          f"{args.reps} interleaved repetitions" + (f"; ours with {' '.join(args.ours)}" if args.ours else ""))
    print("| arm | episodes / hour (rollout + update) | vs TRL (within rep) | rollout | update | peak RSS | "
          "rollout / forward-only floor |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
