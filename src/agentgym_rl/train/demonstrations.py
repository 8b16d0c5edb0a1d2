"""Expert demonstrations: playing an environment's expert (in several processes), and the
supervised warm-up on its successful episodes."""

from __future__ import annotations

import multiprocessing
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from ..progress import progress_bar

from ..agent.chat import ChatEncoder
from ..config import RolloutConfig, WarmupConfig
from ..envs import registry
from ..envs.parsing import drop_thought
from ..envs.tasks import Task
from ..errors import UserError
from ..envs.base import TextEnv
from ..rollout.engine import RolloutEngine
from ..rollout.policy import Reply, as_policy
from ..rollout.trajectory import Trajectory
from .finetune import plan_batches, prepare_sft_data, sft_epochs
from .learner import Learner


EPISODES_PER_PROCESS = 32
"""Fewest expert episodes worth a process of their own (each costs a fork and sending its episodes back)."""


def collect_expert(env_id: str, split: str, episodes: int, seed: int = 0, max_turns: int | None = None,
                   rollout: RolloutConfig | None = None, env_kwargs: dict | None = None,
                   progress: Any = None, env_urls: list[str] = (), env_timeout: float = 60.0,
                   perturb: float = 0.0) -> list[Trajectory]:
    """Run the environment's expert on the first `episodes` tasks of `split` (with `perturb`, a
    `PerturbedExpert` of that rate).

    With `rollout.expert_processes` other than 1 and enough episodes, slices of the tasks are
    played in separate processes; the result is the same list (same order and group ids)."""
    rollout = rollout or RolloutConfig()
    tasks = registry.tasks(env_id, split, env_kwargs)[:episodes]
    horizon = max_turns or registry.spec(env_id).max_turns
    processes = min(rollout.expert_processes or len(os.sched_getaffinity(0)), len(tasks) // EPISODES_PER_PROCESS)
    # "fork": children inherit the registry (with envs registered at run time) and need no
    # `if __name__ == "__main__"` guard in the caller's script; they run no torch code.
    if processes <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _play_expert(env_id, tasks, horizon, seed, rollout, env_kwargs, env_urls, env_timeout, perturb, progress)
    # Small slices handed out as processes free up keep both the load and the progress bar even.
    size = max(1, min(16, len(tasks) // (4 * processes)))
    slices = [tasks[start:start + size] for start in range(0, len(tasks), size)]
    trajectories: list[Trajectory] = []
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_play_expert, env_id, part, horizon, seed, rollout, env_kwargs, env_urls, env_timeout,
                               perturb) for part in slices]
        for offset, future in zip(range(0, len(tasks), size), futures):
            played = future.result()
            trajectories += [replace(t, group=t.group + offset) for t in played]
            if progress is not None:
                progress(len(played))
    return trajectories


def _play_expert(env_id: str, tasks: list[Task], horizon: int, seed: int, rollout: RolloutConfig,
                 env_kwargs: dict | None, env_urls: list[str], env_timeout: float, perturb: float = 0.0,
                 progress: Any = None) -> list[Trajectory]:
    expert = registry.make_expert(env_id)
    if perturb:
        expert = PerturbedExpert(expert, perturb, seed)
    with RolloutEngine(registry.env_factory(env_id, env_kwargs, env_urls, env_timeout), rollout) as engine:
        return engine.run(tasks, expert, horizon, seed=seed, progress=progress)


class PerturbedExpert:
    """The expert, except that each turn is with probability `rate` a perturbation: an action
    it would not take, kept in the demonstration as context but not trained on (`Reply.trained`).
    The expert then recovers from where the perturbation led, and those turns are trained: the
    states a learner reaches after its own mistakes, with what to do there (DART, Laskey et al.
    2017). A demonstration of the unperturbed expert never shows a rejected action, so a model
    imitating it has never seen how to go on after one.

    The perturbation is, half the time, an action listed earlier in the episode but not now
    (often rejected: the mistake of a model that copies names from earlier turns), else one of
    the actions listed now. Draws depend only on `seed`, the episode's first observation and the
    turn, so the demonstrations do not depend on how episodes are spread over processes (episodes
    that open with the same observation are perturbed alike).
    """

    encoder = None  # a text policy (the `Policy` protocol): the engine encodes nothing

    def __init__(self, expert: Any, rate: float, seed: int):
        if not 0 < rate < 1:
            raise ValueError(f"the perturbation rate must be in (0, 1), got {rate}")
        self.expert = as_policy(expert)
        self.rate = rate
        self.seed = seed
        self._listed: dict[int, tuple[str, set[str]]] = {}
        """Per environment: its episode's first observation and the actions listed so far."""

    def reset(self) -> None:
        self.expert.reset()

    def act(self, envs: list[TextEnv], prompts: list[list[int]], max_new_tokens: int,
            conversations: list[list[dict[str, Any]]] | None = None, streams: list[int] | None = None) -> list[Reply]:
        replies: list[Reply | None] = []
        for env, conversation in zip(envs, conversations or [[] for _ in envs]):
            first = next((m["content"] for m in conversation if m["role"] == "user"), "")
            rng = random.Random(f"{self.seed}|{first}|{len(conversation)}")
            listed_now = env.available_actions() or []
            episode, listed = self._listed.get(id(env), (None, set()))
            if episode != first:
                listed = set()
            perturbation = None
            if listed_now and rng.random() < self.rate:
                stale = sorted(listed - set(listed_now))
                perturbation = rng.choice(stale if stale and rng.random() < 0.5 else listed_now)
            self._listed[id(env)] = (first, listed | set(listed_now))
            replies.append(None if perturbation is None else Reply(f"Action: {perturbation}", trained=False))
        expert_turns = [i for i, reply in enumerate(replies) if reply is None]
        if expert_turns:
            asked = [conversations[i] for i in expert_turns] if conversations else None
            chosen = self.expert.act([envs[i] for i in expert_turns], [prompts[i] for i in expert_turns],
                                     max_new_tokens, asked)
            for i, reply in zip(expert_turns, chosen):
                replies[i] = reply
        return replies  # type: ignore[return-value]


def conversation_text(trajectories: list[Trajectory]) -> list[str]:
    """Every message text, for training a tokenizer."""
    return [m["content"] for t in trajectories for m in t.messages]


def without_thoughts(trajectory: Trajectory) -> Trajectory:
    """`trajectory` with each reply cut to its `Action:` line (messages only: token ids are
    re-encoded from the messages by `prepare_sft_data`)."""
    messages = [dict(m, content=drop_thought(m["content"])) if m["role"] == "assistant" else m
                for m in trajectory.messages]
    return replace(trajectory, messages=messages, input_ids=[], loss_mask=[], logprobs=[])


def renamed_copies(trajectories: list[Trajectory], env_id: str, copies: int, seed: int) -> list[Trajectory]:
    """`copies` renamed copies of each trajectory, text only (`registry.augmenter`): the first
    copy of every trajectory, then the second copy of every trajectory, and so on."""
    rename = registry.augmenter(env_id)
    rng = random.Random(f"{seed}-augment")
    return [replace(t, messages=rename(t.messages, rng), input_ids=[], loss_mask=[], logprobs=[])
            for _ in range(copies) for t in trajectories]


def warm_up(model: Any, tokenizer: Any, demos: list[Trajectory], warmup: WarmupConfig, seed: int,
            log: Any = print) -> None:
    """SFT of `model` on the successful episodes among the first `warmup.episodes` of `demos`
    and `warmup.augment` renamed copies of each (replies cut to their `Action:` line unless
    `warmup.thoughts`), with the warm-up's own optimizer."""
    successes = [t for t in demos[:warmup.episodes] if t.success]
    if warmup.augment and successes:
        successes += renamed_copies(successes, successes[0].env_id, warmup.augment, seed)
    if not warmup.thoughts:
        successes = [without_thoughts(t) for t in successes]
    data, _ = prepare_sft_data(successes, warmup.max_tokens, ChatEncoder(tokenizer))
    if not data:
        raise UserError(f"the warm-up has no demonstration to learn from: of {len(demos[:warmup.episodes])} expert "
                        f"episodes {len(successes)} succeeded, and none is within "
                        f"warmup.max_tokens={warmup.max_tokens}")
    learner = Learner(model, warmup.optim)
    pack_tokens = warmup.pack_tokens if warmup.packing else 0
    batches = warmup.epochs * len(plan_batches([len(t.input_ids) for t in data], warmup.batch_size, pack_tokens))
    with progress_bar(total=batches, desc="warm-up SFT", unit="batch") as bar:
        losses = sft_epochs(learner, data, tokenizer.pad_token_id, warmup.epochs, warmup.batch_size, seed,
                            progress=bar.update, pack_tokens=pack_tokens, lr_schedule=warmup.optim.lr_schedule,
                            warmup_steps=warmup.optim.lr_warmup_steps, context_weight=warmup.context_loss_weight)
    copies = f" (with {warmup.augment} renamed copies of each)" if warmup.augment else ""
    log(f"warm-up: {len(data)} expert demonstrations{copies}, {warmup.epochs} epochs, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
