"""Running one RL run over several processes with `torchrun` (torch.distributed).

    torchrun --nproc_per_node 2 -m agentgym_rl.cli train configs/babyai_grpo.yaml

Rank 0 is the run: it writes the run folder (config, warm-up, metrics, trajectories,
checkpoints, validation), exactly as a one-process run does, so its checkpoints load at any
world size. Every rank plays its share of each step's tasks (whole GRPO groups), the
trajectories are gathered so that every rank computes the same advantages, and each minibatch
is split across ranks, whose gradients the `Learner` sums (`Learner._reduce_across_ranks`).
The process group is gloo on CPUs and NCCL when `run.device` is a GPU (one per rank:
`LOCAL_RANK`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

TIMEOUT = timedelta(hours=6)
"""How long a rank waits for the others: rank 0 validates alone while the rest wait."""


def start(device: str) -> tuple[int, int]:
    """(rank, world size): join the process group `torchrun` describes (`WORLD_SIZE`, `RANK`,
    `MASTER_ADDR`...), or (0, 1) outside `torchrun`. One process under `torchrun` joins a group
    of one too, so that `torchrun --nproc_per_node 1` runs the NCCL set-up and, with
    `run.parallel: fsdp`, the sharded learner on a single GPU."""
    if not launched_by_torchrun():
        return 0, 1
    if not dist.is_initialized():
        from ..agent.loading import resolve_device

        # Read as the model's device is: "cuda" without a GPU is the user's mistake, not gloo.
        gpu = resolve_device(device).type == "cuda"
        if gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if gpu else "gloo", timeout=TIMEOUT)
    return dist.get_rank(), dist.get_world_size()


def launched_by_torchrun() -> bool:
    """Whether `torchrun` started this process (with one process or more)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def in_group() -> bool:
    """Whether this process joined a process group (`start` under `torchrun`)."""
    return dist.is_available() and dist.is_initialized()


def stop() -> None:
    """Leave the process group `start` joined. A rank that exits with it still open can abort at
    interpreter shutdown ("terminate called without an active exception", seen once in a
    2-rank test run after training had finished)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def end_rank(code: int = 0) -> NoReturn:
    """End a `torchrun` rank once its work is written: Python's exit handlers run and the output
    is flushed, then the process exits without the C++ teardown. There, a thread torch's
    distributed runtime still holds aborts the process now and then even after `stop`
    ("terminate called without an active exception", exit -6, seen in the 2-rank test after the
    run was complete), and torchrun then reports the whole run as failed."""
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def gather(items: list[Any]) -> list[Any]:
    """Every rank's `items` (picklable), concatenated in rank order, on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return items
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, items)
    return [item for part in every for item in part]


def broadcast(value: Any) -> Any:
    """Rank 0's `value` (picklable), on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
