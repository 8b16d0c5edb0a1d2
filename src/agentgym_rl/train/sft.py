"""The SFT trainer (`agentgym-rl sft`): multi-turn supervised fine-tuning on conversations
from a file or from an environment's expert, loss on trained assistant tokens only.

Run folder: `config.yaml`, `metrics.jsonl` (step 0: data counts; then one line per
optimizer step, and an `epoch_loss` line per epoch), `tensorboard/`, `base_model/` (the tiny
model as built), `checkpoints/final/model/` (an HF folder `agentgym-rl eval --policy` loads).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from ..progress import progress_bar

from ..agent.chat import ChatEncoder
from ..config import SFTConfig
from ..errors import UserError
from ..rollout.formats import load_conversations, sft_messages
from ..rollout.trajectory import Trajectory
from .demonstrations import collect_expert, conversation_text
from .finetune import SFTDataStats, plan_batches, prepare_sft_data, sft_epochs
from .session import Session, Trainer, eval_metrics, holds_run_folder
from .. import metric_names as metric


def no_data_error(source: str, stats: SFTDataStats, max_tokens: int) -> UserError:
    """Why a dataset left nothing to train on, and what to change."""
    hints = []
    if stats.no_loss:
        hints.append(f"{stats.no_loss} have no trained assistant turn (every assistant/gpt turn has "
                     "\"loss\": false): set \"loss\" to true or null on the replies to learn from")
    if stats.too_long:
        hints.append(f"{stats.too_long} are longer than train.max_tokens={max_tokens}: raise it")
    return UserError(f"no trainable conversation in {source}: of {stats.conversations} conversations, "
                     + "; ".join(hints or ["none were given"]))


class SFTTrainer(Trainer):
    """Supervised fine-tuning of one model on one dataset."""

    config: SFTConfig

    def load_data(self) -> tuple[list[Trajectory], str]:
        """The conversations and a description of their source (for messages)."""
        data = self.config.data
        if data.path is not None:
            conversations = load_conversations(data.path, instruction_as_system=data.instruction_as_system)
            source = repr(data.path)
            if not conversations:
                raise UserError(f"the data file {source} holds no conversation (it is empty); write one JSON "
                                "record per line (docs/DATA_FORMATS.md)")
        else:
            env = self.config.env
            with progress_bar(total=data.episodes, desc=f"expert demonstrations ({env.id})", unit="ep") as bar:
                conversations = collect_expert(env.id, env.train_split, data.episodes, seed=self.config.run.seed,
                                               max_turns=data.max_turns, rollout=self.config.rollout,
                                               env_kwargs=env.kwargs, progress=bar.update, env_urls=env.urls,
                                               env_timeout=env.server_timeout)
            conversations = [t for t in conversations if t.error is None]
            source = f"{len(conversations)} {env.id} expert episodes"
        if data.successes_only:
            successes = [t for t in conversations if t.success]
            if not successes:
                raise UserError(f"no conversation in {source} has success true, and data.successes_only is true: "
                                "set it false to train on them all (AgentGym's AgentTraj files have no success field)")
            conversations = successes
        # Checked before any model is built: the flags alone say whether anything is trained.
        trainable = sum(any(sft_messages(t)[1]) for t in conversations)
        if not trainable:
            raise no_data_error(source, SFTDataStats(len(conversations), 0, len(conversations), 0, 0, 0),
                                self.config.train.max_tokens)
        return conversations, source

    @holds_run_folder
    def fit(self) -> dict[str, Any]:
        """Train, then evaluate when `eval.episodes` > 0; returns {"run_dir", "model", "epoch_losses",
        "data": SFTDataStats as dict, "eval": the evaluation summary or None}."""
        cfg = self.config
        conversations, source = self.load_data()
        session = Session.start(cfg, self.log,
                                corpus=lambda: conversation_text(conversations[:cfg.model.corpus_episodes]))
        tokenizer, learner, metrics = session.tokenizer, session.learner, session.metrics
        data, stats = prepare_sft_data(conversations, cfg.train.max_tokens, ChatEncoder(tokenizer))
        if not data:
            raise no_data_error(source, stats, cfg.train.max_tokens)
        self.log(f"SFT data from {source}: {stats.describe()}")
        metrics.log(0, {metric.data(k): v for k, v in asdict(stats).items()})
        pack_tokens = cfg.train.pack_tokens if cfg.train.packing else 0
        step = 0
        began = time.time()

        def on_step(values: dict[str, float]) -> None:
            nonlocal step
            step += 1
            metrics.log(step, values)

        def on_epoch(epoch: int, loss: float) -> None:
            metrics.log(step, {"epoch": epoch, "epoch_loss": loss, metric.TIME_ELAPSED_S: time.time() - began})
            bar.set_postfix(loss=f"{loss:.3f}")

        per_epoch = len(plan_batches([len(t.input_ids) for t in data], cfg.train.batch_size, pack_tokens))
        with progress_bar(total=cfg.train.epochs * per_epoch, desc="SFT", unit="step") as bar:
            losses = sft_epochs(learner, data, tokenizer.pad_token_id, cfg.train.epochs, cfg.train.batch_size,
                                seed=cfg.run.seed, progress=bar.update, pack_tokens=pack_tokens, on_step=on_step,
                                on_epoch=on_epoch, lr_schedule=cfg.optim.lr_schedule,
                                warmup_steps=cfg.optim.lr_warmup_steps, context_weight=cfg.train.context_loss_weight)
        folder = session.save("final")
        self.log(f"SFT: {cfg.train.epochs} epochs, {step} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
                 f"{time.time() - began:.0f} s")
        summary = None
        if cfg.eval.episodes:
            summary = session.evaluate()
            metrics.log(step, eval_metrics(summary))
        metrics.close()
        return {"run_dir": self.run_dir, "model": folder, "epoch_losses": losses, "data": asdict(stats),
                "eval": summary}

