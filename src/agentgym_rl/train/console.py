"""The plain line a training step prints (progress bars: `agentgym_rl.progress`)."""

from __future__ import annotations

from typing import Any

STEP_FIELDS = (
    ("success", "train/success", ".2f"),
    ("reward", "train/reward", ".3f"),
    ("±", "train/reward_std", ".3f"),
    ("reply", "train/reply_tokens", ".1f"),
    ("loss", "update/loss", ".4g"),
    ("lr", "update/lr", ".2g"),
    ("kl_ref", "update/kl", ".4g"),
    ("entropy", "update/entropy", ".3f"),
    ("grad_norm", "update/grad_norm", ".3g"),
    ("drift_kl", "update/approx_kl", ".2g"),
    ("clipped", "update/clip_fraction", ".3f"),
    ("tokens/s", "time/rollout_tokens_per_s", ".0f"),
)
"""(label, metrics.jsonl key, format) of each figure a step line shows when the step logged it:
"± x" is the spread (SD) of the episodes' rewards, "reply" the mean reply length in tokens,
"kl_ref" the KL to the reference policy; "drift_kl" and "clipped" measure how far the update moved
the policy from the one that sampled the step (its approximate KL, the share of clipped ratios)."""

DRIFT_KEYS = ("update/approx_kl", "update/clip_fraction")
"""Figures that read 0 by construction when one optimizer step covers the step: its only
minibatch is scored by the weights that sampled it (ratio 1). Shown only after several."""


def step_line(step: int, total: int, metrics: dict[str, Any]) -> str:
    """One step's line, e.g. "step 3/30  horizon 8  success 0.25  reward 0.312 ± 0.100  ...  6.1 s";
    figures the step did not log (no update: no loss) are left out rather than shown as 0, and
    so are the drift figures of a step of one optimizer step. The seconds are the step's
    elapsed time (`time/step_s`: with rollouts played ahead, rollout and update overlap)."""
    several = metrics.get("update/optimizer_steps", 0) > 1
    parts = [f"step {step}/{total}", f"horizon {metrics['horizon']}"]
    parts += [f"{label} {metrics[key]:{spec}}" for label, key, spec in STEP_FIELDS
              if key in metrics and (several or key not in DRIFT_KEYS)]
    seconds = metrics.get("time/step_s", metrics.get("time/rollout_s", 0.0) + metrics.get("time/update_s", 0.0))
    return "  ".join(parts + [f"{seconds:.1f} s"]).replace("  ± ", " ± ")
