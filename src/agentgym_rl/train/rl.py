"""The online RL trainer: rollout → advantage → PPO-clip update → log, with the
ScalingInter-RL horizon schedule, validation, checkpoints and resume.

One trainer serves every algorithm of `agentgym_rl.algos.ALGORITHMS`: the recipe names the
advantage estimator, where the KL goes, whether a value head is trained, the ratio level.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import random
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..agent.sampling import greedy_members
from ..algos import (KL, AlgorithmSpec, HorizonSchedule, add_at_tokens, advantage_inputs, compute_advantages,
                     discredit_turns, make_kl_controller, masked_mean, outcome_token_rewards, penalize_tokens,
                     rare_action_tokens, rare_verbs, rl_objective)
from ..config import RLConfig, from_dict, load_yaml, to_dict
from ..envs import registry
from ..envs.mix import member_quotas, task_pools
from ..errors import DISK_ERRORS, UserError
from ..eval.metrics import Summary, change_sentence, item_success, summarize
from ..rollout.backends import backend_of
from ..rollout.engine import RolloutEngine
from ..rollout.journal import Journal
from ..rollout.rewards import EpisodeReward
from ..rollout.trajectory import Trajectory, load_trajectories, save_trajectories
from ..runs import CONFIG, check_writable, checkpoints, disk_stop, holds_run, prune_checkpoints, validated_steps
from . import distributed
from .asynchronous import PlayedStep, RolloutsAhead, RolloutsNow, staleness_histogram
from .batch import TokenBatch, collate, turn_state_ids
from .console import step_line
from .curriculum import SuccessCurriculum, category_of, only_categories
from .learner import TokenOutputs
from .session import Session, Trainer, holds_run_folder
from .. import metric_names as metric


_clock = time.monotonic
"""What `train.time_limit_min` is measured with (a test replaces it)."""

RESUME_KEYS = ("env.id", "env.kwargs.members", "model", "warmup", "algo.name", "algo.kl_coef", "run.dtype")
"""What a resumed run must share with the run it continues: its environment (a mix's members),
the model it started from and what its checkpoints hold (a value head for ppo, a KL reference
when kl_coef > 0)."""


def ends_past_limit(elapsed_s: float, limit_s: float, step_s: float, horizon: int, next_horizon: int,
                    validation_s: float, save_s: float) -> bool:
    """Whether one more step, then a validation and a save, would end past `limit_s` seconds
    (`train.time_limit_mode: within`): the next step is predicted as the last one's `step_s`
    scaled by its horizon (`next_horizon / horizon`: a longer horizon plays more turns), the
    validation and the save as they last took."""
    return elapsed_s + step_s * next_horizon / horizon + validation_s + save_s > limit_s


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def split_actors(make_env: Any, config: RLConfig) -> tuple[Any, Any]:
    """(training's, validation's) environment factories. Ray actors (`env.urls: [ray:...]`) are
    a budget the cluster's CPUs set (`actor_budget`): each engine keeps the environments it made
    for reuse, so the two get shares that together fit it (`ray_env.split_actor_budget`); any
    other factory serves both as it is."""
    budget = getattr(make_env, "actor_budget", 0)
    if not budget:
        return make_env, make_env
    from ..envs.ray_env import split_actor_budget

    train_need = config.algo.tasks_per_step * config.algo.group_size
    val_need = config.eval.episodes * config.eval.samples
    try:
        train_cap, val_cap = split_actor_budget(budget, train_need, val_need)
    except ValueError as error:
        raise UserError(f"env.urls {config.env.urls}: {error}; give each actor a smaller CPU share (?cpus=)") from None
    asked = config.rollout.max_envs  # it overrides the shares: each engine keeps up to this many
    if asked and min(asked, train_need) + min(asked, val_need) > budget:
        raise UserError(f"rollout.max_envs={asked} for training and for validation together asks for more Ray "
                        f"actors than the cluster places ({budget}); use at most {train_cap}, or leave it at 0")
    return (registry.with_max_parallel(make_env, train_cap),
            registry.with_max_parallel(make_env, val_cap) if val_cap else make_env)


def validation_journal(run_dir: Path, step: int) -> Path:
    """Where the validation after step `step` keeps its journal (`rollout.journal_every`)."""
    return run_dir / "inflight" / f"validation_{step:06d}.journal"


def validation_on(config: RLConfig) -> bool:
    """Whether the run validates at all (`train.validate_every` and `eval.episodes` both set)."""
    return bool(config.train.validate_every and config.eval.episodes)


def validation_due(config: RLConfig, step: int) -> bool:
    """Whether step `step` (> 0) ends with a validation: every `train.validate_every` steps and
    after the last (`train.steps`), so that every run ends measured."""
    every = config.train.validate_every
    return validation_on(config) and (step % every == 0 or step == config.train.steps)


def validation_missing(run_dir: Path, config: RLConfig, step: int) -> bool:
    """Whether step `step` (> 0) of the run is due a validation (`validation_due`) that its
    metrics do not hold, or began one that did not finish (its journal is there: e.g. the last
    validation of a run stopped by `train.time_limit_min`)."""
    return bool(step and (validation_due(config, step) or validation_journal(run_dir, step).is_file())
                and step not in validated_steps(run_dir))


def check_resumable(run_dir: Path, config: RLConfig) -> None:
    """Refuse to resume `run_dir` with a config whose `RESUME_KEYS` differ from its saved one,
    naming each differing key (keys an older run did not save are not compared)."""
    if not (run_dir / CONFIG).is_file():
        raise UserError(f"cannot resume {str(run_dir)!r}: it is not a run folder (no {CONFIG})")
    saved, now = _flatten(load_yaml(run_dir / CONFIG)), _flatten(to_dict(config))
    differ = [f"{key} ({saved[key]!r} -> {now[key]!r})" for key in sorted(now)
              if key in saved and saved[key] != now[key]
              and any(key == k or key.startswith(k + ".") for k in RESUME_KEYS)]
    if differ:
        raise UserError(f"cannot resume {str(run_dir)!r} with this config: {', '.join(differ)} differ from the run's "
                        "own; resume with its values or start a new run.name")


def resumed_changes(run_dir: Path, config: RLConfig) -> list[str]:
    """The keys the resumed `config` sets otherwise than the run's saved one (the config it
    started with), as "key (old -> new)": a resume takes the command's config, so an override
    given at the start and not repeated (`algo.group_size=4`) is quietly the file's value again
    unless someone says so. The saved config is read with today's defaults (a key an older
    version did not save is its default, not a change); a key only one side holds (an entry of
    `env.kwargs` dropped or added) is "<unset>" on the other."""
    raw = load_yaml(run_dir / CONFIG)
    now = _flatten(to_dict(config))
    try:
        saved = _flatten(to_dict(from_dict(RLConfig, raw)))
        keys = {*saved, *now}  # both complete: a key on one side only is a dict entry dropped or added
    except UserError:  # a key this version no longer has: compare what both hold
        saved = _flatten(raw)
        keys = saved.keys() & now.keys()
    unset = object()

    def shown(value: Any) -> str:
        return "<unset>" if value is unset else repr(value)

    return [f"{key} ({shown(saved.get(key, unset))} -> {shown(now.get(key, unset))})"
            for key in sorted(keys) if key != "run.overwrite" and saved.get(key, unset) != now.get(key, unset)]


class LogprobGap:
    """|log p_generator − log p_learner| over action tokens: ~0 when the generator samples with the
    learner's weights in the same precision; it grows when generation runs elsewhere (another
    engine, dtype or stale weights), where PPO's ratios would start from that error."""

    def __init__(self) -> None:
        self.total, self.count, self.largest = 0.0, 0, 0.0

    def add(self, generated: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor) -> None:
        """generated, learner, mask: (B, T); mask 1 on the action tokens to compare."""
        gap = (generated.to(learner.device) - learner).abs()[mask > 0]
        if gap.numel():
            self.total += float(gap.sum())
            self.count += gap.numel()
            self.largest = max(self.largest, float(gap.max()))

    def metrics(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {metric.ROLLOUT_LOGPROB_GAP_MEAN: self.total / self.count, metric.ROLLOUT_LOGPROB_GAP_MAX: self.largest}


@dataclasses.dataclass
class _LossContext:
    """What the loss of one RL step needs beside its micro-batch (`RLTrainer._loss`).

    Attributes:
        spec: the recipe with the β in force.
        gap: the generator's logprobs against the learner's (`rollout/logprob_gap_*`).
        gap_in_loss: measure the gap in the next forward pass (the first minibatch's, whose
            weights are still those that sampled), when no scoring pass measured it.
        old_in_loss: the forward pass's own logprobs, detached, are the old ones (an update of
            one optimizer step), so no scoring pass runs for them.
    """

    spec: AlgorithmSpec
    gap: LogprobGap
    gap_in_loss: bool = False
    old_in_loss: bool = False


def no_update_reason(metrics: dict[str, float]) -> str | None:
    """Why an RL step left the weights as they were, from its metrics (None: it updated)."""
    if metrics[metric.UPDATE_TRAJECTORIES] == 0:
        if metric.ADV_NUM_GROUPS not in metrics and metrics.get(metric.SAMPLING_GROUPS_DROPPED):
            return (f"DAPO's filter dropped all {int(metrics[metric.SAMPLING_GROUPS_DROPPED])} groups: the rewards "
                    "tie within each (algo.dynamic_sampling refill rounds, or tasks the policy solves sometimes, "
                    "give a signal)")
        if metric.ADV_NUM_GROUPS not in metrics and metrics.get(metric.UPDATE_FAILED_LEFT_OUT):
            return (f"no rollout to train on: {metrics[metric.UPDATE_FAILED_LEFT_OUT]} failed in the environment "
                    "(their errors are in trajectories/) and the rest have no trained token")
        if metric.ADV_NUM_GROUPS not in metrics:
            return "no rollout has a trained token (every episode ended before the model replied)"
        if metrics.get(metric.ADV_ZERO_VAR_GROUP_FRAC) == 1.0:
            return (f"the rewards tie within each of the {int(metrics[metric.ADV_NUM_GROUPS])} groups, so every advantage "
                    "is 0 (a larger algo.group_size, or tasks the policy solves sometimes, give a signal)")
        return "every advantage is 0"
    if metrics.get(metric.UPDATE_SKIPPED_STEPS, 0) == metrics.get(metric.UPDATE_OPTIMIZER_STEPS):
        return f"the algo.max_kl guard skipped all {metrics[metric.UPDATE_OPTIMIZER_STEPS]} optimizer steps"
    return None


@dataclasses.dataclass(frozen=True)
class Validation:
    """One validation of an RL run: its step, its summary and each item's success (the mean over
    its samples), for paired comparisons of validations of the same items."""

    step: int
    summary: Summary
    item_success: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """Flat, as `report/quickstart.json` holds it: the step, the summary's fields, the items."""
        return {"step": self.step, **self.summary.as_dict(), "item_success": self.item_success}


def device_peak_gb(device: torch.device) -> dict[str, float]:
    """On a CUDA device, the most memory torch's tensors took there since the last call (GB), and
    the most its caching allocator held (what the card lends), then the counts restart: one
    step's peaks (a validation after step N counts in step N+1's); elsewhere nothing."""
    if device.type != "cuda":
        return {}
    peaks = {metric.MEMORY_DEVICE_PEAK_GB: torch.cuda.max_memory_allocated(device) / 1e9,
             metric.MEMORY_DEVICE_RESERVED_GB: torch.cuda.max_memory_reserved(device) / 1e9}
    torch.cuda.reset_peak_memory_stats(device)
    return peaks


def per_env_metrics(prefix: str, stats: Summary) -> dict[str, float]:
    """`<prefix>/env/<env_id>/success` and `/reward` of each environment in a summary
    (`eval.metrics.summarize`'s by_env): a mix's curves one environment at a time."""
    return {metric.env_metric(prefix, env_id, key): getattr(env, name) for env_id, env in stats.by_env.items()
            for key, name in (("success", "success"), ("reward", "avg_reward"))}


def not_alongside(config: RLConfig, world: int) -> str | None:
    """Why `train.asynchronous`, `rollout.journal_every`, `rollout.dtype: bfloat16` or
    `algo.greedy_samples` cannot run with the rest of the run (`world` processes under torchrun);
    None when nothing clashes."""
    workers, torchrun = "Ray rollout workers (rollout.workers)", "torchrun"
    backend = backend_of(config.rollout)
    for feature, on, clashes in (
            ("train.asynchronous", config.train.asynchronous,
             {torchrun: world > 1, workers: config.rollout.workers > 0,
              f"rollout.generator: {backend.name}": not backend.asynchronous}),
            ("rollout.journal_every", config.rollout.journal_every > 0,
             {"train.asynchronous": config.train.asynchronous, torchrun: world > 1,
              workers: config.rollout.workers > 0}),
            # The copy's rounding would enter PPO's ratio unless the learner scores the old logprobs.
            ("train.partial_rollouts", config.train.partial_rollouts,
             {"algo.recompute_old_logprobs: false": not config.algo.recompute_old_logprobs}),
            ("rollout.dtype: bfloat16", config.rollout.dtype == "bfloat16",
             {"algo.recompute_old_logprobs: false": not config.algo.recompute_old_logprobs, torchrun: world > 1,
              workers: config.rollout.workers > 0,
              f"rollout.generator: {backend.name}": not backend.in_process}),
            # Only the in-process samplers read GREEDY_STREAM; a fork's branches share the trunk's sample 0.
            ("algo.greedy_samples", config.algo.greedy_samples > 0,
             {workers: config.rollout.workers > 0, f"rollout.generator: {backend.name}": not backend.in_process,
              "rollout.fork_at": config.rollout.fork_at > 0})):
        clash = next((name for name, present in clashes.items() if present), None) if on else None
        if clash:
            return f"{feature} does not run with {clash} yet: drop one of the two"
    if config.rollout.journal_every and not config.train.save_every:
        return "rollout.journal_every resumes a step from the run's checkpoints and train.save_every=0 writes none: " \
               "drop one of the two"
    return None


def counts_turns(config: RLConfig, spec: AlgorithmSpec) -> str | None:
    """The first setting of the run whose credit is indexed by turn (the k-th reply of an episode
    taken as its k-th turn), or None: the estimator's turn states or rewards (GiGPO), the
    invalid- and idle-turn penalties."""
    by_turn = {"state_ids", "turn_rewards"} & set(advantage_inputs(spec.advantage)[1])
    return next((name for name, on in ((f"algo.name: {config.algo.name}", bool(by_turn)),
                                       ("algo.invalid_turn_penalty", spec.invalid_turn_penalty is not None),
                                       ("algo.idle_turn_penalty", spec.idle_turn_penalty is not None)) if on), None)


def weights_fingerprint(model: Any) -> str:
    """A digest of `model`'s parameters: a journal is continued only by the weights that wrote it."""
    digest = hashlib.blake2b(digest_size=16)
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def groups_with_reward_spread(trajectories: list[Trajectory]) -> set[int]:
    """The groups whose samples' rewards are not all equal (episodes cut short by an error left
    out, as the update leaves them out): only those give a group-relative advantage."""
    rewards: dict[int, list[float]] = {}
    for trajectory in trajectories:
        if trajectory.error is None:
            rewards.setdefault(trajectory.group, []).append(trajectory.reward)
    return {group for group, values in rewards.items() if max(values) - min(values) > 1e-9}


def greedy_success(trajectories: list[Trajectory], greedy_samples: int) -> float:
    """Success of the episodes `algo.greedy_samples` played greedily: the first `greedy_samples` of
    each group, in the order the rollout returns a group's samples."""
    played_greedily = greedy_members([t.group for t in trajectories], greedy_samples)
    greedy = [t.success for t, g in zip(trajectories, played_greedily) if g]
    return sum(greedy) / max(len(greedy), 1)


def trainable(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The episodes an update can train on: an episode cut short by an environment failure has
    no honest outcome, and one without an action token has nothing to train."""
    return [t for t in trajectories if t.error is None and sum(t.loss_mask) > 0]


def dapo_filter(trajectories: list[Trajectory], groups: int,
                fallback: set[int] | frozenset[int] = frozenset()) -> tuple[list[Trajectory], int]:
    """DAPO's filter (Yu et al. 2025, dynamic sampling): the episodes of the first `groups` groups
    (by group id, the order they were played in) whose rewards differ, and how many groups were
    left out: those whose rewards tie, which give no group-relative advantage, and those beyond
    `groups`, so that the batch keeps its size. The tied groups in `fallback` (ones another term
    gives a signal, such as a rare action's bonus) fill the places left, in group order; the
    other tied groups are left out."""
    played = {trajectory.group for trajectory in trajectories}
    spread = sorted(groups_with_reward_spread(trajectories))
    chosen = set((spread + sorted((set(fallback) & played) - set(spread)))[:groups])
    return [t for t in trajectories if t.group in chosen], len(played - chosen)


def advantage_fields(rows: list[Trajectory], mask: torch.Tensor, values: torch.Tensor | None,
                     estimator: str) -> dict[str, Any]:
    """The batch fields of `rows` an advantage estimator reads (`algos.ADVANTAGE_FIELDS`):
    outcome rewards, groups, the action mask (B, T), token rewards, the critic's values, and
    the turns' states and rewards when `estimator` takes them (B, K, padded with 0)."""
    rewards = torch.tensor([t.reward for t in rows], dtype=torch.float)
    fields = {"rewards": rewards, "group_ids": torch.tensor([t.group for t in rows]), "mask": mask,
              "token_rewards": outcome_token_rewards(rewards, mask), "values": values}
    optional = advantage_inputs(estimator)[1]
    if "state_ids" in optional:
        fields["state_ids"] = turn_state_ids(rows, mask)
    if "turn_rewards" in optional:  # each turn's reward where it was earned
        turns = max((len(t.turn_rewards) for t in rows), default=0)
        fields["turn_rewards"] = torch.tensor([t.turn_rewards + [0.0] * (turns - len(t.turn_rewards))
                                               for t in rows], dtype=torch.float).view(len(rows), turns)
    return fields


def context_metrics(trajectories: list[Trajectory], summarize: bool) -> dict[str, float]:
    """What `rollout.keep_turns` did to a step's episodes: their context windows, the longest
    one's tokens, and with `summarize` the summaries written."""
    windows = [end - start for t in trajectories for start, end in t.windows()]
    metrics = {metric.ROLLOUT_WINDOWS_MEAN: len(windows) / max(len(trajectories), 1),
               metric.ROLLOUT_LONGEST_WINDOW: max(windows, default=0)}
    if summarize:
        metrics[metric.ROLLOUT_SUMMARIES] = sum(len(t.summaries) for t in trajectories)
    return metrics


@dataclasses.dataclass
class _Progress:
    """What `RLTrainer.fit` keeps from step to step."""

    last_step: int
    """The last step that ran (before `train.steps` when the time limit stopped the run)."""
    validations: list[Validation] = dataclasses.field(default_factory=list)
    idle: dict[int, str] = dataclasses.field(default_factory=dict)
    """Step -> why it updated nothing."""


class RLTrainer(Trainer):
    """Trains a policy on one environment with a registered advantage estimator."""

    def __init__(self, config: RLConfig, log: Callable[[str], Any] = print):
        super().__init__(config, log)
        self.rank, self.world = distributed.start(config.run.device)  # (0, 1) outside torchrun
        if config.algo.tasks_per_step < self.world:
            raise UserError(f"algo.tasks_per_step={config.algo.tasks_per_step} gives some of the {self.world} ranks "
                            "no task: use at least one task per rank")
        if self.rank > 0:
            self.log = lambda line: None  # rank 0 reports
        clash = not_alongside(config, self.world)
        if clash:
            raise UserError(clash)
        self.algorithm = config.algo.spec()
        try:
            adaptive = config.algo.kl_control == "adaptive"
            self.kl_control = make_kl_controller(config.algo.kl_control, self.algorithm.kl_coef,
                                                 target=config.algo.kl_target if adaptive else None,
                                                 horizon=config.algo.kl_horizon if adaptive else None)
        except ValueError as error:
            raise UserError(f"algo: {error}") from None
        counted = counts_turns(config, self.algorithm) if config.rollout.summarize else None
        if counted:
            raise UserError(f"rollout.summarize trains each summary as a reply of its own, which {counted} would "
                            "count as a turn: drop one of the two")
        self._check_env_reports(config)
        self.schedule = HorizonSchedule(config.schedule.kind, tuple(config.schedule.horizons), config.schedule.every)
        self._timed = {"validation": 0.0, "save": 0.0}  # seconds, as last taken (train.time_limit_mode)
        self._task_pools(config)
        self.val_tasks = registry.tasks(config.env.id, config.env.eval_split, config.env.kwargs)[: config.eval.episodes]
        self.servers = None  # the run's own env servers (`env.spawn_servers`)
        if config.env.spawn_servers:
            from ..envs.spawned import SpawnedServers

            registry.env_factory(config.env.id, config.env.kwargs)  # bad arguments: an error here, not in a server
            # Journaled episodes are restored on the servers of a resumed run: they keep the run's key.
            key_file = self._snapshot_key_file
            key = bytes.fromhex(key_file.read_text()) if config.rollout.journal_every and key_file.is_file() else None
            self.servers = SpawnedServers(config.env.id, config.env.kwargs, config.env.spawn_servers, log=self.log,
                                          snapshot_key=key)
            make_env = self.servers.factory(config.env.server_timeout)
        else:
            make_env = registry.env_factory(config.env.id, config.env.kwargs, config.env.urls,
                                            config.env.server_timeout)
        make_env, make_val_env = split_actors(make_env, config)
        # The penalties and the right-token loss need to know where rejected replies went wrong (and
        # where the actions of idle turns began).
        locate = (config.rollout.locate_wrong_tokens or self.algorithm.invalid_turn_penalty is not None
                  or self.algorithm.idle_turn_penalty is not None or self.algorithm.rare_action_bonus is not None
                  or self.algorithm.discovery_bonus is not None or self.algorithm.right_token_coef > 0)
        reward = EpisodeReward.from_env(config.env)
        self.engine = RolloutEngine(registry.with_invalid_action_penalty(make_env, config.env.invalid_action_penalty),
                                    dataclasses.replace(config.rollout, locate_wrong_tokens=locate), reward)
        self.val_engine = RolloutEngine(make_val_env, config.rollout, reward)
        self.workers = None  # Ray rollout workers (`rollout.workers`), started with the model
        if config.rollout.workers:
            from ..envs.ray_env import parse_address

            if not backend_of(config.rollout).ray_workers:
                raise UserError(f"rollout.workers do not run {backend_of(config.rollout).about}: use "
                                "rollout.generator: hf")
            try:
                parse_address(config.rollout.workers_address)
            except ValueError as error:
                raise UserError(f"rollout.workers_address: {error}") from None

    def _task_pools(self, config: RLConfig) -> None:
        """The tasks a step draws from: one pool, or one per environment of a mix, each giving its
        share (by weight) of `tasks_per_step`, which must hold that many distinct tasks; and the
        curriculum over their categories (`curriculum.kind: success`)."""
        self.train_tasks = registry.tasks(config.env.id, config.env.train_split, config.env.kwargs)
        self.pools = task_pools(config.env.id, config.env.kwargs, self.train_tasks)
        self.mixed = len(self.pools) > 1
        if config.curriculum.categories:
            named = {category_of(t.env_id, t.category, self.mixed) for t in self.train_tasks}
            unknown = sorted(set(config.curriculum.categories) - named)
            if unknown:
                raise UserError(f"curriculum.categories: {config.env.train_split} has no category "
                                f"{', '.join(map(repr, unknown))}; it has {', '.join(map(repr, sorted(named)))}")
            self.pools = [(weight, only_categories(pool, config.curriculum.categories, self.mixed))
                          for weight, pool in self.pools]
        self.curriculum = SuccessCurriculum(config.algo.group_size, config.curriculum.memory,
                                            config.curriculum.explore, self.mixed) \
            if config.curriculum.kind == "success" else None
        for (weight, pool), quota in zip(self.pools, member_quotas([w for w, _ in self.pools],
                                                                    config.algo.tasks_per_step)):
            if quota > len(pool):
                where = f" of {pool[0].env_id}" if self.mixed and pool else ""
                kept = " in curriculum.categories" if config.curriculum.categories else ""
                raise UserError(f"algo.tasks_per_step={config.algo.tasks_per_step} asks for {quota} distinct tasks "
                                f"a step from the {len(pool)} {config.env.train_split} tasks{where}{kept}")

    # ----------------------------------------------------------------------------- setup
    def _setup(self, resume: bool) -> int:
        """Start the run, or reopen it at its newest readable checkpoint; returns the first step."""
        cfg = self.config
        options = dict(value_head=self.algorithm.needs_critic, entropy=self.algorithm.entropy_coef > 0,
                       temperature=cfg.algo.temperature)
        start, state = 0, None
        if resume and not holds_run(self.run_dir) and not checkpoints(self.run_dir):
            self.log(f"no run in {self.run_dir} yet; starting it")
            resume = False
        if self.rank > 0:  # the other ranks start from the checkpoint rank 0 wrote or resumed from
            self.session, state, start = self._join_rank_zero(options)
        elif resume:
            check_resumable(self.run_dir, cfg)
            check_writable(self.run_dir, "resume")  # else the first write would blame an intact checkpoint
            self.session, state, checkpoint = self._reopen(options)
            start = state["step"]
            self.log(f"resumed from {checkpoint} at step {start}")
            changed = resumed_changes(self.run_dir, cfg)
            if changed:
                self.log(f"note: resumed with settings other than those the run started with ({CONFIG}): "
                         f"{', '.join(changed)}")
        else:
            self.session = Session.start(cfg, self.log, already_running="use --resume or a new run.name", **options)
        self.tokenizer, self.learner = self.session.tokenizer, self.session.learner
        # The KL reference: the adapter-disabled base with LoRA (no copy), else a frozen copy.
        self.reference = None
        if self.algorithm.kl_coef > 0 and not cfg.model.lora_rank:
            self.reference = copy.deepcopy(self.session.model).eval().requires_grad_(False)
        if state is not None:
            torch.set_rng_state(state["torch_rng"])
            self.kl_control.load_state_dict(state["kl_control"])
            if self.reference is not None and "reference" in state:
                self.reference.load_state_dict(state["reference"])
            if self.curriculum is not None and "curriculum" in state:
                self.curriculum.load_state_dict(state["curriculum"])
        self.metrics = self.session.metrics
        if self.servers is not None and cfg.rollout.journal_every and self.rank == 0:
            key_file = self._snapshot_key_file
            key_file.parent.mkdir(exist_ok=True)
            key_file.touch(mode=0o600)
            key_file.write_text(self.servers.snapshot_key.hex())
        self.metrics.truncate_after(start)
        if self.world > 1 and self.rank == 0:
            if state is None:
                self.save(0)  # the weights (after the warm-up) every rank starts from
            distributed.broadcast(start)  # the other ranks wait for it in `_join_rank_zero`
        if distributed.in_group() and cfg.run.parallel == "fsdp":  # every rank now holds the same state
            self.learner.shard()
        cast = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else None
        if cast is not None and next(self.learner.model.parameters()).dtype == cast:
            cast = None  # the model is in bfloat16 already: nothing to copy
        if cast is not None:
            added = self.learner.detach_rollout_model(cast)
            self.log(f"rollouts sample from a bfloat16 copy of the model ({added / 2**20:.1f} MB), refreshed after "
                     "every update; the learner keeps float32 and recomputes the old logprobs")
        elif cfg.train.asynchronous:
            added = self.learner.detach_rollout_model()
        if cfg.train.asynchronous:
            self.log(f"asynchronous rollouts, at most {cfg.rollout.max_staleness} updates stale: the generator "
                     f"holds its own copy of the trainable weights ({added / 2**20:.1f} MB)")
        self.policy = self.session.policy(cfg.algo.temperature)
        # Validation samples the learner's current weights (the generator's may be older, or cast).
        self.val_policy = self.session.policy(cfg.eval.temperature, cfg.eval.listed_actions_only,
                                              model=self.learner.model if self.learner.rollout_copy else None)
        if cfg.rollout.workers:
            self.workers = self._start_workers()
        if self.rank > 0:  # the ranks loaded rank 0's random state; rollouts draw from per-episode streams,
            torch.manual_seed(cfg.run.seed + 7919 * self.rank + start)  # anything else a rank draws is its own
        return start

    @property
    def _snapshot_key_file(self) -> Path:
        """Where the key of the run's spawned servers is kept while it journals (`rollout.journal_every`)."""
        return self.run_dir / "inflight" / "snapshot.key"

    def _start_workers(self) -> Any:
        from ..rollout.ray_workers import RayRollouts

        cfg = self.config
        env = {"id": cfg.env.id, "kwargs": cfg.env.kwargs, "urls": cfg.env.urls, "timeout": cfg.env.server_timeout,
               "invalid_action_penalty": cfg.env.invalid_action_penalty, "reward": cfg.env.reward,
               "reward_mode": cfg.env.reward_mode, "judge": to_dict(cfg.env.judge)}
        plural = "s" if cfg.rollout.workers != 1 else ""
        self.log(f"starting {cfg.rollout.workers} Ray rollout worker{plural} ({cfg.rollout.workers_address})")
        return RayRollouts(cfg.rollout.workers, cfg.rollout.workers_address, self.learner.rollout_model,
                           self.tokenizer, env, self.engine.config, cfg.algo.temperature)

    def _play(self, tasks: list, horizon: int, sampling_seed: int, journal: Journal | None = None,
              between_turns: Callable[[], int] | None = None) -> list[Trajectory]:
        """A step's training episodes: `group_size` samples of each task, in the Ray workers or here,
        each from its own random stream of `sampling_seed` (kept in `journal`, if given;
        `between_turns`: partial rollouts' loader, `RolloutsAhead.load_newer`)."""
        cfg = self.config
        if self.workers is None:
            return self.engine.run(tasks, self.policy, horizon, samples=cfg.algo.group_size, seed=cfg.run.seed,
                                   sampling_seed=sampling_seed, journal=journal, between_turns=between_turns,
                                   greedy_samples=cfg.algo.greedy_samples)
        return self.workers.run(tasks, horizon, cfg.algo.group_size, cfg.run.seed, sampling_seed)

    def _out_of_time(self, fit_began: float, step_s: float, step: int) -> bool:
        """Whether the run should stop after `step` (the number of steps done; its last took
        `step_s` seconds) for `train.time_limit_min`, counted from `fit_began` (a `_clock()`
        reading), as rank 0's clock says (the ranks of a torchrun job stop after the same step)."""
        train = self.config.train
        if not train.time_limit_min:
            return False
        elapsed, limit = _clock() - fit_began, 60 * train.time_limit_min
        if train.time_limit_mode == "after":
            stop = elapsed >= limit
        else:
            stop = ends_past_limit(elapsed, limit, step_s, self.schedule.horizon(step - 1), self.schedule.horizon(step),
                                   self._timed["validation"] if validation_on(self.config) else 0.0,
                                   self._timed["save"] if train.save_every else 0.0)
        return bool(distributed.broadcast(stop))

    def sampling_seed(self, step: int, round_: int = 0) -> int:
        """The seed of the episode streams of a step (of refill round `round_` of its dynamic
        sampling): a pure function of (seed, step, round), so that an episode played again (a
        resume, another worker or rank) samples what it did."""
        return random.Random(f"{self.config.run.seed}-{step}-sampling-{round_}").getrandbits(63)

    def _join_rank_zero(self, options: dict[str, Any]) -> tuple[Session, dict[str, Any], int]:
        """A rank > 0's session: the model, optimizer and trainer state of the checkpoint at the
        step rank 0 starts from; it writes nothing to the run folder."""
        start = distributed.broadcast(None)
        checkpoint = self.run_dir / "checkpoints" / f"step_{start:06d}"
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
        return Session.resume(self.config, checkpoint, self.log, writes=False, **options), state, start

    def _reopen(self, options: dict[str, Any]) -> tuple[Session, dict[str, Any], Path]:
        """The session and trainer state of the newest checkpoint that loads; a damaged one (a
        write cut short) is skipped with a warning for the one before it."""
        found = checkpoints(self.run_dir)
        if not found:
            every = self.config.train.save_every
            why = f"a run saves every train.save_every={every} steps" if every else "train.save_every=0 writes none"
            raise UserError(f"cannot resume {str(self.run_dir)!r}: it has no checkpoint yet ({why}); start it again "
                            "under a new run.name, or delete the folder")
        for checkpoint in reversed(found):
            try:
                state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
                return Session.resume(self.config, checkpoint, self.log, **options), state, checkpoint
            except Exception as error:  # noqa: BLE001 — any unreadable file makes the checkpoint unusable
                reason = traceback.format_exception_only(type(error), error)[-1].strip()
                self.log(f"warning: checkpoint {checkpoint} cannot be loaded ({reason[:200]}); trying the one before")
        raise UserError(f"cannot resume {str(self.run_dir)!r}: none of its {len(found)} checkpoints loads")

    # ------------------------------------------------------------------------- main loop
    @holds_run_folder
    def fit(self, resume: bool = False) -> list[dict[str, Any]]:
        """Run until `train.steps`; returns the validation summaries logged.

        A step: take its episodes (played now, or ahead in a thread with `train.asynchronous`:
        one interface, `asynchronous.RolloutsNow` / `RolloutsAhead`), update on them, let the
        generators sample the new weights, log the step, save and validate when due, stop at the
        time limit, and hand the weights to the rollouts."""
        cfg = self.config
        fit_began = _clock()  # train.time_limit_min counts from here, model loading included
        start = self._setup(resume)
        run = _Progress(last_step=start)
        outer_log, rollouts = self.log, None
        try:
            run.validations += self._first_validations(start)
            bar = self._progress_bar(start, outer_log)
            rollouts = self._rollouts(start)
            for step in bar:
                step_began = _clock()  # the time limit's clock: a test replaces it
                played = rollouts.take(step)
                updated = time.time()
                trained, filtered = self._trained(played.trajectories)
                whole_step = played.trajectories if cfg.algo.filter_keeps_rare_actions else None
                update_metrics = {**played.metrics, **filtered, **rollouts.extra_metrics(played),
                                  **self.update(trained, step, whole_step)}
                self._sync_generators()
                run.last_step = done = step + 1
                out_of_time = done < cfg.train.steps and self._out_of_time(fit_began, _clock() - step_began, done)
                save = cfg.train.save_every > 0 and (done % cfg.train.save_every == 0 or done == cfg.train.steps
                                                     or out_of_time)
                if self.rank == 0:
                    self._record_step(done, played, update_metrics, updated, step_began, run, bar)
                self._save_and_validate(done, save, out_of_time, run)
                if out_of_time:
                    self._say_stopped(done, save, fit_began)
                    break
                rollouts.step_done(done)
        except OSError as error:
            if error.errno not in DISK_ERRORS:
                raise
            raise disk_stop(self.run_dir, error, "go on with `agentgym-rl train CONFIG --resume` (the same run.name)") \
                from None
        finally:
            self.log = outer_log
            self._close(rollouts)
        self._say_how_it_went(run, start, rollouts.stalenesses if rollouts is not None else ())
        return run.validations

    def _first_validations(self, start: int) -> list[Validation]:
        """The validation a run starts with (step 0's, or `train.baseline`'s instead), or the one a
        resumed run owes (the run stopped during it, or the resumed config makes it due)."""
        cfg = self.config
        if self.rank > 0:  # rank 0 validates
            return []
        first = start == 0 and validation_on(cfg)
        if cfg.train.baseline and not first:
            why = ("the run resumes after step 0" if start
                   else "step 0 does not validate (train.validate_every or eval.episodes is 0)")
            self.log(f"note: train.baseline is not used: {why}")
        if first:
            return [self.take_baseline(cfg.train.baseline) if cfg.train.baseline else self.validate(0)]
        if not validation_missing(self.run_dir, cfg, start):
            return []
        began = validation_journal(self.run_dir, start).is_file()
        self.log(f"step {start}: " + ("its validation did not finish before the run stopped; going on from its "
                                      "journal" if began else "its metrics hold no validation of it; validating now"))
        return [self.validate(start)]

    def _progress_bar(self, start: int, outer_log: Callable[[str], Any]) -> Any:
        """The run's progress bar (rank 0's); the trainer's lines then go above it."""
        from ..progress import progress_bar

        bar = progress_bar(range(start, self.config.train.steps), desc="RL", unit="step", initial=start,
                           total=self.config.train.steps, disable=self.rank > 0)
        if not bar.disable:  # lines go above the bar (cleared and redrawn), not into it
            def above_bar(line: str) -> None:
                with type(bar).external_write_mode():
                    outer_log(line)

            self.log = above_bar
        return bar

    def _rollouts(self, start: int) -> RolloutsNow | RolloutsAhead:
        """Where each step's episodes come from: played when taken, or ahead of the learner."""
        def play(step: int, between_turns: Callable[[], int] | None = None) -> Any:
            return self._play_step(step, self.schedule.horizon(step), between_turns)

        if not self.config.train.asynchronous:
            return RolloutsNow(play)
        return RolloutsAhead(play, self._load_generator, start, self.config.train.steps,
                             self.config.rollout.max_staleness, torch.get_num_threads(),
                             snapshot=self.learner.trainable_state, partial=self.config.train.partial_rollouts)

    def _sync_generators(self) -> None:
        """After an update, the generators sample the new weights. Played ahead, the rollouts'
        own copy loads them between its steps (`RolloutsAhead.step_done` publishes them); the
        validation samples the learner's model."""
        if self.config.train.asynchronous:
            self.val_policy.sync_weights(self.learner.model)
            return
        weights = self.learner.gather_weights()
        for policy in (self.policy, self.workers):
            if policy is not None:
                policy.sync_weights(weights)
        self.val_policy.sync_weights(self.learner.model if self.learner.rollout_copy else weights)

    def _record_step(self, step: int, played: PlayedStep, update_metrics: dict[str, float], updated: float,
                     step_began: float, run: _Progress, bar: Any) -> None:
        """Log step `step` (1-based): its metrics line, console line and progress, why it
        updated nothing if it did not, and its trajectories."""
        trajectories = played.trajectories
        stats = summarize(trajectories)
        generated = sum(sum(t.loss_mask) for t in trajectories)
        horizon = self.schedule.horizon(step - 1)
        step_metrics = {
            metric.HORIZON: horizon, metric.TRAIN_SUCCESS: stats.success, metric.TRAIN_REWARD: stats.avg_reward,
            metric.TRAIN_REWARD_STD: stats.reward_std, metric.TRAIN_REPLY_TOKENS: stats.reply_tokens,
            metric.TRAIN_TURNS: stats.avg_turns, metric.TRAIN_INVALID_ACTION_RATE: stats.invalid_action_rate,
            metric.TRAIN_IDLE_TURN_RATE: stats.idle_turn_rate, metric.TRAIN_ERRORS: stats.errors, **update_metrics,
            metric.TIME_ROLLOUT_TOKENS_PER_S: generated / max(played.rollout_s, 1e-9),
            metric.TIME_ROLLOUT_S: played.rollout_s, metric.TIME_UPDATE_S: time.time() - updated,
            metric.TIME_STEP_S: _clock() - step_began, **device_peak_gb(self.session.device),
            **(per_env_metrics("train", stats) if self.mixed else {}),
        }
        if self.config.algo.greedy_samples:
            step_metrics[metric.TRAIN_GREEDY_SUCCESS] = greedy_success(trajectories, self.config.algo.greedy_samples)
        self.metrics.log(step, step_metrics)
        self.log(step_line(step, self.config.train.steps, step_metrics))
        bar.set_postfix(success=f"{stats.success:.2f}", horizon=horizon)
        reason = no_update_reason(update_metrics)
        if reason is not None:
            run.idle[step] = reason
            self.log(f"step {step}: no update: {reason}")
        if self.config.train.save_trajectories:
            save_trajectories(trajectories, self.run_dir / "trajectories" / f"step_{step:06d}.jsonl")

    def _save_and_validate(self, step: int, save: bool, out_of_time: bool, run: _Progress) -> None:
        """Save after step `step` when `save`, then validate when due: the save first, since a
        validation may take longer than the step (SmolLM2 on a CPU: 40 min+). Other ranks only
        help a sharded learner gather what rank 0 writes."""
        train = self.config.train
        if self.rank > 0:
            if save and self.learner.sharded:
                self.save(step)
            return
        if save:
            self.save(step)
            if train.keep_checkpoints:
                for folder in prune_checkpoints(self.run_dir, train.keep_checkpoints):
                    self.log(f"deleted checkpoint {folder.name} (train.keep_checkpoints={train.keep_checkpoints})")
        if validation_due(self.config, step) or (out_of_time and validation_on(self.config)):
            run.validations.append(self.validate(step))

    def _say_stopped(self, step: int, saved: bool, fit_began: float) -> None:
        train = self.config.train
        then = ("`agentgym-rl train CONFIG --resume` (the same run.name) goes on from it" if saved
                else "it wrote no checkpoint to go on from (train.save_every=0)")
        limit = f"train.time_limit_min={train.time_limit_min:g}"
        why = (f"{limit} reached" if train.time_limit_mode == "after"
               else f"another step would end past {limit} (time_limit_mode: within)")
        self.log(f"stopped after step {step} of {train.steps}: {why} ({(_clock() - fit_began) / 60:.1f} min); {then}")

    def _close(self, rollouts: RolloutsNow | RolloutsAhead | None) -> None:
        """What the run holds goes with it: the rollouts ahead (before their environments), the
        environments kept for reuse (JVMs, server instances), servers, workers, the metrics."""
        if rollouts is not None:
            rollouts.close()
        self.engine.close()
        self.val_engine.close()
        if self.servers is not None:
            self.servers.close()
        if self.workers is not None:
            self.workers.close()
        self.metrics.close()

    def _say_how_it_went(self, run: _Progress, start: int, stalenesses: Sequence[int]) -> None:
        """The run's closing lines: steps that updated nothing, how stale the data was, and the
        validation's change from first to last."""
        ran = run.last_step - start
        if run.idle:
            self.log(f"{len(run.idle)} of {ran} steps updated nothing (steps {', '.join(map(str, run.idle))}): see "
                     "the 'no update' lines above")
        elif ran:  # a resume that only played a missing validation trained no step
            self.log("the step updated the policy" if ran == 1 else f"all {ran} steps updated the policy")
        if stalenesses:
            counts = ", ".join(f"{k} updates old: {n}" for k, n in staleness_histogram(list(stalenesses)).items())
            self.log(f"steps trained on data {counts}")
        change = self._validation_change(run.validations)
        if change is not None:
            self.log(change)

    def _validation_change(self, validations: list[Validation]) -> str | None:
        """The run's first validation against its last, item by item, in a line; the first comes
        from `validation/` when this invocation resumed the run after it. None without two
        validations of the same items."""
        if not validations or self.rank > 0:
            return None
        first, last = validations[0].item_success, validations[-1].item_success
        first_step = validations[0].step
        earliest = min((self.run_dir / "validation").glob("step_*.jsonl"), default=None)
        earliest_step = int(earliest.stem.split("_")[1]) if earliest is not None else first_step
        if earliest_step < first_step:
            first_step, first = earliest_step, item_success(load_trajectories(earliest))
        if first_step == validations[-1].step or set(first) != set(last):
            return None
        before, after = (100 * sum(v.values()) / len(v) for v in (first, last))
        return (f"validation success, step {first_step} → {validations[-1].step}: {before:.1f}% → {after:.1f}%, "
                f"{change_sentence(first, last)}")

    def _load_generator(self, weights: dict[str, torch.Tensor]) -> None:
        """Published weights into the generator's own copy (`train.asynchronous`, in its thread)."""
        self.learner.load_rollout_state(weights)
        self.policy.sync_weights(self.learner.rollout_model)  # its KV cache held the old weights' keys

    def sample_tasks(self, step: int) -> list:
        """The tasks of a step: a pure function of (seed, step) and, with `curriculum.kind:
        success`, the success counts of the steps before it, so resume replays them. In a mix,
        each environment gives its share by weight (`member_quotas`)."""
        rng = random.Random(f"{self.config.run.seed}-{step}")
        quotas = member_quotas([weight for weight, _ in self.pools], self.config.algo.tasks_per_step)
        return [task for (_, pool), quota in zip(self.pools, quotas) for task in self._draw(step, pool, quota, rng)]

    def _draw(self, step: int, pool: list, count: int, rng: random.Random) -> list:
        """`count` distinct tasks of `pool`: evenly, or by the curriculum's category shares."""
        if self.curriculum is None:
            return rng.sample(pool, count)
        return self.curriculum.draw(step, pool, count, rng)

    def refill_tasks(self, step: int, round_: int, count: int, played: list) -> list:
        """`count` tasks for refill round `round_` of a step's dynamic sampling, none of the
        `played` ones while enough others are left: a pure function of (seed, step, round,
        played), so resume and every torchrun rank draw the same. In a mix, each environment
        gives its share by weight, as in `sample_tasks`."""
        rng = random.Random(f"{self.config.run.seed}-{step}-refill-{round_}")
        seen = {task.item_id for task in played}
        refill = []
        quotas = member_quotas([weight for weight, _ in self.pools], count)
        for (_, pool), quota in zip(self.pools, quotas):
            fresh = [task for task in pool if task.item_id not in seen]
            refill += self._draw(step, fresh if len(fresh) >= quota else pool, min(quota, len(pool)), rng)
        return refill

    def _play_step(self, step: int, horizon: int,
                   between_turns: Callable[[], int] | None = None) -> tuple[list[Trajectory], dict[str, float]]:
        """The step's episodes, `group_size` of each task, and the `sampling/*` metrics (and
        `rollout/retried_episodes` with `rollout.episode_retries`).

        Each rank plays its share of the tasks (whole groups) and all see every trajectory;
        a group id is the task's index among all the step's tasks, as in one process. With
        `algo.dynamic_sampling` k, the groups short of `tasks_per_step` with a reward spread
        are refilled with new tasks, up to k rounds."""
        algo = self.config.algo
        tasks, played_tasks, trajectories = self.sample_tasks(step), [], []
        with_signal: set[int] = set()
        rounds, retried = 0, self.engine.retried
        journaled, resumed, began = self.engine.journal_s, self.engine.resumed, time.perf_counter()
        reread = self.engine.reread
        weights = weights_fingerprint(self.learner.rollout_model) if self.config.rollout.journal_every else ""
        fingerprint_s = time.perf_counter() - began
        while True:
            journal = Journal(self.run_dir / "inflight" / f"step_{step + 1:06d}_round_{rounds}.journal",
                              key=f"{step}/{rounds}/{weights}", every=self.config.rollout.journal_every) \
                if weights else None
            played = self._play(tasks[self.rank::self.world], horizon, self.sampling_seed(step, rounds), journal,
                                between_turns)
            for trajectory in played:
                trajectory.group = len(played_tasks) + self.rank + trajectory.group * self.world
            new = distributed.gather(played)
            trajectories += new
            played_tasks += tasks
            with_signal |= groups_with_reward_spread(new)
            missing = algo.tasks_per_step - len(with_signal)
            if missing <= 0 or rounds == algo.dynamic_sampling:
                break
            rounds += 1
            tasks = self.refill_tasks(step, rounds, missing, played_tasks)
        metrics = {metric.ROLLOUT_RETRIED_EPISODES: self.engine.retried - retried} if self.config.rollout.episode_retries \
            else {}
        if self.servers is not None:  # over the run so far
            metrics[metric.ENV_SERVER_RESTARTS] = self.servers.restarts
        if weights:
            metrics.update({metric.TIME_JOURNAL_S: self.engine.journal_s - journaled + fingerprint_s,
                            metric.ROLLOUT_JOURNAL_MB: self.engine.journal_bytes / 2**20,
                            metric.ROLLOUT_RESUMED_EPISODES: self.engine.resumed - resumed,
                            # finished before the stop: read back, so this step's rollout time is not a rollout's
                            metric.ROLLOUT_REREAD_EPISODES: self.engine.reread - reread})
        if self.config.rollout.keep_turns:
            metrics.update(context_metrics(trajectories, self.config.rollout.summarize))
        if self.curriculum is not None:  # what this step drew with, then its own counts
            metrics.update(self._curriculum_metrics(step))
            self.curriculum.record(step, trajectories)
        if not algo.dynamic_sampling:
            return trajectories, metrics
        return trajectories, {**metrics, metric.SAMPLING_REFILL_ROUNDS: rounds,
                              metric.SAMPLING_EXTRA_GROUPS: len(played_tasks) - algo.tasks_per_step,
                              metric.SAMPLING_GROUPS_WITH_SIGNAL: len(with_signal)}

    def _curriculum_metrics(self, step: int) -> dict[str, float]:
        """Each category's share of step `step`'s draws (in a mix, of its environment's) and the
        success rate it was drawn from."""
        metrics = {}
        for _, pool in self.pools:
            categories = sorted({category_of(task.env_id, task.category, self.mixed) for task in pool})
            rates = self.curriculum.rates(step, categories)
            for category, share in self.curriculum.shares(step, categories).items():
                metrics[metric.curriculum_share(category)] = share
                metrics[metric.curriculum_success(category)] = rates[category]
        return metrics

    # ---------------------------------------------------------------------------- update
    def _trained(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """The step's episodes the update trains on, and the filter's metrics: all of them, or with
        `algo.dynamic_sampling_filter` only the groups DAPO's filter keeps (the step's success,
        reward and saved episodes still cover them all); with `algo.filter_keeps_rare_actions`
        the tied groups where a verb rare over the step's trainable episodes was tried fill the
        places left, as the bonus counts over the same episodes (`update`'s `whole_step`)."""
        algo = self.config.algo
        if not algo.dynamic_sampling_filter:
            return trajectories, {}
        if not algo.filter_keeps_rare_actions:
            kept, dropped = dapo_filter(trajectories, algo.tasks_per_step)
            return kept, {metric.SAMPLING_GROUPS_DROPPED: dropped}
        rows = trainable(trajectories)
        rare = rare_verbs([t.action_verbs for t in rows], self.algorithm.rare_action_share)
        with_rare = {t.group for t in rows if rare.intersection(t.action_verbs)}
        kept, dropped = dapo_filter(trajectories, algo.tasks_per_step, fallback=with_rare)
        tied = {t.group for t in kept} - groups_with_reward_spread(trajectories)
        return kept, {metric.SAMPLING_GROUPS_DROPPED: dropped, metric.SAMPLING_RARE_ACTION_GROUPS: len(tied)}

    def update(self, trajectories: list[Trajectory], step: int,
               whole_step: list[Trajectory] | None = None) -> dict[str, float]:
        """Advantages by the algorithm's estimator, then `epochs` passes of the recipe's objective
        (`algos.rl_objective`: the policy loss plus value, KL, right-token and entropy terms as
        configured) over shuffled minibatches. `whole_step`: every episode the step played,
        where a filter chose `trajectories` from them and `rare_action_bonus` counts verbs over
        them all (None: over `trajectories`)."""
        algo, beta = self.config.algo, self.kl_control.value
        # An episode cut short by an environment failure has no honest outcome: it is left out
        # (its group compares the others), and counted.
        rows = trainable(trajectories)
        metrics: dict[str, float] = {metric.KL_COEF: beta, metric.UPDATE_TRAJECTORIES: 0,
                                     metric.UPDATE_FAILED_LEFT_OUT: sum(t.error is not None for t in trajectories)}
        if not rows:
            return metrics
        # The recipe with the β in force (an adaptive controller moves it), for the advantage
        # (a KL in the reward) and the objective.
        context = _LossContext(dataclasses.replace(self.algorithm, kl_coef=beta), LogprobGap(),
                               gap_in_loss=not algo.recompute_old_logprobs)
        spec = context.spec
        batch = collate(rows, self.tokenizer.pad_token_id, right_tokens=spec.right_token_coef > 0)
        # Values and a KL in the reward enter the advantages: score every row first. Otherwise
        # only the rows kept for the update are scored (below), which saves a forward pass
        # over the rows of groups without signal.
        score_first = spec.needs_critic or spec.kl_in_reward
        if score_first:
            metrics[metric.TIME_SCORE_S] = self._score(batch, beta, context.gap)
        counted = None if whole_step is None else [t.action_verbs for t in trainable(whole_step)]
        advantages = self._advantages(batch, rows, spec, metrics, counted)
        keep = self._rows_with_signal(batch, advantages.keep, spec, metrics)
        metrics[metric.UPDATE_TRAJECTORIES] = len(keep)
        if len(keep) == 0:
            return metrics
        batch = batch.rows(keep)
        # In an update of one optimizer step the weights that score the old logprobs are the
        # ones the step's own forward pass runs with: their logprobs there, detached, are the
        # old ones (PPO's ratio is 1, as TRL takes it at one iteration), and no pass of their own runs.
        context.old_in_loss = (algo.recompute_old_logprobs and not score_first and spec.epochs == 1
                               and len(keep) <= algo.minibatch_size)
        if context.old_in_loss:
            context.gap_in_loss = True
            if spec.tis_cap is not None:
                batch.generator_logprobs = batch.old_logprobs
        if not score_first:
            metrics[metric.TIME_SCORE_S] = self._score(batch, beta, context.gap, old=not context.old_in_loss)
        metrics.update(self._optimize(batch, context, step))
        metrics.update(context.gap.metrics())
        if beta > 0 and metric.UPDATE_KL in metrics:
            self.kl_control.update(metrics[metric.UPDATE_KL], n_steps=len(rows))
        return metrics

    def _check_env_reports(self, config: RLConfig) -> None:
        """Refuse (or, where some environments of a mix report it, warn about) credit that needs
        what the run's environments do not report: state keys, discoveries."""
        if "state_ids" in advantage_inputs(self.algorithm.advantage)[1]:
            stateless = self._lacking(config, "state_keys")
            if stateless:
                what = f"{stateless[0]}, so {config.algo.name}'s step-level advantage is 0 there"
                if not config.algo.without_state_keys:
                    raise UserError(f"{what}: choose another algorithm, or algo.without_state_keys=true to train on "
                                    "the episode level alone there")
                self.log(f"warning: {what} and it trains on the episode-level one alone")
        # Settings paid from what only some environments report: refused where none reports it.
        for setting, value, feature, effect in (
                ("algo.idle_turn_penalty", self.algorithm.idle_turn_penalty, "state_keys",
                 "no turn would count as idle"),
                ("algo.discovery_bonus", self.algorithm.discovery_bonus, "discoveries",
                 "the bonus would never be paid")):
            lacking = None if value is None else self._lacking(config, feature)
            if lacking is None:
                continue
            what, everywhere = lacking
            if everywhere:
                raise UserError(f"{setting}: {what}, so {effect}: drop it")
            self.log(f"warning: {setting}: {what}: it applies on the other environments of the mix only")

    @staticmethod
    def _lacking(config: RLConfig, feature: str) -> tuple[str, bool] | None:
        """Which of the run's environments lack `feature` (`registry.lacking`), said as "search
        names no states (info['state_key'])", and whether all of them do; None where none does."""
        lacking = registry.lacking(config.env.id, config.env.kwargs, feature, config.env.urls)
        if not lacking:
            return None
        names, one = ", ".join(lacking), len(lacking) == 1
        what = (f"{names} name{'s' if one else ''} no states (info['state_key'])" if feature == "state_keys" else
                f"{names} report{'s' if one else ''} nothing discovered (info['discovered'])")
        if registry.on_agentgym_servers(config.env.urls):
            what += " on AgentGym's servers, whose protocol sends no step info"
        return what, len(lacking) == len(registry.members(config.env.id, config.env.kwargs))

    def _advantages(self, batch: TokenBatch, rows: list[Trajectory], spec: AlgorithmSpec,
                    metrics: dict[str, float], counted_verbs: list[list[str]] | None = None) -> Any:
        """Set `batch.advantages` (B, T) and `batch.returns` from the recipe's estimator, then
        discredit the turns that cannot have helped and add the bonuses of rare actions (rare in
        `counted_verbs`, or in `rows`) and of actions that discovered something; returns the
        estimator's output (its `keep`)."""
        mask = batch.loss_mask
        fields = advantage_fields(rows, mask, batch.old_values, spec.advantage)
        if spec.kl_in_reward:  # with the KL in the reward, kl_coef is β
            fields["kl"] = KL[spec.kl_estimator](batch.old_logprobs, batch.ref_logprobs) * mask \
                if spec.kl_coef > 0 else torch.zeros_like(mask)
        out = compute_advantages(spec.advantage, fields, **spec.advantage_kwargs())
        metrics.update({metric.adv(k): float(v) for k, v in out.metrics.items()})
        batch.advantages = out.token_advantages(mask)
        # Turns that cannot have helped the outcome: rejected ones, and accepted ones that changed
        # nothing. Each keeps no positive advantage from the token where its action went wrong (or
        # began), and that token gets a further -penalty.
        for kind, penalty, turns, tokens in (("invalid", spec.invalid_turn_penalty, "invalid_turns", "wrong_tokens"),
                                             ("idle", spec.idle_turn_penalty, "idle_turns", "idle_tokens")):
            if penalty is None:
                continue
            positions = [getattr(t, tokens) for t in rows]
            batch.advantages, capped = discredit_turns(batch.advantages, mask, [getattr(t, turns) for t in rows],
                                                       positions)
            batch.advantages = penalize_tokens(batch.advantages, positions, penalty)
            metrics[metric.adv(f"{kind}_tokens_capped")] = capped
            metrics[metric.adv(tokens)] = sum(map(len, positions))  # how many were located
        if spec.rare_action_bonus is not None:
            positions, rare = rare_action_tokens([t.action_tokens for t in rows], [t.action_verbs for t in rows],
                                                 spec.rare_action_share, counted_over=counted_verbs)
            batch.advantages = add_at_tokens(batch.advantages, positions, spec.rare_action_bonus)
            metrics[metric.adv("action_tokens")] = sum(len(t.action_tokens) for t in rows)
            metrics[metric.adv("rare_action_tokens")] = sum(map(len, positions))
            metrics[metric.adv("rare_verbs")] = len(rare)
        if spec.discovery_bonus is not None:
            positions = [t.discovery_tokens for t in rows]
            batch.advantages = add_at_tokens(batch.advantages, positions, spec.discovery_bonus)
            metrics[metric.adv("discovery_tokens")] = sum(map(len, positions))
        # As the loss sees them: "adv/adv_abs_mean" is the estimator's, before turns are discredited
        # and wrong tokens penalised, so it stays 0 where only the penalty gives a signal.
        metrics[metric.ADV_TOKEN_ABS_MEAN] = masked_mean(batch.advantages.abs(), mask).item()
        batch.returns = out.returns
        return out

    def _rows_with_signal(self, batch: TokenBatch, kept: torch.Tensor, spec: AlgorithmSpec,
                          metrics: dict[str, float]) -> torch.Tensor:
        """The indices of the rows the update trains on: those the estimator `kept` (B,) and,
        unless another term reads them, with a signal (an advantage or a right token)."""
        # A row with zero advantage adds nothing to the policy gradient; without a KL, value or
        # entropy term it adds only compute and tokens to the mean, so it is skipped (as DAPO's
        # dynamic sampling does).
        other_terms = spec.needs_critic or (spec.kl_coef > 0 and not spec.kl_in_reward) or spec.entropy_coef > 0
        signal = batch.advantages.abs().sum(1) > 0
        if batch.right_ids is not None:  # the right-token loss needs no advantage
            has_right = batch.right_token_positions()
            signal |= has_right.any(1)
            metrics[metric.ADV_RIGHT_TOKEN_POSITIONS] = int(has_right.sum())
        keep = kept & signal if self.config.algo.skip_zero_advantage and not other_terms else kept
        return keep.nonzero().squeeze(1)

    def _optimize(self, batch: TokenBatch, context: _LossContext, step: int) -> dict[str, float]:
        """`epochs` passes over shuffled minibatches of `batch`, one optimizer step each; the
        `update/*` metrics, averaged over the steps."""
        algo, spec = self.config.algo, context.spec
        rng = torch.Generator().manual_seed(self.config.run.seed * 100_003 + step)
        weight_by = "tokens" if spec.aggregation == "token-mean" else "sequences"
        skip = ("approx_kl", algo.max_kl) if algo.max_kl > 0 else None
        loss = functools.partial(self._loss, context)
        summed: dict[str, float] = {}
        updates = 0
        for _ in range(spec.epochs):
            order = torch.randperm(batch.size, generator=rng)
            for start in range(0, batch.size, algo.minibatch_size):
                # With torchrun each rank takes every world-th row; the learner sums their gradients.
                minibatch = batch.rows(order[start:start + algo.minibatch_size][self.rank::self.world])
                result = self.learner.update(minibatch, loss, weight_by, skip_above=skip)
                context.gap_in_loss = False
                for key, value in result.items():
                    summed[key] = summed.get(key, 0.0) + value
                updates += 1
        metrics = {metric.update(k): v / updates for k, v in summed.items() if k != "skipped"}
        metrics[metric.UPDATE_SKIPPED_STEPS] = summed.get("skipped", 0.0)
        metrics[metric.UPDATE_OPTIMIZER_STEPS] = updates
        return metrics

    def _score(self, batch: TokenBatch, beta: float, gap: LogprobGap, old: bool = True) -> float:
        """Add the rows' old logprobs (recomputed by the learner, unless `old` is False; `gap`
        measures them against the generator's), old values (with a critic) and reference
        logprobs (with a KL term) to `batch`, in place; returns the seconds taken (part of the
        step's `time/update_s`)."""
        began = time.time()
        if (old and self.config.algo.recompute_old_logprobs) or self.algorithm.needs_critic:
            scored = self.learner.outputs(batch)
            if old and self.config.algo.recompute_old_logprobs:
                gap.add(batch.old_logprobs, scored.logprobs, batch.loss_mask)
                if self.algorithm.tis_cap is not None:
                    batch.generator_logprobs = batch.old_logprobs
                batch.old_logprobs = scored.logprobs * batch.loss_mask
            if self.algorithm.needs_critic:
                batch.old_values = scored.values
        if beta > 0:
            batch.ref_logprobs = self._reference_logprobs(batch)
        return time.time() - began

    def _reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        if self.reference is None:
            return self.learner.logprobs(batch, reference=True)
        return self.learner.logprobs(batch, model=self.reference)

    @staticmethod
    def _loss(context: _LossContext, batch: TokenBatch,
              outputs: TokenOutputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The recipe's objective (`algos.rl_objective`) on one micro-batch, with β as it is now."""
        if context.gap_in_loss:  # before the step's first optimizer step: the sampling policy's weights
            context.gap.add(batch.old_logprobs, outputs.logprobs.detach(), batch.loss_mask)
        old = outputs.logprobs.detach() * batch.loss_mask if context.old_in_loss else batch.old_logprobs
        inputs = {"logprobs": outputs.logprobs, "values": outputs.values, "entropy": outputs.entropy,
                  "right_logprobs": outputs.right_logprobs, "old_logprobs": old,
                  "generator_logprobs": batch.generator_logprobs, "advantages": batch.advantages,
                  "mask": batch.loss_mask, "old_values": batch.old_values, "returns": batch.returns,
                  "ref_logprobs": batch.ref_logprobs,
                  "right_mask": batch.right_token_positions() if batch.right_ids is not None else None,
                  "row_weights": batch.row_weights}
        return rl_objective(context.spec, inputs)

    # ------------------------------------------------------------------ validate and save
    def validate(self, step: int) -> Validation:
        """Success on held-out items at the evaluation horizon; logged as val/*."""
        from ..progress import count_as_done, progress_bar

        began = _clock()
        evaluation = self.config.eval
        horizon = evaluation.max_turns or registry.spec(self.config.env.id).max_turns
        episodes = len(self.val_tasks) * evaluation.samples
        journal = None
        if self.config.rollout.journal_every:  # a validation cut short goes on from here on --resume
            journal = Journal(validation_journal(self.run_dir, step),
                              key=f"validation/{step}/{weights_fingerprint(self.learner.rollout_model)}",
                              every=self.config.rollout.journal_every)
        resumed, reread = self.val_engine.resumed, self.val_engine.reread
        with progress_bar(total=episodes, desc=f"validation (step {step})", unit="ep", leave=False) as bar:
            trajectories = self.val_engine.run(self.val_tasks, self.val_policy, horizon, samples=evaluation.samples,
                                               seed=self.config.run.seed, progress=bar.update,
                                               sampling_seed=self.config.run.seed, journal=journal,
                                               reread_progress=lambda n: count_as_done(bar, n))
        if self.val_engine.resumed > resumed or self.val_engine.reread > reread:
            self.log(f"step {step}: the validation went on from its journal ({self.val_engine.reread - reread} "
                     f"finished episodes kept, {self.val_engine.resumed - resumed} unfinished ones continued)")
        summary = self._record_validation(step, trajectories)
        if journal is not None:  # the metrics hold it now
            journal.path.unlink(missing_ok=True)
        self._timed["validation"] = _clock() - began
        return summary

    def take_baseline(self, path: str) -> Validation:
        """Step 0's validation from `path` (`train.baseline`), once the first turn of every item,
        played now, matches it (`baseline.check_baseline`); logged and saved as `validate(0)` would."""
        from ..progress import progress_bar
        from .baseline import (PLAYING_KEYS, check_baseline, check_file, donor_differences, donor_settings,
                               settings_path)

        evaluation = self.config.eval
        if evaluation.temperature != 0:
            raise UserError(f"train.baseline reuses a greedy validation; this run validates at eval.temperature="
                            f"{evaluation.temperature:g} (set it to 0, or drop train.baseline)")
        donor = donor_settings(path)
        differences = donor_differences(donor, to_dict(self.config)) if donor is not None else []
        if donor is None:  # a copy without its settings file, e.g. one kept before settings files existed
            self.log(f"note: train.baseline {path!r} is in no run folder and has no {settings_path(path).name} "
                     f"beside it, so the settings that change its episodes after their first turn "
                     f"({', '.join(f'{s}.{k}' for s, k in PLAYING_KEYS)}) are taken on trust; bench/keep_baseline.py "
                     "keeps a run's step 0 with them")
        if differences:
            raise UserError(f"train.baseline {path!r} was played with settings other than this run's, which change "
                            f"its episodes after their first turn: {', '.join(differences)}; play step 0 (drop "
                            "train.baseline)")
        saved = load_trajectories(path)
        check_file(saved, len(self.val_tasks) * evaluation.samples,
                   evaluation.max_turns or registry.spec(self.config.env.id).max_turns,
                   self.config.rollout.max_new_tokens, path)
        with progress_bar(total=len(self.val_tasks), desc="checking the baseline's first turns", unit="ep",
                          leave=False) as bar:
            replayed = self.val_engine.run(self.val_tasks, self.val_policy, 1, seed=self.config.run.seed,
                                           progress=bar.update)
        check_baseline(saved, replayed, evaluation.samples, path)
        self.log(f"step 0: validation taken from {path} (the first turn of all {len(replayed)} items replayed "
                 "identically)")
        return self._record_validation(0, saved)

    def _record_validation(self, step: int, trajectories: list[Trajectory]) -> Validation:
        """Save, log and summarise a validation's episodes."""
        stats = summarize(trajectories)
        if self.config.train.save_trajectories:  # per-item results, for paired comparisons of runs
            save_trajectories(trajectories, self.run_dir / "validation" / f"step_{step:06d}.jsonl")
        self.metrics.log(step, {metric.VAL_SUCCESS: stats.success, metric.VAL_REWARD: stats.avg_reward,
                                **{metric.category_success("val", c): v for c, v in stats.by_category.items()},
                                **(per_env_metrics("val", stats) if self.mixed else {})})
        per_env = "".join(f", {env_id} {env.success:.3f}" for env_id, env in stats.by_env.items()
                          if self.mixed)
        self.log(f"step {step}: validation success {stats.success:.3f} on {stats.episodes} items{per_env}")
        return Validation(step, stats, item_success(trajectories))

    def save(self, step: int) -> None:
        """Write `checkpoints/step_<step>/` (rank 0; with FSDP every rank calls it)."""
        began = _clock()
        model_dir = self.session.save(f"step_{step:06d}")
        if self.rank > 0:
            return
        folder = model_dir.parent
        state = {"step": step, "torch_rng": torch.get_rng_state(), "kl_control": self.kl_control.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict(before=step)
        torch.save(state, folder / "trainer_state.pt")
        # The journals of the steps this checkpoint holds are no longer needed to resume.
        for journal in (self.run_dir / "inflight").glob("step_*.journal"):
            if int(journal.name.split("_")[1]) <= step:
                journal.unlink(missing_ok=True)
        self._timed["save"] = _clock() - began
