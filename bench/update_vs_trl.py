"""One GRPO update side by side: ours against TRL's `GRPOTrainer._compute_loss` on the same
multi-turn episodes, trainable (loss-mask) tokens per second, each figure a median of
interleaved repetitions.

Run by hand (`make bench`, which installs the `bench` extra: TRL itself); its table goes into
docs/BENCHMARKS.md with the date and machine.

    python bench/update_vs_trl.py [--reps 5] [--quick] [--envs babyai textcraft]

The batch: 8 BabyAI (or TextCraft) train tasks × 4 samples played for 8 turns by the untrained
model through our rollout engine, as in `bench/rollout_vs_trl.py`; one fixed advantage per
episode, the sampling logprobs as the old policy's, no KL term (TRL's default beta is 0).

Arms, each one optimizer step (AdamW, gradients clipped at norm 1) over the whole batch in
micro-batches of 8 rows:
- ours: `Learner.update` with the GRPO preset's PPO-clip loss, token-mean (what an RL step
  runs): rows sorted by length into micro-batches, each trimmed of padding and right-padded, so
  no attention mask is built.
- TRL 1.16: a real `GRPOTrainer` (CPU, loss_type "dapo", its default: a token mean over the
  batch) and its `_compute_loss` on the inputs its multi-turn path builds: the first user turn as
  the left-padded prompt, the rest of the episode as the right-padded completion with
  `tool_mask` 0 on the environment's tokens, every row padded to the batch's longest as
  `_generate_and_score_completions` does, micro-batches cut in row order.
Both losses are the token mean of -min(r·A, clip(r)·A) over the generated tokens: the first
repetition checks that they agree (loss and gradient norm) before anything is timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from rollout_vs_trl import build, play, ratio_spread, spread, trl_trainer

from agentgym_rl.algos import LOSS
from agentgym_rl.algos.presets import get_algorithm
from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.tiny import TinyModelConfig
from agentgym_rl.config.sections import OptimConfig
from agentgym_rl.train.batch import TokenBatch, collate, micro_batches
from agentgym_rl.train.learner import Learner, TokenOutputs

MICRO_BATCH = 8


def grpo_loss(batch: TokenBatch, outputs: TokenOutputs) -> tuple[torch.Tensor, dict[str, float]]:
    spec = get_algorithm("grpo")
    return LOSS[spec.policy_loss](outputs.logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask,
                                  clip_eps=spec.clip_eps, aggregation=spec.aggregation, ratio_level=spec.ratio_level)


def ours(model, trajectories, advantages: torch.Tensor, pad_id: int) -> tuple[float, float, float, int]:
    """(seconds, loss, grad norm, tokens run through the model) of one update."""
    learner = Learner(model, OptimConfig(lr=1e-5, micro_batch_size=MICRO_BATCH))
    batch = collate(trajectories, pad_id)
    batch.advantages = advantages[:, None] * batch.loss_mask
    began = time.perf_counter()
    result = learner.update(batch, grpo_loss)
    seconds = time.perf_counter() - began
    cells = sum(micro.input_ids.numel() for _, micro in micro_batches(batch, MICRO_BATCH))
    return seconds, result["loss"], result["grad_norm"], cells


def trl_inputs(trajectories, advantages: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """The tensors TRL's multi-turn GRPO path hands `_compute_loss`, for the whole batch."""
    prompts, completions, tools, olds = [], [], [], []
    for t in trajectories:
        start = t.loss_mask.index(1)  # the first generated token: what precedes it is the prompt
        prompts.append(t.input_ids[:start])
        completions.append(t.input_ids[start:])
        tools.append(t.loss_mask[start:])
        olds.append(t.logprobs[start:])
    p, c = max(map(len, prompts)), max(map(len, completions))

    def left(rows, fill):
        return torch.tensor([[fill] * (p - len(r)) + list(r) for r in rows])

    def right(rows, fill):
        return torch.tensor([list(r) + [fill] * (c - len(r)) for r in rows])

    tool_mask = right(tools, 0)
    return {"prompt_ids": left(prompts, pad_id), "prompt_mask": left([[1] * len(r) for r in prompts], 0),
            "completion_ids": right(completions, pad_id), "completion_mask": right([[1] * len(r) for r in completions], 0),
            "tool_mask": tool_mask, "old_per_token_logps": right(olds, 0.0).float(), "advantages": advantages,
            "num_items_in_batch": tool_mask.sum().float()}


