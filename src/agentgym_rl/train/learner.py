"""The Learner: one model (plus an optional value head), its optimizer, token
log-probabilities and values, updates, checkpoints."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch

from ..algos import entropy_loss, token_entropy
from ..agent.allocator import release_free_memory
from ..agent.attention import NAME, use_grouped_attention
from ..config import OptimConfig
from ..errors import UserError
from .batch import TokenBatch, micro_batches
from .packing import block_causal_mask
from .precision import autocast_dtype
from .prefix_sharing import TreeRow, tree_inputs, tree_micro_batches

@dataclasses.dataclass
class TokenOutputs:
    """What one pass of the model gives per token, each (B, T) and aligned with the tokens
    (out[:, t] is about token t, chosen after ids[:t]; out[:, 0] = 0).

    Attributes:
        logprobs: log p(ids[t] | ids[:t]) under softmax(logits / temperature).
        values: V(ids[:t]) of the value head, the value of the state in which token t is chosen.
        entropy: entropy of the distribution token t was drawn from.
        right_logprobs: log of the probability that token t is one of the batch's `right_ids`
            at t (0 where it lists none).
    """

    logprobs: torch.Tensor
    values: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    right_logprobs: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.logprobs, self.values, self.entropy, self.right_logprobs) if t is not None]


# loss_fn(batch, outputs) -> (scalar loss, metrics).
LossFn = Callable[[TokenBatch, TokenOutputs], tuple[torch.Tensor, dict[str, float]]]


def _shift(per_position: torch.Tensor) -> torch.Tensor:
    """Align (B, T-1) predictions made at positions 0..T-2 with the tokens 1..T-1 they predict."""
    return torch.nn.functional.pad(per_position, (1, 0))


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of a (B, T) 0/1 mask is ones then zeros (real tokens, then padding)."""
    lengths = attention_mask.sum(1, keepdim=True)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return bool(torch.equal(attention_mask.bool(), positions < lengths))


LOGIT_CHUNK = 1 << 26
"""Most logits (positions × vocabulary) that exist at once while scoring: 256 MB in float32,
as much again for their log-softmax. A micro-batch of 8 BabyAI episodes of ~3,000 tokens under
SmolLM2's 49,152-token vocabulary has 1.2e9 logits (4.7 GB); the tiny model's 1,024-token
vocabulary fits most micro-batches in one chunk."""


