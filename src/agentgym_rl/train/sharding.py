"""Fully sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`) for the learner.

Under `torchrun` with `run.parallel: fsdp` every rank keeps 1/world of the parameters, gradients
and optimizer state instead of a whole copy: a forward all-gathers each decoder layer's
weights, its backward reduce-scatters their gradients. These are collectives, so every rank
must run the same number of forward and backward passes (`Learner` pads the ranks with fewer
micro-batches with idle passes), and a full state dict (checkpoints, the weights the rollouts
sample) is gathered by all ranks together.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, fully_shard


def shard(model: torch.nn.Module, value_head: torch.nn.Module | None) -> None:
    """Shard `model` in place: each decoder layer (the classes the model names in
    `_no_split_modules`) as its own unit, then the rest (embeddings, final norm, LM head) at the
    root; the value head as a unit of its own. Gradients are summed, not averaged, over ranks:
    the learner weights each rank's loss by its share of the global batch."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    if not layer_classes:
        raise ValueError(f"{type(model).__name__} names no decoder-layer class (_no_split_modules) to shard by")
    for module in list(model.modules()):
        if type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(model)
    # FSDP warns that an in-place op on a module's output would skip its backward hook; the
    # learner only reads the logits and values out of place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if value_head is not None:
        fully_shard(value_head)
    for module in sharded_units(model, value_head):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum


def sharded_units(*modules: torch.nn.Module | None) -> list[FSDPModule]:
    """The FSDP units inside `modules` (roots and layers)."""
    return [unit for module in modules if module is not None for unit in module.modules()
            if isinstance(unit, FSDPModule)]


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of a sharded `model`, on every rank (a collective)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(modules: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         on_every_rank: bool = False) -> dict[str, Any]:
    """The optimizer's whole state keyed by parameter name (a collective when the parameters are
    sharded), in CPU memory on rank 0 only unless `on_every_rank`: loadable by
    `load_optimizer_state` at any world size. An optimizer that has not stepped yet gets a state
    as if it had (zero moments, step 1): ask only once it has."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_every_rank)
    return get_optimizer_state_dict(modules, optimizer, options=options)


def load_optimizer_state(modules: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a `full_optimizer_state` into `optimizer`, sharding it as its parameters are (every
    rank passes the whole state)."""
    set_optimizer_state_dict(modules, optimizer, state, options=StateDictOptions(full_state_dict=True, strict=False))


def max_across_ranks(value: int) -> int:
    """The largest `value` any rank holds."""
    tensor = torch.tensor([value])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
