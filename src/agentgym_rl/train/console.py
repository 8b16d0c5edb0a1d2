"""The plain line a training step prints (progress bars: `agentgym_rl.progress`)."""

from __future__ import annotations

from typing import Any

STEP_FIELDS = (
    ("success", "train/success", ".2f"),
    ("reward", "train/reward", ".3f"),
    ("loss", "update/loss", ".4g"),
    ("kl", "update/kl", ".4g"),
    ("approx_kl", "update/approx_kl", ".2g"),
    ("grad_norm", "update/grad_norm", ".3g"),
    ("clip", "update/clip_fraction", ".3f"),
    ("entropy", "update/entropy", ".3f"),
    ("tokens/s", "time/rollout_tokens_per_s", ".0f"),
)
"""(label, metrics.jsonl key, format) of each figure a step line shows when the step logged it."""


def step_line(step: int, total: int, metrics: dict[str, Any]) -> str:
    """One step's line, e.g. "step 3/30  horizon 8  success 0.25  ...  6.1 s"; figures the step
    did not log (no update: no loss) are left out rather than shown as 0."""
    parts = [f"step {step}/{total}", f"horizon {metrics['horizon']}"]
    parts += [f"{label} {metrics[key]:{spec}}" for label, key, spec in STEP_FIELDS if key in metrics]
    seconds = metrics.get("time/rollout_s", 0.0) + metrics.get("time/update_s", 0.0)
    return "  ".join(parts + [f"{seconds:.1f} s"])

