"""The Learner: one model, its optimizer, token log-probabilities, updates, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .batch import TokenBatch, micro_batches

LossFn = Callable[[TokenBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class OptimConfig:
    """Optimizer settings."""

    lr: float = 1e-3
    """AdamW learning rate (the tiny model wants ~1e-3; 7B models ~1e-6)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass; gradients accumulate across micro-batches."""


def token_logprobs(model: Any, batch: TokenBatch) -> torch.Tensor:
    """Log-probability of each token given the ones before it.

    Returns:
        (B, T) tensor aligned with input_ids: out[:, t] = log p(ids[t] | ids[:t]); out[:, 0] = 0.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


class Learner:
    """Owns the trainable model and its AdamW optimizer.

    Args:
        model: a `transformers` causal LM (trainable parameters are those with requires_grad).
        config: optimizer settings.
    """

    def __init__(self, model: Any, config: OptimConfig):
        self.model = model
        self.config = config
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, model: Any | None = None) -> torch.Tensor:
        """(B, T) token logprobs without gradients (old or reference policy), by micro-batch."""
        model = model or self.model
        was_training = model.training
        model.eval()
        out = torch.zeros(batch["input_ids"].shape)
        start = 0
        for micro in micro_batches(batch, self.config.micro_batch_size):
            rows, width = micro["input_ids"].shape
            out[start:start + rows, :width] = token_logprobs(model, micro)
            start += rows
        model.train(was_training)
        return out

    def update(self, batch: TokenBatch, loss_fn: LossFn, weight_by: str = "tokens") -> dict[str, float]:
        """One optimizer step on `batch`, accumulating gradients over micro-batches.

        Each micro-batch's loss is weighted by its share of the batch's loss tokens
        (`weight_by="tokens"`, exact for token-mean losses) or rows ("sequences"), so the
        step equals one full-batch step whatever the micro-batch size.

        Returns:
            loss-function metrics averaged with the same weights, plus grad_norm.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = batch["loss_mask"].sum() if weight_by == "tokens" else batch["loss_mask"].shape[0]
        total = max(float(total), 1.0)
        summed: dict[str, float] = {}
        for micro in micro_batches(batch, self.config.micro_batch_size):
            share = float(micro["loss_mask"].sum() if weight_by == "tokens" else micro["loss_mask"].shape[0]) / total
            if share == 0.0:
                continue
            loss, metrics = loss_fn(micro, token_logprobs(self.model, micro))
            (loss * share).backward()
            for key, value in {"loss": loss.item(), **metrics}.items():
                summed[key] = summed.get(key, 0.0) + share * float(value)
        params = [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        if not params:  # every micro-batch had an empty loss mask
            return summed
        # With max_norm=inf this only measures the norm.
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip or float("inf"))
        self.optimizer.step()
        summed["grad_norm"] = float(grad_norm)
        return summed

    def save(self, folder: str | Path) -> None:
        """Write the model (an ordinary HF folder under `model/`) and the optimizer state."""
        out = Path(folder)
        self.model.save_pretrained(out / "model")
        torch.save({"optimizer": self.optimizer.state_dict()}, out / "learner.pt")

    def load_optimizer(self, folder: str | Path) -> None:
        state = torch.load(Path(folder) / "learner.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
