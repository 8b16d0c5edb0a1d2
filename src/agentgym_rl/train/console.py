"""The plain line a training step prints (progress bars: `agentgym_rl.progress`)."""

from __future__ import annotations

from typing import Any

from .. import metric_names as metric

STEP_FIELDS = (
    ("success", metric.TRAIN_SUCCESS, ".2f"),
    ("reward", metric.TRAIN_REWARD, ".3f"),
    ("±", metric.TRAIN_REWARD_STD, ".3f"),
    ("reply", metric.TRAIN_REPLY_TOKENS, ".1f"),
    ("loss", metric.UPDATE_LOSS, ".4g"),
    ("lr", metric.UPDATE_LR, ".2g"),
    ("kl_ref", metric.UPDATE_KL, ".4g"),
    ("entropy", metric.UPDATE_ENTROPY, ".3f"),
    ("grad_norm", metric.UPDATE_GRAD_NORM, ".3g"),
    ("drift_kl", metric.UPDATE_APPROX_KL, ".2g"),
    ("clipped", metric.UPDATE_CLIP_FRACTION, ".3f"),
    ("tokens/s", metric.TIME_ROLLOUT_TOKENS_PER_S, ".0f"),
)
"""(label, metrics.jsonl key, format) of each figure a step line shows when the step logged it:
"± x" is the spread (SD) of the episodes' rewards, "reply" the mean reply length in tokens,
"kl_ref" the KL to the reference policy; "drift_kl" and "clipped" measure how far the update moved
the policy from the one that sampled the step (its approximate KL, the share of clipped ratios)."""

DRIFT_KEYS = (metric.UPDATE_APPROX_KL, metric.UPDATE_CLIP_FRACTION)
"""Figures that read 0 by construction when one optimizer step covers the step: its only
minibatch is scored by the weights that sampled it (ratio 1). Shown only after several."""


def step_line(step: int, total: int, metrics: dict[str, Any]) -> str:
    """One step's line, e.g. "step 3/30  horizon 8  success 0.25  reward 0.312 ± 0.100  ...  6.1 s";
    figures the step did not log (no update: no loss) are left out rather than shown as 0, and
    so are the drift figures of a step of one optimizer step. The seconds are the step's
    elapsed time (`time/step_s`: with rollouts played ahead, rollout and update overlap)."""
    several = metrics.get(metric.UPDATE_OPTIMIZER_STEPS, 0) > 1
    parts = [f"step {step}/{total}", f"horizon {metrics[metric.HORIZON]}"]
    parts += [f"{label} {metrics[key]:{spec}}" for label, key, spec in STEP_FIELDS
              if key in metrics and (several or key not in DRIFT_KEYS)]
    seconds = metrics.get(metric.TIME_STEP_S,
                          metrics.get(metric.TIME_ROLLOUT_S, 0.0) + metrics.get(metric.TIME_UPDATE_S, 0.0))
    return "  ".join(parts + [f"{seconds:.1f} s"]).replace("  ± ", " ± ")
