"""Evaluate a policy (a model folder, the expert, or random) on a split of an environment."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from ..envs import registry
from ..errors import UserError
from ..config import DEFAULT_DEVICE, PlayConfig, RolloutConfig
from ..envs.tasks import Task, choose_items
from ..rollout.engine import RolloutEngine
from ..rollout.journal import Journal
from ..rollout.rewards import EpisodeReward
from ..rollout.backends import folder_policy
from ..rollout.trajectory import Trajectory
from ..agent.allocator import mmap_threshold_kb, set_mmap_threshold
from ..agent.models import NAMED_MODELS, file_sha256, is_model_reference, model_folder
from .metrics import Summary, summarize
from .policies import RandomPolicy


API_PREFIX = "api:"
"""`--policy api:MODEL`: a chat model behind `rollout.generator_url` (`rollout/chat_api.py`)."""


def check_policy(policy: str, rollout: RolloutConfig | None = None, look_inside: bool = True) -> None:
    """Raise the UserError `make_policy` would for a policy string that cannot be played, from
    what is cheap to see (no model is loaded): `bench-agent` checks once before its environments.
    `look_inside`: also refuse a folder without a model's config.json (loading would, later)."""
    if policy in ("expert", "random") or is_model_reference(policy):
        return
    if policy.startswith(API_PREFIX):
        if rollout is None or not rollout.generator_url:
            raise UserError(f"--policy {policy} needs the API's address: rollout.generator_url=https://HOST/v1")
        return
    if not Path(policy).exists():
        raise UserError(f"policy {policy!r} is neither 'expert', 'random', '{API_PREFIX}MODEL', a named model "
                        f"({', '.join(sorted(NAMED_MODELS))}) nor an existing model folder")
    if look_inside and not (Path(policy) / "config.json").is_file():
        raise UserError(f"model path {policy!r} has no config.json (not a Hugging Face model folder)")


def make_policy(env_id: str, policy: str | Any, temperature: float, seed: int, device: str = DEFAULT_DEVICE,
                dtype: str = "float32", rollout: RolloutConfig | None = None, listed_actions_only: bool = False) -> Any:
    """"expert", "random", "api:MODEL" (a chat API at `rollout.generator_url`), a named model or
    a model folder path (`rollout.backends.folder_policy`: loaded in `dtype` on `device`,
    `run.device`'s values, or sampled by vLLM or the server `rollout` names), or an already built
    policy object (`listed_actions_only`: see `ModelPolicy`, for a model)."""
    if not isinstance(policy, str):
        return policy
    if listed_actions_only and (policy in ("expert", "random") or policy.startswith(API_PREFIX)):
        raise UserError(f"--listed-actions-only restricts the replies of a model folder; {policy!r} is not one")
    if policy == "expert":
        return registry.make_expert(env_id)
    if policy == "random":
        return RandomPolicy(seed)
    check_policy(policy, rollout, look_inside=False)  # the backend's own checks come first
    if policy.startswith(API_PREFIX):
        from ..rollout.chat_api import ChatAPIPolicy

        return ChatAPIPolicy(rollout.generator_url, policy.removeprefix(API_PREFIX), temperature,
                             rollout.generator_timeout, api_key=os.environ.get("OPENAI_API_KEY"),
                             max_concurrency=rollout.generator_concurrency, retries=rollout.generator_retries)
    if is_model_reference(policy):  # a named model or a .gguf file: its prepared folder
        policy = str(model_folder(policy))
    return folder_policy(policy, temperature, rollout, dtype, device, seed, listed_actions_only)


