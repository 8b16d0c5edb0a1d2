"""Data-parallel learning over torch.distributed (gloo on the CPU), replicated (DDP-style) and
sharded (FSDP2): one update on 2 ranks, each holding part of the rows, equals one update on 1
process holding them all, and the checkpoint rank 0 writes loads in a single process.

Tolerance: gradients within 1e-5 of each other relative to their global L2 norm (the ranks sum
their parts in another order), weights after one AdamW step within 1e-6 (lr 1e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentgym_rl.algos import LOSS
from agentgym_rl.config import OptimConfig
from agentgym_rl.train.batch import TokenBatch
from agentgym_rl.train.learner import Learner, data_parallel_size

RANK_ROWS = [[0, 1, 2, 3], [4, 5]]
"""Uneven shards; the last row has no loss token, so rank 1 has fewer loss tokens than rows."""


def build_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return Qwen2ForCausalLM(config)


def global_batch(learner: Learner) -> TokenBatch:
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 7, 12, 5, 10, 6]
    width = max(lengths)
    ids = torch.randint(1, 48, (len(lengths), width), generator=generator)
    attention = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    loss_mask = (torch.rand(len(lengths), width, generator=generator) < 0.6).float() * attention
    loss_mask[:, 0] = 0
    loss_mask[5] = 0
    ids = ids * attention
    batch = TokenBatch(ids, attention, loss_mask, torch.zeros(len(lengths), width),
                       advantages=torch.randn(len(lengths), width, generator=generator) * loss_mask)
    batch.old_logprobs = learner.logprobs(batch) * loss_mask  # on-policy: ratios start at 1
    return batch


def ppo_loss(batch: TokenBatch, outputs: dict[str, torch.Tensor]):
    """PPO-clip plus a critic's squared error (regressed on the advantages), so the value head learns too."""
    loss, metrics = LOSS["ppo_clip"](outputs.logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask)
    value_error = ((outputs.values - batch.advantages) ** 2 * batch.loss_mask).sum() / batch.loss_mask.sum()
    return loss + value_error, metrics


def update(rows: list[int] | None, sharded: bool = False) -> tuple[Learner, dict]:
    learner = Learner(build_model(), OptimConfig(lr=1e-3, micro_batch_size=2, grad_clip=0.0), value_head=True)
    torch.nn.init.normal_(learner.value_head.weight, generator=torch.Generator().manual_seed(2))
    if sharded:
        learner.shard()
    batch = global_batch(learner)
    metrics = learner.update(batch.rows(rows) if rows is not None else batch, ppo_loss)
    return learner, metrics


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) gradient's whole value; a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.clone()


PARALLEL = ("ddp", "fsdp")


def rank_main(rank: int, world: int, init_file: str, out: str) -> None:
    """One rank's update, replicated and then sharded (one spawn for both: starting the ranks
    is most of this module's time), each written under `out/<kind>`."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        assert data_parallel_size() == world
        for kind in PARALLEL:
            sharded = kind == "fsdp"
            learner, metrics = update(RANK_ROWS[rank], sharded)
            if rank == 0 or sharded:  # a sharded learner gathers its state with every rank
                learner.save(f"{out}/{kind}")
            grads = [full(p.grad) for p in learner.parameters()]
            state = learner.gather_weights().state_dict()
            torch.save({"state": state, "grads": grads, "metrics": metrics}, f"{out}/{kind}/rank{rank}.pt")
            torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    for kind in PARALLEL:
        (out / kind).mkdir()
    mp.spawn(rank_main, args=(2, str(out / "init"), str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(params=PARALLEL)
def two_ranks(request, spawned):
    return spawned / request.param


def _close(mine: list[torch.Tensor], theirs: list[torch.Tensor], rel: float) -> bool:
    difference = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(mine, theirs)))
    norm = torch.sqrt(sum((b ** 2).sum() for b in theirs))
    return bool(difference <= rel * norm)


def test_two_ranks_take_the_same_step_as_one_process(two_ranks):
    single, metrics = update(None)
    ranks = [torch.load(two_ranks / f"rank{rank}.pt") for rank in (0, 1)]
    expected_grads = [p.grad for p in single.parameters()]
    for rank in ranks:
        assert _close(rank["grads"], expected_grads, 1e-5)
        for name, value in single.model.state_dict().items():
            torch.testing.assert_close(rank["state"][name], value, atol=1e-6, rtol=0)
        assert rank["metrics"]["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    # A broken reduction (each rank stepping on its own rows) would not pass: its gradient differs.
    alone, _ = update(RANK_ROWS[0])
    assert not _close([p.grad for p in alone.parameters()], expected_grads, 1e-2)


def test_a_checkpoint_from_two_ranks_loads_in_one_process(two_ranks):
    loaded = AutoModelForCausalLM.from_pretrained(two_ranks / "model")
    saved = torch.load(two_ranks / "rank0.pt")["state"]
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, saved[name], atol=0, rtol=0)
    learner = Learner(loaded, OptimConfig(lr=1e-3), value_head=True)
    learner.load_state(two_ranks)  # the optimizer state and value head of the same step
    single, _ = update(None)
    assert len(learner.optimizer.state) == len(learner.parameters())
    for mine, theirs in zip(learner.parameters(), single.parameters()):
        expected = single.optimizer.state[theirs]["exp_avg_sq"]
        torch.testing.assert_close(learner.optimizer.state[mine]["exp_avg_sq"], expected, atol=1e-9, rtol=1e-4)
    torch.testing.assert_close(learner.value_head.weight, single.value_head.weight, atol=1e-6, rtol=0)