def token_outputs(model: Any, batch: TokenBatch, value_head: torch.nn.Module | None = None,
                  entropy: bool = False, temperature: float = 1.0, chunk: int | None = LOGIT_CHUNK,
                  positions: torch.Tensor | None = None, trees: list[TreeRow] | None = None,
                  autocast: torch.dtype | None = None, measure_entropy: bool = False) -> TokenOutputs:
    """Per-token log-probabilities and, on request, values and entropies, in one forward pass.

    `temperature` scores the distribution the tokens were sampled from, softmax(logits / T),
    so that PPO's ratio compares the sampling policy with itself.

    A batch with `segment_ids` and `position_ids` (`packing.collate_packed`) is packed: each
    row holds several documents and token t sees only the earlier tokens of its own one (at a
    document's first token the "logprob" is a cross-document guess: keep it off the loss mask).
    A batch with `window_ids` runs each context window as a row of its own (`window_hidden_state`).

    The model runs once up to its last hidden state; the output head then makes at most
    `chunk` logits (positions × vocabulary) at a time, each chunk reduced to what is returned
    before the next (and, when there are several, recomputed in the backward pass rather than
    kept), so memory no longer grows with batch × length × vocabulary. None makes every logit
    in one piece, inside the model's own forward (an FSDP-sharded model gathers its output
    head only there).

    `positions`, (B, T) bool, names the tokens whose logprobs (and entropies, right-token
    logprobs) are wanted, e.g. the loss mask: the output head then runs on those positions
    only, and the others read 0. In multi-turn episodes most tokens are observations, and the
    head (49,152 × 576 for SmolLM2) costs a quarter of the trunk per position it runs on.

    `trees` (`prefix_sharing.tree_micro_batches`) runs the trunk over tree rows, each shared
    prefix once, and gathers the hidden states back into the batch's layout; the model must
    attend with `agent.attention.NAME`, which reads the layout.

    `autocast` (e.g. torch.bfloat16, `optim.compute_dtype`) runs the trunk under `torch.autocast`;
    with logits in chunks the head and everything after it run outside it, in the parameters'
    dtype, on the trunk's output cast to it (with `chunk=None` the head is inside the model's
    forward and autocast too).

    Returns:
        `TokenOutputs`: logprobs; values with `value_head`; entropy with `entropy` (with a
        gradient) or `measure_entropy` (without: what the learner logs); right_logprobs when the
        batch has `right_ids` ((B, T, K) with -1 padding).
    """
    targets = batch.input_ids[:, 1:]
    right = batch.right_ids[:, 1:] if batch.right_ids is not None else None
    wanted = positions[:, 1:].bool() if positions is not None else None
    if trees is not None and chunk is None:
        raise ValueError("tree rows are scored with logits in chunks (chunk=None runs the model's own forward)")
    trunk = (torch.autocast(batch.input_ids.device.type, dtype=autocast) if autocast is not None
             else nullcontext())
    if chunk is None:
        with trunk:
            result = model(input_ids=batch.input_ids, **_attention_inputs(model, batch),
                           output_hidden_states=value_head is not None, use_cache=False)
        scores = _scores(result.logits[:, :-1], targets, right, temperature, entropy, measure_entropy)
        if wanted is not None:
            scores = tuple(torch.where(wanted, score, 0.0) for score in scores)
        hidden = result.hidden_states[-1][:, :-1] if value_head is not None else None
    else:
        with trunk:
            hidden = _trunk_output(model, batch, trees)[:, :-1]
        head = model.get_output_embeddings()
        if autocast is not None:
            hidden = hidden.to(head.weight.dtype)
        if wanted is None:
            width = max(1, chunk // (max(1, hidden.shape[0]) * head.weight.shape[0]))  # positions per chunk
            scores = _chunked_scores(head, hidden, targets, right, temperature, entropy, measure_entropy, width)
        else:
            # The wanted positions of every row as one row of N, then back in place (0 elsewhere).
            width = max(1, chunk // head.weight.shape[0])
            picked = _chunked_scores(head, hidden[wanted][None], targets[wanted][None],
                                     right[wanted][None] if right is not None else None, temperature, entropy,
                                     measure_entropy, width)
            scores = tuple(hidden.new_zeros(wanted.shape, dtype=score.dtype).masked_scatter(wanted, score[0])
                           for score in picked)
    return TokenOutputs(
        logprobs=_shift(scores[0]),
        values=_shift(value_head(hidden.float()).squeeze(-1)) if value_head is not None else None,
        entropy=_shift(scores[-1]) if entropy or measure_entropy else None,
        right_logprobs=_shift(scores[1]) if right is not None else None)


def _trunk_output(model: Any, batch: TokenBatch, trees: list[TreeRow] | None) -> torch.Tensor:
    """(B, T, H) the decoder's output for `batch`: over its tree rows, its windows, or its rows."""
    if trees is not None:
        return tree_hidden_state(model, batch, trees)
    if batch.window_ids is not None:
        return window_hidden_state(model, batch)
    return last_hidden_state(model, batch.input_ids, _attention_inputs(model, batch))


def last_hidden_state(model: Any, input_ids: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """(B, T, H) the decoder's output (after its final norm), from a forward pass that asks the
    output head for one position's logits only: caught as the decoder returns it, so the
    model's own forward (and any hooks wrapped around it) runs unchanged."""
    caught: list[torch.Tensor] = []

    def catch(module: Any, args: Any, output: Any) -> None:
        caught.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    handle = model.get_decoder().register_forward_hook(catch)
    try:
        model(input_ids=input_ids, **inputs, logits_to_keep=1, use_cache=False)  # scoring keeps no KV cache
    finally:
        handle.remove()
    return caught[-1]


def tree_hidden_state(model: Any, batch: TokenBatch, trees: list[TreeRow]) -> torch.Tensor:
    """(B, T, H) the decoder's output for a right-padded batch, computed over its tree rows
    (`prefix_sharing`): each shared prefix runs once. Padding positions hold some real token's
    state (nothing reads them)."""
    lengths = batch.attention_mask.sum(1).tolist()
    ids, positions, gather = tree_inputs(batch.input_ids.cpu(), lengths, trees, pad_id=0)
    device = batch.input_ids.device
    hidden = last_hidden_state(model, ids.to(device), {"position_ids": positions.to(device), "prefix_tree": trees})
    return hidden.reshape(-1, hidden.shape[-1])[gather.to(device)]


def window_hidden_state(model: Any, batch: TokenBatch) -> torch.Tensor:
    """(B, T, H) the decoder's output for a batch of episodes cut into context windows
    (`window_ids`): each window runs as a right-padded row of its own, positions from 0, and its
    states go back to their places. Padding positions hold zeros (nothing reads them)."""
    real = batch.window_ids > 0
    rows = torch.arange(real.shape[0], device=real.device)[:, None].expand_as(real)
    # A window is a contiguous span of its row: numbered row by row, its tokens come together.
    window = (rows * (int(batch.window_ids.max()) + 1) + batch.window_ids)[real]
    _, which = torch.unique_consecutive(window, return_inverse=True)
    counts = torch.bincount(which)
    place = torch.arange(which.numel(), device=which.device) - (counts.cumsum(0) - counts)[which]
    ids = batch.input_ids.new_zeros((counts.numel(), int(counts.max())))
    ids[which, place] = batch.input_ids[real]
    hidden = last_hidden_state(model, ids, {})  # right-padded rows: the causal mask is all they need
    out = hidden.new_zeros((*real.shape, hidden.shape[-1]))
    out[real] = hidden[which, place]
    return out


def _attention_inputs(model: Any, batch: TokenBatch) -> dict[str, Any]:
    """The attention arguments of `batch`'s forward pass: a packed or windowed batch's
    block-causal masks, none for right-padded rows, else the padding mask."""
    documents = batch.segment_ids if batch.segment_ids is not None else batch.window_ids
    if documents is not None:
        # A packed batch (`train.packing`), or windows run inside their rows (a sharded model's
        # own forward): attention stays inside each document.
        dtype = next(model.parameters()).dtype
        mask = block_causal_mask(documents, dtype)
        window = getattr(model.config, "sliding_window", None)
        if "sliding_attention" in (getattr(model.config, "layer_types", None) or []) and window:
            # A model with sliding-window layers takes one mask per kind of layer.
            mask = {"full_attention": mask, "sliding_attention": block_causal_mask(documents, dtype, window)}
        return {"attention_mask": mask, "position_ids": batch.position_ids}
    if is_right_padded(batch.attention_mask):
        # Under a causal mask a real token attends only to earlier positions, all real when the
        # padding is on the right, so the mask changes nothing the loss reads. Without it SDPA
        # runs its causal kernel instead of materialising a (B, 1, T, T) mask: a GRPO update on
        # BabyAI rollouts of 400-3,100 tokens took 20.7 s instead of 34.5 s in micro-batches of 8.
        return {}
    return {"attention_mask": batch.attention_mask}


def _scores(logits: torch.Tensor, targets: torch.Tensor, right: torch.Tensor | None, temperature: float,
            entropy: bool, measure_entropy: bool = False) -> tuple[torch.Tensor, ...]:
    """What `token_outputs` returns, from (B, C, V) logits of the positions predicting
    `targets` (B, C): (picked logprobs, [right-token logprobs], [entropies]), each (B, C); the
    entropies carry a gradient with `entropy`, none with only `measure_entropy`."""
    logits = logits.float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    out = [logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)]
    if right is not None:
        listed = right >= 0
        each = torch.where(listed, logprobs.gather(-1, right.clamp(min=0)), float("-inf"))
        # A last column of log 1 where nothing is listed makes the result 0 there, not a -inf
        # whose backward would be NaN.
        none = torch.where(listed.any(-1), float("-inf"), 0.0).unsqueeze(-1)
        out.append(torch.logsumexp(torch.cat([each, none], -1), -1))
    if entropy:
        out.append(token_entropy(logits))
    elif measure_entropy:
        with torch.no_grad():
            out.append(token_entropy(logits))
    return tuple(out)


def _chunked_scores(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, right: torch.Tensor | None,
                    temperature: float, entropy: bool, measure_entropy: bool, width: int) -> tuple[torch.Tensor, ...]:
    """`_scores` of `head(hidden)`, `width` positions at a time; under autograd, when there is
    more than one chunk, each chunk's logits are recomputed in the backward pass (activation
    checkpointing) instead of kept."""
    from torch.utils.checkpoint import checkpoint

    def score(part: torch.Tensor, part_targets: torch.Tensor, part_right: torch.Tensor | None) -> tuple:
        return _scores(head(part), part_targets, part_right, temperature, entropy, measure_entropy)

    parts = []
    recompute = torch.is_grad_enabled() and hidden.shape[1] > width
    for start in range(0, hidden.shape[1], width):
        cut = slice(start, start + width)
        args = (hidden[:, cut], targets[:, cut], right[:, cut] if right is not None else None)
        parts.append(checkpoint(score, *args, use_reentrant=False) if recompute else score(*args))
    if not parts:  # one-token rows predict nothing
        return tuple(hidden.new_zeros(hidden.shape[:2], dtype=torch.float32)
                     for _ in range(1 + (right is not None) + (entropy or measure_entropy)))
    return tuple(torch.cat(column, dim=1) for column in zip(*parts))


def token_logprobs(model: Any, batch: TokenBatch) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[:t]), 0 at t = 0 (see `token_outputs`)."""
    return token_outputs(model, batch).logprobs


def data_parallel_size() -> int:
    """Ranks of the default process group (`torchrun` with `torch.distributed` initialised), else 1."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _attends_by_tree(model: Any) -> bool:
    """Whether `model` attends with the implementation that reads a tree layout."""
    base = getattr(model, "get_base_model", lambda: model)()
    return getattr(base.config, "_attn_implementation", None) == NAME


def is_lora(model: Any) -> bool:
    """Whether `model` is a peft model whose adapter can be switched off (one-copy reference)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class Learner:
    """Owns the trainable model, an optional value head on its last hidden state, and AdamW.

    Args:
        model: a `transformers` causal LM or a peft LoRA model (trainable parameters are those
            with requires_grad).
        config: optimizer settings.
        value_head: add a critic: a linear layer from the last hidden state to a scalar
            (PPO). It shares the policy's trunk, so no second model is kept.
        entropy: also compute per-token entropies for the loss (an entropy bonus).
        temperature: the policy's sampling temperature; every logprob (old, new, reference)
            is of softmax(logits / temperature).
    """

    def __init__(self, model: Any, config: OptimConfig, value_head: bool = False, entropy: bool = False,
                 temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"a learner scores a sampling policy: temperature must be > 0, got {temperature}")
        self.model = model
        self.entropy = entropy
        self.temperature = temperature
        self.config = config
        self.value_head = None
        if value_head:
            # float32 whatever the model's dtype: values are regressed on returns.
            self.value_head = torch.nn.Linear(model.config.hidden_size, 1, device=self.device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        # Shared prefixes need the attention that reads a tree layout (a model on "sdpa" gets it).
        use_grouped_attention(model)
        if config.gradient_checkpointing:
            # Keep only each layer's input in the forward pass and recompute the rest in the
            # backward; off in generation, which runs the model in eval mode.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.optimizer = self._new_optimizer()
        self.autocast = autocast_dtype(config.compute_dtype, self.device)
        """The dtype of the trunk's matrix products in this learner's passes (None: float32)."""
        self.sharded = False
        self.rollout_model = model
        """The model rollouts sample from: the learner's own, or with `shard()` a plain copy that
        `gather_weights()` refreshes."""

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)

    def _named(self) -> torch.nn.ModuleDict:
        """The model and value head under one root, naming every parameter the optimizer holds."""
        named = torch.nn.ModuleDict({"model": self.model})
        if self.value_head is not None:
            named["value_head"] = self.value_head
        return named

    def shard(self) -> None:
        """Shard the model, value head and optimizer state over the ranks of the process group
        (FSDP2, `train.sharding`); every rank calls it, holding the same weights and optimizer
        state. Rollouts then sample from a plain copy of the model (`rollout_model`)."""
        from . import sharding

        if is_lora(self.model):
            raise UserError("run.parallel: fsdp shards a fully fine-tuned model; a LoRA adapter is small enough to "
                            "replicate, so train it with run.parallel: ddp")
        stepped = bool(self.optimizer.state)  # resumed from a checkpoint
        state = sharding.full_optimizer_state(self._named(), self.optimizer, on_every_rank=True) if stepped else None
        self.rollout_model = copy.deepcopy(self.model).requires_grad_(False)
        sharding.shard(self.model, self.value_head)
        self.optimizer = self._new_optimizer()
        if state is not None:
            sharding.load_optimizer_state(self._named(), self.optimizer, state)
        self.sharded = True

    def detach_rollout_model(self, dtype: torch.dtype | None = None) -> int:
        """Give rollouts a model of their own (`train.asynchronous`: they sample while the
        learner updates; `rollout.dtype`: they sample in `dtype`): a copy of the trainable weights,
        the frozen ones (a LoRA model's base) shared rather than copied unless the copy is cast
        to another `dtype`. Returns the bytes the copy adds."""
        if dtype is not None and dtype != next(self.model.parameters()).dtype:
            # Parameters only: float buffers (rotary frequencies) keep their precision, which
            # the positions of a long episode would otherwise round away.
            self.rollout_model = copy.deepcopy(self.model)
            for parameter in self.rollout_model.parameters():
                parameter.data = parameter.data.to(dtype)
            return sum(p.numel() * p.element_size() for p in self.rollout_model.parameters())
        shared = {id(tensor): tensor for tensor in [*self.model.parameters(), *self.model.buffers()]
                  if not tensor.requires_grad}
        # The copy keeps requires_grad as it is (no optimizer holds its parameters, so they get no
        # gradients): torch's CPU kernels round a frozen weight's products differently (~5e-7 in
        # logprobs), and the generator must sample what it would from the learner's own model.
        self.rollout_model = copy.deepcopy(self.model, memo=dict(shared))
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    @property
    def rollout_copy(self) -> bool:
        """Whether rollouts sample from a copy of the learner's model that it could sample too
        (played ahead, or in another dtype); a sharded learner's copy is the only whole model."""
        return self.rollout_model is not self.model and not self.sharded

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """A copy of the weights training changes, by parameter name (for `load_rollout_state`)."""
        return {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def load_rollout_state(self, state: dict[str, torch.Tensor]) -> None:
        """Put `trainable_state()`'s weights into the detached `rollout_model`."""
        for name, parameter in self.rollout_model.named_parameters():
            if name in state:
                parameter.copy_(state[name])

    def gather_weights(self) -> Any:
        """`rollout_model` holding the current weights (with `shard()`, gathered from every rank:
        a collective all ranks call together; a detached copy, refreshed in place, cast to its
        dtype)."""
        if self.sharded:
            from . import sharding

            self.rollout_model.load_state_dict(sharding.full_model_state(self.model))
        elif self.rollout_model is not self.model:
            self.load_rollout_state({name: p.detach() for name, p in self.model.named_parameters()
                                     if p.requires_grad})
        return self.rollout_model

    @property
    def device(self) -> torch.device:
        """Where the model's parameters, and so every batch it scores, live."""
        return next(self.model.parameters()).device

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters: the model's (all, or the LoRA adapter's) and the value head's."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return params + (list(self.value_head.parameters()) if self.value_head is not None else [])

    @torch.no_grad()
    def outputs(self, batch: TokenBatch, reference: bool = False, model: Any | None = None) -> TokenOutputs:
        """(B, T) logprobs on the loss mask (0 elsewhere; values, with a value head, everywhere)
        without gradients, by micro-batch.

        Args:
            reference: the reference policy: the base model with the LoRA adapter switched off
                (one model copy). Without LoRA pass a frozen copy as `model` instead.
            model: another model to score with (no values then).
        """
        if reference and not is_lora(self.model):
            raise ValueError("reference=True needs a LoRA model; pass a frozen copy as model= instead")
        scorer = model or self.model
        head = self.value_head if model is None and not reference else None
        was_training = scorer.training
        scorer.eval()
        shape = batch.input_ids.shape
        out = TokenOutputs(torch.zeros(shape), values=torch.zeros(shape) if head is not None else None)
        with self.model.disable_adapter() if reference else nullcontext():
            # Only logprobs and values are scored here (the right-token term is a loss only).
            scored = dataclasses.replace(batch, right_ids=None)
            for item in self._micro_batches(scored):
                if item is None:  # this rank's part is scored; the others still gather weights
                    token_outputs(scorer, self._idle_batch(), head, temperature=self.temperature,
                                  chunk=self._chunk(scorer), autocast=self.autocast)
                    continue
                rows, micro, trees = item
                width = micro.input_ids.shape[1]
                micro = micro.to(self.device)  # batches are built on the CPU
                scored_micro = token_outputs(scorer, micro, head, temperature=self.temperature,
                                             chunk=self._chunk(scorer), positions=micro.trained_positions(),
                                             trees=trees if _attends_by_tree(scorer) else None,
                                             autocast=self.autocast)
                out.logprobs[rows, :width] = scored_micro.logprobs.cpu()
                if head is not None:
                    out.values[rows, :width] = scored_micro.values.cpu()
        scorer.train(was_training)
        return out

    def logprobs(self, batch: TokenBatch, model: Any | None = None, reference: bool = False) -> torch.Tensor:
        """(B, T) token logprobs without gradients (old or reference policy)."""
        return self.outputs(batch, reference=reference, model=model).logprobs

    def update(self, batch: TokenBatch, loss_fn: LossFn, weight_by: str = "tokens",
               skip_above: tuple[str, float] | None = None, group: int = 1) -> dict[str, float]:
        """One optimizer step on `batch`, accumulating gradients over micro-batches.

        Each micro-batch's loss is weighted by its share of the batch's loss tokens
        (`weight_by="tokens"`, exact for token-mean losses) or rows ("sequences"), so the
        step equals one full-batch step whatever the micro-batch size. A term that is a mean
        over rows under token weighting weighs its rows by the micro-batch's `row_weights`.

        `skip_above=("approx_kl", 0.05)` drops the step (gradients computed, weights left
        alone) when that loss metric, averaged over the batch, exceeds the bound: a guard
        against one update moving the policy too far from the one that sampled the data.

        `group=2` keeps each pair of consecutive rows in one micro-batch, in its order (DPO's
        interleaved chosen and rejected rows; see `batch.micro_batches`).

        Returns:
            loss-function metrics averaged with the same weights, grad_norm, and "skipped"
            (1.0 when the guard dropped the step).
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        world = data_parallel_size()
        total = float(batch.loss_mask.sum() if weight_by == "tokens" else batch.size)
        rows = float(batch.size)
        if world > 1:  # shares are of the global batch: every rank's rows together
            total, rows = _all_reduce_sum(torch.tensor([total, rows], dtype=torch.float64)).tolist()
        if total == 0:  # no loss token on any rank
            return {}
        summed: dict[str, float] = {}
        micros = self._micro_batches(batch, group)
        for index, item in enumerate(micros):
            if self.sharded:  # reduce-scatter the gradients once, after the last micro-batch
                for unit in self._units():
                    unit.set_requires_gradient_sync(index == len(micros) - 1, recurse=False)
            micro = item[1].to(self.device) if item is not None else None
            trees = item[2] if item is not None else None
            share = 0.0 if micro is None else float(micro.loss_mask.sum() if weight_by == "tokens" else micro.size)
            share /= total
            if share == 0.0:
                if self.sharded:  # a pass adding nothing, so that every rank runs as many
                    outputs = token_outputs(self.model, self._idle_batch(), self.value_head, self.entropy,
                                            self.temperature, self._chunk(self.model), autocast=self.autocast)
                    (sum(value.sum() for value in outputs.tensors()) * 0.0).backward()
                continue
            # A mean over rows, scaled by `share` below, must weigh each row 1 / rows in all.
            micro.row_weights = torch.full((micro.size,), 1.0 / (rows * share), device=micro.input_ids.device)
            outputs = token_outputs(self.model, micro, self.value_head, self.entropy, self.temperature,
                                    self._chunk(self.model), positions=micro.trained_positions(), trees=trees,
                                    autocast=self.autocast, measure_entropy=True)
            loss, metrics = loss_fn(micro, outputs)
            if "entropy" not in metrics:  # no entropy term in the loss: the policy's entropy, measured
                metrics["entropy"] = entropy_loss(micro.loss_mask, entropy=outputs.entropy)[1]["entropy"]
            del outputs
            (loss * share).backward()
            if self.device.type == "cpu":
                # A micro-batch's freed activations are holes in glibc's heap; handed back now,
                # the next micro-batch does not stack its own on them (docs/BENCHMARKS.md).
                release_free_memory()
            for key, value in {"loss": loss.item(), **metrics}.items():
                summed[key] = summed.get(key, 0.0) + share * float(value)
        if world > 1:
            summed = self._reduce_across_ranks(summed)
        params = [p for p in self.parameters() if p.grad is not None]
        if not params:  # every micro-batch had an empty loss mask
            return summed
        # With max_norm=inf this only measures the norm.
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip or float("inf"))
        summed["grad_norm"] = float(grad_norm)
        summed["lr"] = self.optimizer.param_groups[0]["lr"]
        if skip_above is not None and skip_above[0] not in summed:  # a guard that would never fire
            raise UserError(f"the guard on {skip_above[0]} (algo.max_kl) reads a metric the loss does not report: "
                            "set algo.max_kl: 0, or use a policy loss that reports it (ppo_clip does)")
        summed["skipped"] = float(skip_above is not None and summed[skip_above[0]] > skip_above[1])
        if not summed["skipped"]:
            self.optimizer.step()
        return summed

    def _chunk(self, scorer: Any) -> int | None:
        """How `token_outputs` makes `scorer`'s logits: in chunks, but whole inside the forward
        of a sharded model (its output head is gathered only there)."""
        return None if self.sharded and scorer is self.model else LOGIT_CHUNK

    def _micro_batches(self, batch: TokenBatch,
                       group: int = 1) -> list[tuple[list[int], TokenBatch, list[TreeRow] | None] | None]:
        """The batch's micro-batches as (rows, micro-batch, tree rows or None): with shared
        prefixes where the learner can (`optim.share_prefixes`, a model attending with
        `agent.attention.NAME`, unsharded, single rows); sharded, padded with None up to the
        most any rank has."""
        micros: list[tuple[list[int], TokenBatch, list[TreeRow] | None] | None]
        if (self.config.share_prefixes and group == 1 and not self.sharded and batch.segment_ids is None
                and batch.window_ids is None and _attends_by_tree(self.model)):
            micros = list(tree_micro_batches(batch, self.config.micro_batch_size, self.config.micro_batch_tokens))
        else:
            micros = [(rows, micro, None) for rows, micro in
                      micro_batches(batch, self.config.micro_batch_size, self.config.micro_batch_tokens, group)]
        if self.sharded:
            from .sharding import max_across_ranks

            micros += [None] * (max_across_ranks(len(micros)) - len(micros))
        return micros

    def _idle_batch(self) -> TokenBatch:
        """One row of two tokens and no loss token: what a rank runs through the model while the
        others still have micro-batches (a sharded model's passes are collectives)."""
        zeros = torch.zeros((1, 2))
        return TokenBatch(torch.zeros((1, 2), dtype=torch.long), torch.ones((1, 2), dtype=torch.long), zeros,
                          zeros.clone()).to(self.device)

    def _units(self) -> list[Any]:
        from .sharding import sharded_units

        return sharded_units(self.model, self.value_head)

    def _reduce_across_ranks(self, summed: dict[str, float]) -> dict[str, float]:
        """Sum every rank's gradients and weighted metrics (each already a share of the global
        batch), so that every rank holds the global batch's gradient and takes the same step.

        Data parallelism as DDP does it (an all-reduce of the gradients over the process
        group), written out because the ranks' micro-batch counts differ and some may have
        no loss token at all, where DDP's one-sync-per-backward contract would hang. Sharded
        parameters are summed by FSDP's reduce-scatter already."""
        for param in ([] if self.sharded else self.parameters()):
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        grads = [] if self.sharded else [param.grad for param in self.parameters()]
        if grads:
            flat = _all_reduce_sum(torch.cat([grad.reshape(-1).float() for grad in grads]))
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        import torch.distributed as dist

        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, summed)
        return {key: sum(part.get(key, 0.0) for part in every) for key in sorted({k for part in every for k in part})}

    def save(self, folder: str | Path) -> None:
        """Write the model as an ordinary HF folder under `model/` (with LoRA: the adapter
        merged into a copy, so eval can load it; the adapter alone under `adapter/`), and the
        optimizer and value-head state. Sharded, every rank calls it (the weights and optimizer
        state are gathered) and rank 0 writes them whole: loadable at any world size."""
        out = Path(folder)
        if self.sharded:
            from .sharding import full_model_state, full_optimizer_state

            model = self.gather_weights()
            optimizer = full_optimizer_state(self._named(), self.optimizer)
            value_head = full_model_state(self.value_head) if self.value_head is not None else None
            if _rank() == 0:
                model.save_pretrained(out / "model")
                torch.save({"optimizer_by_name": optimizer, "value_head": value_head}, out / "learner.pt")
            return
        if is_lora(self.model):
            self.model.save_pretrained(out / "adapter")
            copy.deepcopy(self.model).merge_and_unload().save_pretrained(out / "model")
        else:
            self.model.save_pretrained(out / "model")
        state = {"optimizer": self.optimizer.state_dict()}
        if self.value_head is not None:
            state["value_head"] = self.value_head.state_dict()
        torch.save(state, out / "learner.pt")

    def load_state(self, folder: str | Path) -> None:
        """Restore the optimizer and value head saved by `save` (the model is loaded apart)."""
        if self.sharded:
            raise RuntimeError("load the learner's state before shard()")
        state = torch.load(Path(folder) / "learner.pt", weights_only=True)
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        if "optimizer_by_name" in state:  # written by a sharded learner
            from .sharding import load_optimizer_state

            load_optimizer_state(self._named(), self.optimizer, state["optimizer_by_name"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])