def _check_listable(make_env: Any, task: Any, seed: int, needed_for: str) -> None:
    """Raise a UserError before any work when the environment cannot list its actions (a random
    policy picks among them, `listed_actions_only` restricts replies to them)."""
    env = make_env()
    try:
        env.reset(task.item_id, seed=seed)
        listed = env.available_actions()
    finally:
        env.close()
    if not listed:
        raise UserError(f"environment {task.env_id!r} cannot list its actions, so {needed_for}")


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` played, and how it went.

    Attributes:
        env, split, policy: the environment, its split, and the policy ("model" for an object).
        max_turns, temperature: the turn limit and the sampling temperature played with.
        listed_actions_only: replies were restricted to the listed actions.
        items: how the items were drawn ("first", "stratified"), or "all" of the split.
        categories: the categories played (empty: every one of the split).
        summary: the episodes' figures (`metrics.summarize`).
    """

    env: str
    split: str
    policy: str
    max_turns: int
    temperature: float
    listed_actions_only: bool
    items: str
    categories: tuple[str, ...]
    summary: Summary

    def as_dict(self) -> dict[str, Any]:
        """One flat mapping, settings then figures: what `eval --json` writes."""
        settings = {field.name: getattr(self, field.name) for field in fields(self) if field.name != "summary"}
        return {**settings, **self.summary.as_dict()}

    def title(self) -> str:
        played = f" ({', '.join(self.categories)})" if self.categories else ""
        return f"{self.env} {self.split}{played} — policy {self.policy}"


def evaluate(env_id: str, policy: str | Any, split: str = "test", episodes: int | None = None,
             samples: int = 1, max_turns: int | None = None, temperature: float = 0.0, seed: int = 0,
             rollout: RolloutConfig | None = None, progress: bool = True,
             env_kwargs: dict | None = None, desc: str | None = None, device: str = DEFAULT_DEVICE,
             dtype: str = "float32", env_urls: list[str] = (), env_timeout: float = 60.0,
             listed_actions_only: bool = False, items: str = "first", journal: Journal | None = None,
             log: Callable[[str], Any] = print, reward: EpisodeReward | None = None,
             categories: tuple[str, ...] = ()) -> tuple[Evaluation, list[Trajectory]]:
    """Play `episodes` tasks of `split` (its first, or with `items="stratified"` spread over its
    categories: `envs.tasks.choose_items`; with `categories`, chosen among those categories' tasks),
    `samples` times each (`listed_actions_only`: a model policy named by its folder replies only
    with listed actions, see `ModelPolicy`). With `journal`, the episodes are written there every
    turn and a journal of this evaluation is gone on from (`eval_journal`); `log` says so.

    Returns:
        (evaluation, trajectories): what was played and its `metrics.Summary` (success = Avg@n
        as a fraction, pass_at_k with k = samples).
    """
    tasks = registry.tasks(env_id, split, env_kwargs)
    if categories:
        tasks = _of_categories(tasks, categories, f"the {split} split of {env_id}")
    split_size = len(tasks)
    if episodes is not None:
        if episodes < 1:
            raise UserError(f"--episodes must be >= 1, got {episodes}")
        if episodes > len(tasks):
            raise UserError(f"the {split} split of {env_id}{' in ' + ', '.join(categories) if categories else ''} "
                            f"has {len(tasks)} items; asked for {episodes}")
        tasks = choose_items(tasks, episodes, items)
    if samples < 1:
        raise UserError(f"--samples must be >= 1, got {samples}")
    horizon = max_turns or registry.spec(env_id).max_turns
    if horizon < 1:
        raise UserError(f"--max-turns must be >= 1, got {horizon}")
    rollout = rollout or RolloutConfig()
    agent = make_policy(env_id, policy, temperature, seed, device, dtype, rollout, listed_actions_only)
    make_env = registry.env_factory(env_id, env_kwargs, env_urls, env_timeout)
    if isinstance(agent, RandomPolicy):
        _check_listable(make_env, tasks[0], seed, "it has no random policy; use --policy expert or a model folder")
    if listed_actions_only:
        _check_listable(make_env, tasks[0], seed, "replies cannot be restricted to them (BabyAI lists them with "
                        "env.kwargs.list_actions=true)")
    engine = RolloutEngine(make_env, rollout, reward)
    from ..progress import count_as_done, progress_bar

    with engine, progress_bar(total=len(tasks) * samples, desc=desc or f"eval {env_id}/{split}", unit="ep",
                              disable=not progress) as bar:
        # Each episode samples from its own stream: an evaluation resumed from its journal, or run
        # with other threads or batch caps, draws what one uninterrupted run would.
        trajectories = engine.run(tasks, agent, horizon, samples=samples, seed=seed, progress=bar.update,
                                  sampling_seed=seed, journal=journal,
                                  reread_progress=lambda n: count_as_done(bar, n))
    if engine.reread or engine.resumed:
        log(f"went on from the journal {journal.path}: {engine.reread} finished episodes kept, "
            f"{engine.resumed} unfinished ones continued")
    unplayed = [t for t in trajectories if t.truncated and t.turns == 0 and not t.error]
    if unplayed:
        longest = max(len(t.input_ids) for t in unplayed)
        log(f"warning: {len(unplayed)} of {len(trajectories)} episodes ended before their first reply: the opening "
            f"prompt (up to {longest} tokens){' with rollout.reply_prefix' if rollout.reply_prefix else ''} and a "
            f"{rollout.max_new_tokens}-token reply do not fit rollout.max_context={rollout.max_context}")
    evaluation = Evaluation(env_id, split, policy if isinstance(policy, str) else "model", horizon, temperature,
                            listed_actions_only, items if len(tasks) < split_size else "all", tuple(categories),
                            summarize(trajectories))
    return evaluation, trajectories


def _of_categories(tasks: list[Task], categories: tuple[str, ...], split: str) -> list[Task]:
    """The tasks of `categories` (`eval.categories`), in split order; a name `split` lacks is a
    `UserError` that lists the ones it has."""
    named = sorted({task.category for task in tasks})
    unknown = [name for name in categories if name not in named]
    if unknown:
        raise UserError(f"eval.categories: {split} has no category {', '.join(map(repr, unknown))}; it has "
                        f"{', '.join(named)}")
    return [task for task in tasks if task.category in categories]


def evaluate_played(config: PlayConfig, policy: str | Any, desc: str | None = None, journal: Path | None = None,
                    log: Callable[[str], Any] = print) -> tuple[Evaluation, list[Trajectory]]:
    """`evaluate` with the settings of a `PlayConfig` (what `agentgym-rl eval` and `collect` run),
    journaled at `journal` if given (`eval_journal`)."""
    set_mmap_threshold(mmap_threshold_kb(config.run.malloc_mmap_threshold_kb, full_fine_tuning=False))
    return evaluate(config.env.id, policy, config.env.eval_split, config.eval.episodes or None, config.eval.samples,
                    config.eval.max_turns, config.eval.temperature, config.run.seed, config.rollout,
                    env_kwargs=config.env.kwargs, desc=desc, device=config.run.device, dtype=config.run.dtype,
                    env_urls=config.env.urls, env_timeout=config.env.server_timeout,
                    listed_actions_only=config.eval.listed_actions_only, items=config.eval.items,
                    journal=eval_journal(journal, config, policy) if journal is not None else None, log=log,
                    reward=EpisodeReward.from_env(config.env), categories=tuple(config.eval.categories))


def eval_journal(path: Path, config: PlayConfig, policy: str | Any) -> Journal:
    """The journal at `path` of evaluating `policy` with `config` (`eval --journal`): an evaluation
    killed midway and run again with the same settings and weights goes on from it; one finished
    is read back instead of played. Its key is the settings and the policy with the SHA-256 of each
    file of its folder, so another evaluation's journal is refused, not mixed in."""
    from ..config.loader import to_dict

    if not isinstance(policy, str):
        raise UserError("a journal needs a policy named by a string (a folder, expert, random or api:MODEL)")
    folder = model_folder(policy) if is_model_reference(policy) else Path(policy)
    files = {str(f.relative_to(folder)): file_sha256(f) for f in sorted(folder.rglob("*")) if f.is_file()} \
        if folder.is_dir() else {}
    key = json.dumps({"policy": policy, "files": files, "config": to_dict(config)}, sort_keys=True, default=str)
    journal = Journal(path, key, every=1)
    held = journal.key_on_file()
    if held is not None and held != key:
        raise UserError(f"{path} is the journal of another evaluation (other settings, items or weights); give "
                        "another --journal or delete it")
    if path.exists() and held is None:
        raise UserError(f"{path} exists and is not a journal this version can read; give another --journal or "
                        "delete it")
    return journal


def format_table(summary: Summary, title: str, listed_actions_only: bool = False) -> str:
    """A plain-text table of overall and per-category success, then a line of averages; its idle
    turns (accepted actions that left the environment in a state the episode had been in) are
    named when there are any (an environment without state keys has none)."""
    rows = [("overall", summary.episodes, summary.success, summary.pass_at_k)]
    if len(summary.by_env) > 1:  # a mix: each environment's Avg@n (its Pass@k is in its categories')
        rows += [(env_id, None, env.success, None) for env_id, env in summary.by_env.items()]
    for category, success in summary.by_category.items():
        rows.append((category, None, success, summary.pass_at_k_by_category[category]))
    lines = [title, f"{'category':<12}{'Avg@' + str(summary.samples):>10}{'Pass@' + str(summary.k):>10}"]
    lines += [f"{name:<12}{100 * s:>9.1f}%" + (f"{100 * p:>9.1f}%" if p is not None else "") for name, _, s, p in rows]
    lines.append(f"items {summary.episodes} × samples {summary.samples}, avg reward "
                 f"{summary.avg_reward:.3f}, avg turns {summary.avg_turns:.1f}, "
                 f"invalid actions {100 * summary.invalid_action_rate:.1f}%"
                 + (f", idle turns {100 * summary.idle_turn_rate:.1f}%" if summary.idle_turn_rate else "")
                 + f", errors {summary.errors}"
                 + (", replies restricted to the listed actions" if listed_actions_only else ""))
    return "\n".join(lines)
