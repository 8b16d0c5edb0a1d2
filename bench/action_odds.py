"""How likely a model is to write the action that solves a BabyAI item at once, per category: what
bounds RL from the instruct model while its successes take one turn.

GRPO learns from a task only when its group of G samples differs in reward. Greedy SmolLM2 runs
solve an item with their first reply or never (docs/RESULTS.md, `bench/babyai_headroom.py`), so
what RL can find soon is the items one listed action solves, and only as often as the policy
samples that action. This script plays the first turn of a split's items with a recipe's prompt
(its system prompt, worked example, listed actions and reply prefix: the engine builds it, as in
training), finds the listed actions that solve the item from that state (each tried from a
snapshot), and scores every listed action as the model's whole reply, at the sampling temperature:

- an action's probability sums the forms the environment reads as it that a model writes most
  (`surface_forms`: bare or in quotes, "pick up" for "pickup"), each as the whole reply: with
  `rollout.reply_prefix` "Action:" the reply continuing it is " <form>" and the end of the turn;
  with free replies, "Action: <form>" and the end of the turn. A lower bound: a model may also
  write a thought first, or another form the environment takes;
- per item: P(solve), the summed probability of the solving replies; the chance that a group of
  G samples holds one, 1 - (1 - P)^G; whether the likeliest listed action solves;
- per category: the means, and the probability the model gives each verb (go, pickup, toggle,
  ...) summed over its listed actions, averaged over the items.

Only the items one listed action solves are scored (27 of BabyAI's 90 test items), unless
`--all-items`.

    python bench/action_odds.py [--config configs/smollm2_babyai_grpo.yaml] [--model NAME_OR_FOLDER]
        [--split test] [--episodes N] [--all-items] [--temperature 0.8] [--group-size 8] [--json OUT.json]

`--model` defaults to the config's model (a named model, a folder, or a run's checkpoint,
`runs/<run>/checkpoints/step_N/model`), so a run's model can be set beside the one it started
from. Run by hand (SmolLM2, 90 test items: minutes on a 2-core CPU); the tables go into
docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.models import model_folder
from agentgym_rl.config import RLConfig, load_config
from agentgym_rl.envs import registry
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import Reply

sys.path.insert(0, str(Path(__file__).resolve().parent))
from babyai_headroom import solving_actions  # noqa: E402


class FirstTurns:
    """A token policy that records each episode's first prompt, its listed actions and those that
    solve it, and ends the turn with an empty reply (played for one turn only)."""

    def __init__(self, encoder: ChatEncoder) -> None:
        self.encoder = encoder
        self.seen: list[dict[str, Any]] = []

    def reset(self) -> None:
        pass

    def act(self, envs, prompts, max_new_tokens, conversations=None, streams=None):
        for env, prompt in zip(envs, prompts):
            start = env.snapshot()
            listed = list(env.available_actions() or [])
            solving = solving_actions(env, start)
            env.restore(start)
            self.seen.append({"prompt": list(prompt), "listed": listed, "solving": solving})
        return [Reply("", ids=[self.encoder.end_of_turn_id]) for _ in envs]


def surface_forms(action: str) -> list[str]:
    """The ways of writing `action` scored as it: as listed, "pick up" for "pickup", each bare and
    in double quotes (the BabyAI environment reads them all as the action: `parse_action`)."""
    spellings = [action] + (["pick up" + action[len("pickup"):]] if action.startswith("pickup") else [])
    return [form for spelling in spellings for form in (spelling, f'"{spelling}"')]


def reply_logprobs(model: Any, prompt: list[int], replies: list[list[int]], temperature: float) -> list[float]:
    """log P(reply | prompt) of each reply (its ids, end of turn included) at `temperature`: the
    prompt runs once, its keys and values are shared by every reply."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True)
        cache = out.past_key_values
        width = max(map(len, replies))
        rows = len(replies)
        cache.batch_repeat_interleave(rows)
        feed = torch.tensor([[prompt[-1]] + reply[:-1] + [0] * (width - len(reply)) for reply in replies])
        mask = torch.ones(rows, len(prompt) - 1 + width, dtype=torch.long)
        logits = model(input_ids=feed, past_key_values=cache, attention_mask=mask).logits.float()
        logprobs = (logits / temperature).log_softmax(-1)
    scores = []
    for row, reply in enumerate(replies):
        taken = logprobs[row, torch.arange(len(reply)), torch.tensor(reply)]
        scores.append(float(taken.sum()))
    return scores