def trl(trainer, model, inputs: dict[str, torch.Tensor]) -> tuple[float, float, float, int]:
    """(seconds, loss, grad norm, tokens run through the model) of one update with TRL's loss."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    rows = inputs["advantages"].shape[0]
    model.train()
    began = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0  # "dapo" divides each micro-batch's sum by the batch's token count: the sum is the mean
    for start in range(0, rows, MICRO_BATCH):
        micro = {k: v[start:start + MICRO_BATCH] if v.dim() else v for k, v in inputs.items()}
        loss = trainer._compute_loss(model, micro)
        loss.backward()
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    seconds = time.perf_counter() - began
    width = inputs["prompt_ids"].shape[1] + inputs["completion_ids"].shape[1]
    return seconds, total, float(grad_norm), rows * width


def measure(label: str, model, tokenizer, env_id: str, reps: int, threads: list[int]) -> list[str]:
    workload = {"task_count": 8, "samples": 4, "turns": 8, "new_tokens": 12}
    trajectories = play("ours", model, tokenizer, env_id, **workload)[3]
    trajectories = [t for t in trajectories if sum(t.loss_mask)]
    advantages = torch.randn(len(trajectories), generator=torch.Generator().manual_seed(0))
    trainable = sum(sum(t.loss_mask) for t in trajectories)
    pad_id = tokenizer.pad_token_id
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = trl_trainer(model, tokenizer, [ChatEncoder(tokenizer).end_of_turn_id])
    inputs = trl_inputs(trajectories, advantages, pad_id)
    outer = torch.get_num_threads()
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        results: dict[str, list[tuple[float, float, float, int]]] = {"ours": [], "TRL 1.16": []}
        for rep in range(reps + 1):  # the first is a warm-up, and the check that both compute the same
            for arm, runs in results.items():
                model.load_state_dict(initial)
                runs.append(ours(model, trajectories, advantages, pad_id) if arm == "ours"
                            else trl(trainer, model, inputs))
            if not rep:
                (_, loss, norm, _), (_, trl_loss, trl_norm, _) = (runs.pop() for runs in results.values())
                print(f"  {label}, {count} thread(s): loss {loss:.6f} (TRL {trl_loss:.6f}), "
                      f"grad norm {norm:.6f} (TRL {trl_norm:.6f})", flush=True)
                if abs(loss - trl_loss) > 1e-4 * max(1.0, abs(loss)) or abs(norm - trl_norm) > 1e-3 * norm:
                    raise SystemExit("the two updates do not compute the same loss: the comparison would be unfair")
        torch.set_num_threads(outer)
        for arm, runs in results.items():
            per_s = [trainable / s for s, *_ in runs]
            vs = [st / s for (s, *_), (st, *_) in zip(runs, results["TRL 1.16"])]  # same tokens: time ratio
            cells = runs[0][3]
            rows.append(f"| {label}, {count} thread{'s' if count > 1 else ''} | {arm} | {trainable} | "
                        f"{cells} ({cells / trainable:.1f}×) | {spread(per_s)} | {ratio_spread(vs)} |")
    model.load_state_dict(initial)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model on BabyAI only, 2 repetitions, default threads")
    parser.add_argument("--envs", nargs="*", default=["babyai", "textcraft"])
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    threads = [torch.get_num_threads()] + ([] if args.quick or torch.get_num_threads() == 1 else [1])
    rows = []
    for env_id in ["babyai"] if args.quick else args.envs:
        model, tokenizer = build(env_id, TinyModelConfig())
        params = sum(p.numel() for p in model.parameters()) / 1e6
        rows += measure(f"{env_id}, {params:.2f}M", model, tokenizer, env_id, reps, threads)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; one GRPO update "
          f"over 32 episodes (8 tasks × 4 samples, 8 turns) in micro-batches of {MICRO_BATCH}; median (min–max) "
          f"of {reps} interleaved repetitions after a warm-up")
    print("| env, model, threads | update | trainable tokens | tokens through the model (× trainable) | "
          "trainable tokens/s | vs TRL 1.16 (within rep) |\n|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
