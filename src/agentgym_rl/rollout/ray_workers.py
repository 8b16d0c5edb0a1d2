"""Rollout workers as Ray actors: `rollout.workers: N` plays an RL step's episodes in N actors,
each holding a copy of the model, its own generator and its own environments, so generation
spreads over the cores or machines of a Ray cluster while the trainer's process only learns.

A step's tasks are dealt to the workers whole (every sample of a task stays in one actor, so
GRPO groups are intact), the trajectories come back token-exact, and after every update the
trainer sends the new weights once through Ray's object store (`sync_weights`). Sampling in
worker i is seeded with (the seed the trainer draws for the step) + i: a run is reproducible
for a given number of workers; greedy rollouts equal the in-process ones.

Addresses as for environments in actors (`envs.ray_env`): `ray:local`, `ray:auto`,
`ray://HOST:PORT`, with `?cpus=` the CPUs each worker reserves (1 by default; torch in the
actor uses that many threads).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import RolloutConfig
from ..envs import registry
from ..envs.ray_env import actor_failure, connect, parse_address
from ..envs.tasks import Task
from ..errors import UserError
from .engine import RolloutEngine
from .rewards import EpisodeReward
from .backends import model_policy
from .trajectory import Trajectory

WORKER_CPUS = 1.0


class RolloutWorkerError(RuntimeError):
    """A worker died or its rollout raised (an environment's own failures are recorded in the
    trajectories instead)."""


class _RolloutWorker:
    """The actor: a model built from `model_config` (weights arrive with `load`), its policy and
    a rollout engine over environments made in the actor's process."""

    def __init__(self, model_config: Any, tokenizer: Any, env: dict[str, Any], rollout: RolloutConfig,
                 temperature: float, threads: int):
        from transformers import AutoModelForCausalLM

        from ..agent.attention import register_grouped_attention

        torch.set_num_threads(threads)
        register_grouped_attention()  # the learner's config may name it (`agent/attention.py`)
        self.model = AutoModelForCausalLM.from_config(model_config, torch_dtype=model_config.torch_dtype).eval()
        self.policy = model_policy(self.model, tokenizer, temperature, rollout)
        make_env = registry.env_factory(env["id"], env["kwargs"], env["urls"], env["timeout"])
        self.engine = RolloutEngine(registry.with_invalid_action_penalty(make_env, env["invalid_action_penalty"]),
                                    rollout, EpisodeReward.from_config(env.get("reward"), env.get("reward_mode", "replace"),
                                                              env.get("judge")))

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        self.policy.sync_weights(self.model)  # drops the KV cache of the old weights

    def run(self, tasks: list[Task], max_turns: int, samples: int, seed: int, sampling_seed: int) -> list[Trajectory]:
        return self.engine.run(tasks, self.policy, max_turns, samples=samples, seed=seed, sampling_seed=sampling_seed)

    def close(self) -> None:
        self.engine.close()


class RayRollouts:
    """`count` rollout workers on the Ray instance of `address`, sampling from `model`'s weights
    at `temperature`.

    Args:
        model: the learner's model (or its rollout copy): its config builds each worker's model
            and its weights are the first ones sent.
        tokenizer: the model's tokenizer (the chat encoder of every worker's policy).
        env: the environment as the worker builds it: keys "id", "kwargs", "urls", "timeout",
            "invalid_action_penalty".
        rollout: the rollout settings each worker's engine runs with.
    """

    def __init__(self, count: int, address: str, model: Any, tokenizer: Any, env: dict[str, Any],
                 rollout: RolloutConfig, temperature: float):
        import ray

        ray_address, cpus = parse_address(address, default_cpus=WORKER_CPUS)
        connect(ray_address)
        total = ray.cluster_resources().get("CPU", 0)
        if count * cpus > total:  # Ray would leave the rest pending, and the run waiting, forever
            raise UserError(f"rollout.workers={count} of {cpus:g} CPU each need {count * cpus:g} CPUs; the Ray "
                            f"cluster has {total:g}: fewer workers, or a smaller share ({address.split('?')[0]}"
                            "?cpus=...)")
        actor = ray.remote(num_cpus=cpus)(_RolloutWorker)
        threads = max(1, math.floor(cpus))
        self.workers = [actor.remote(model.config, tokenizer, env, rollout, temperature, threads)
                        for _ in range(count)]
        self.sync_weights(model)  # also waits until every worker is built, and says why one was not

    def _get(self, futures: list[Any]) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(futures)
        except RayTaskError as error:
            cause = error.as_instanceof_cause()
            raise RolloutWorkerError(f"a rollout worker failed: {type(cause).__name__}: {cause}") from None
        except RayActorError as error:
            raise RolloutWorkerError(f"a rollout worker died: {actor_failure(error)}") from None

    def sync_weights(self, model: Any) -> None:
        """Send `model`'s weights to every worker (put once in the object store)."""
        import ray

        state = ray.put({name: value.detach().cpu() for name, value in model.state_dict().items()})
        self._get([worker.load.remote(state) for worker in self.workers])

    def run(self, tasks: list[Task], max_turns: int, samples: int, seed: int, sampling_seed: int) -> list[Trajectory]:
        """`samples` episodes of each task, as `RolloutEngine.run` plays them (task k's samples
        in group k), dealt to the workers: worker i plays tasks i, i + N, ...; each episode
        samples from its own stream of `sampling_seed` (`RolloutEngine.run`), so the episodes
        are those of one process, whatever the number of workers."""
        count = len(self.workers)
        shares = [(index, tasks[index::count]) for index in range(count) if tasks[index::count]]
        played = self._get([self.workers[index].run.remote(share, max_turns, samples, seed, sampling_seed)
                            for index, share in shares])
        trajectories = []
        for (index, _), part in zip(shares, played):
            for trajectory in part:  # worker i's task j is task i + j * N of the step
                trajectory.group = index + trajectory.group * count
            trajectories.extend(part)
        return trajectories

    def close(self) -> None:
        """Close the workers' environments and end the actors."""
        import ray

        for worker in self.workers:
            try:
                ray.get(worker.close.remote(), timeout=60)
            except Exception:  # a dead worker has nothing left to close
                pass
            ray.kill(worker)
        self.workers = []