def verb(action: str) -> str:
    return "toggle" if action.startswith("toggle") else action.split()[0]


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    config = load_config(RLConfig, args.config, [])
    folder = model_folder(args.model or config.model.path, log=lambda _: None)
    model, tokenizer = load_model_and_tokenizer(folder, "float32")
    model.eval()
    encoder = ChatEncoder(tokenizer)
    policy = FirstTurns(encoder)
    tasks = registry.tasks("babyai", args.split, config.env.kwargs)[:args.episodes]
    make_env = registry.env_factory("babyai", config.env.kwargs)
    with RolloutEngine(make_env, config.rollout) as engine:
        played = engine.run(tasks, policy, 1)
    prefix = config.rollout.reply_prefix
    rows = []
    for task, episode in zip(tasks, played):  # each item's first prompt: the one its episode opens with
        seen = next(s for s in policy.seen if episode.input_ids[:len(s["prompt"])] == s["prompt"])
        if not (seen["solving"] or args.all_items):
            continue
        forms = [(action, form) for action in seen["listed"] for form in surface_forms(action)]
        texts = [(" " + form) if prefix else f"Action: {form}" for _, form in forms]
        replies = [tokenizer.encode(text, add_special_tokens=False) + [encoder.end_of_turn_id] for text in texts]
        scores = reply_logprobs(model, seen["prompt"], replies, args.temperature)
        probability = dict.fromkeys(seen["listed"], 0.0)
        for (action, _), score in zip(forms, scores):
            probability[action] += math.exp(score)
        likeliest = max(probability, key=probability.get)
        solve = sum(probability[a] for a in seen["solving"])
        by_verb = collections.Counter()
        for action, p in probability.items():
            by_verb[verb(action)] += p
        rows.append({"item_id": task.item_id, "category": task.category, "solving": seen["solving"],
                     "p_solve": solve, "p_group": 1 - (1 - solve) ** args.group_size,
                     "likeliest": likeliest, "likeliest_solves": likeliest in seen["solving"],
                     "p_listed": sum(probability.values()), "by_verb": dict(by_verb)})
    return rows


def table(rows: list[dict[str, Any]], group_size: int) -> str:
    one_action = [row for row in rows if row["solving"]]
    verbs = sorted({v for row in rows for v in row["by_verb"]}, key=lambda v: -sum(r["by_verb"].get(v, 0) for r in rows))
    lines = ["| category | one-action items | mean P(solve) | median P(solve) | P(a group of "
             f"{group_size} holds one), mean | likeliest action solves | P(a listed action), mean | "
             + " | ".join(f"P({v})" for v in verbs) + " |",
             "|" + "---|" * (7 + len(verbs))]
    categories = [c for c, _ in collections.Counter(r["category"] for r in rows).most_common()]
    for category in categories + ["all"]:
        mine = [r for r in one_action if category in ("all", r["category"])]
        every = [r for r in rows if category in ("all", r["category"])]
        if not mine:
            cells = [category, "0", "", "", "", "", f"{sum(r['p_listed'] for r in every) / len(every):.3f}"]
        else:
            solves = sorted(r["p_solve"] for r in mine)
            cells = [category, str(len(mine)), f"{sum(solves) / len(mine):.3f}", f"{solves[len(solves) // 2]:.3f}",
                     f"{sum(r['p_group'] for r in mine) / len(mine):.3f}",
                     f"{sum(r['likeliest_solves'] for r in mine)} of {len(mine)}",
                     f"{sum(r['p_listed'] for r in every) / len(every):.3f}"]
        cells += [f"{sum(r['by_verb'].get(v, 0) for r in every) / len(every):.3f}" for v in verbs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/smollm2_babyai_grpo.yaml"))
    parser.add_argument("--model", default=None, help="a named model, a folder or a checkpoint (default: the config's)")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--episodes", type=int, default=None, help="the split's first N items (default: all)")
    parser.add_argument("--all-items", action="store_true", help="score every item, not only those one action solves")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the per-item rows here")
    args = parser.parse_args(argv)
    if args.temperature <= 0:
        print("error: --temperature must be > 0 (probabilities of sampled replies)", file=sys.stderr)
        return 2
    try:
        rows = measure(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table(rows, args.group_size))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
