"""The smoke preset (`--smoke`): every config resolves with it, and a smoke run of the
quickstart's recipe updates the policy from advantages that are not all zero (`make smoke` runs
every config this way) and gives the numbers pinned below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli import cli

from agentgym_rl.config.smoke import smoke_overrides

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_every_config_resolves_with_the_smoke_preset(config):
    code, out, err = cli("config", str(config), "--smoke")
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["run"]["name"].endswith("_smoke") and resolved["run"]["overwrite"] is True
    assert resolved["eval"]["episodes"] == 2 and resolved["eval"]["max_turns"] <= 3
    if "algo" in resolved:  # RL: a penalty for invalid actions gives groups that do not tie
        assert resolved["env"]["invalid_action_penalty"] > 0
        # A pretrained model starts as it is, for one step with the penalty on wrong tokens (its
        # update is the slow part on a CPU); the tiny model is warmed up (fewer demonstrations
        # where the expert's episodes are long or slow: SciWorld, the web) and takes two steps.
        pretrained = resolved["model"]["path"] is not None
        assert (resolved["warmup"]["episodes"] == 0) == pretrained
        assert resolved["train"]["steps"] == (1 if pretrained else 2)
        assert resolved["algo"]["invalid_turn_penalty"] is not None or not pretrained
    if "dpo" in resolved or "rft" in resolved:  # start from a tiny model they build, not another run's folder
        assert resolved["model"]["path"] is None and resolved["warmup"]["episodes"] > 0


def test_the_users_overrides_go_over_the_preset():
    code, out, err = cli("config", str(REPO / "configs" / "babyai_grpo.yaml"), "--smoke", "train.steps=3",
                         "run.name=mine")
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["train"]["steps"] == 3 and resolved["run"]["name"] == "mine"
    assert smoke_overrides("train", {"run": {"name": "x"}})[:3] == ["run.overwrite=true", "run.smoke=true",
                                                                     "run.name=x_smoke"]


def test_smoke_and_resume_together_is_one_line():
    code, _, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), "--smoke", "--resume")
    assert code == 2 and "--resume continues a run and --smoke starts it afresh" in err


# Every line of the smoke run's `metrics.jsonl` but the times and the rollout's float noise:
# validation at step 0, two RL steps, validation. Re-recorded with seed 0 on 2026-11-27 when RL
# rollouts moved to per-episode random streams (`agent/sampling.py`: the same distribution, other
# draws), and again that night when the streams' noise became SplitMix64 counters; the figures
# before went back, through earlier re-pins on shorter budgets, to those recorded before the
# config system and the run assembly were rebuilt, commit 821a1bf. `update/right_prob` was
# re-pinned on 2026-11-28 when rows sharing a prompt began to share micro-batches
# (`optim.share_prefixes`): it is averaged per micro-batch, weighted by loss tokens, so it moves
# with the grouping while the loss and gradient norm keep their values. Step 1's wrong-token
# figures (one more capped token, one more right-token position) and the updates after them were
# re-pinned on 2026-11-29 when an action stopping short of a listed one came to be blamed on the
# token that ended it instead of the reply's last token (`envs.parsing.first_wrong_token`). A change
# that alters what a run computes (which demonstrations are played, how the model is built and
# warmed up, which tasks a step samples, how it samples, the update itself) changes them; a
# change of structure alone does not.
PINNED = [
    {"step": 0, "val/success": 0.0, "val/reward": 0.0, "val/success/GoTo": 0.0},
    {"step": 1, "horizon": 3, "train/success": 0.0, "train/reward": -0.228125, "train/turns": 3.0,
     "train/invalid_action_rate": 0.7604166666666666, "train/idle_turn_rate": 0.0, "train/errors": 0,
     "kl_coef": 0.0, "update/trajectories": 32, "update/failed_episodes_left_out": 0, "adv/num_groups": 4.0,
     "adv/zero_var_group_frac": 0.0, "adv/adv_abs_mean": 0.7931703925132751,
     "adv/reward_mean": -0.22812500596046448, "adv/invalid_tokens_capped": 160, "adv/wrong_tokens": 68,
     "adv/right_token_positions": 45, "update/loss": 1.7255961205810308, "update/clip_fraction": 0.0,
     "update/approx_kl": 3.904498946383228e-10, "update/ratio_mean": 1.0000000149011612,
     "update/right_prob": 0.33779662451706827, "update/right_token_loss": 1.582559539936483,
     "update/grad_norm": 7.60943078994751, "update/skipped_steps": 0.0, "update/optimizer_steps": 1},
    {"step": 2, "horizon": 3, "train/success": 0.0, "train/reward": -0.23125000000000004, "train/turns": 3.0,
     "train/invalid_action_rate": 0.7708333333333334, "train/idle_turn_rate": 0.010416666666666666,
     "train/errors": 0, "kl_coef": 0.0, "update/trajectories": 32, "update/failed_episodes_left_out": 0,
     "adv/num_groups": 4.0, "adv/zero_var_group_frac": 0.0, "adv/adv_abs_mean": 0.8378170728683472,
     "adv/reward_mean": -0.23125000298023224, "adv/invalid_tokens_capped": 181, "adv/wrong_tokens": 72,
     "adv/right_token_positions": 50, "update/loss": 1.5273233596235514, "update/clip_fraction": 0.0,
     "update/approx_kl": -1.4315044982726732e-09, "update/ratio_mean": 0.9999999888241291,
     "update/right_prob": 0.3631020828615874, "update/right_token_loss": 1.3691976144909859,
     "update/grad_norm": 4.683989524841309, "update/skipped_steps": 0.0, "update/optimizer_steps": 1},
    {"step": 2, "val/success": 0.0, "val/reward": 0.0, "val/success/GoTo": 0.0},
]


@pytest.mark.slow
def test_a_smoke_run_of_the_quickstart_updates_the_policy_and_gives_the_pinned_numbers(tmp_path):
    """`agentgym-rl quickstart` (what `make demo` runs) with the smoke preset: its training, then
    its before/after tables and report."""
    preset = smoke_overrides("train", yaml.safe_load((REPO / "src" / "agentgym_rl" / "configs" /
                                                       "quickstart.yaml").read_text()))
    code, out, err = cli("quickstart", *preset, f"run.output_dir={tmp_path}")
    assert code == 0, err
    run = tmp_path / "quickstart_smoke"
    report = json.loads((run / "report" / "quickstart.json").read_text())
    assert report["before"]["step"] == 0 and report["after"]["step"] == 2
    assert set(report["after"]["item_success"]) == {"babyai_0", "babyai_1"} and "GoTo" in report["after"]["by_category"]
    assert "after 2 RL steps (grpo + ScalingInter-RL)" in out and "before RL" in out and "RL changed test success" in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "update/trajectories" in r]
    assert len(steps) == 2
    assert all(r["update/trajectories"] > 0 and r["update/optimizer_steps"] > 0 and r["adv/adv_abs_mean"] > 0
               for r in steps), steps
    assert "all 2 steps updated the policy" in out + err
    # The penalty made the difference: some actions were valid, some not.
    assert all(0 < r["train/invalid_action_rate"] < 1 for r in steps)
    # A smoke run keeps no checkpoint (a SmolLM2 one's weighed 1.6 GB) unless asked.
    assert not list((tmp_path / "quickstart_smoke").glob("checkpoints/step_*"))

    assert len(rows) == len(PINNED)
    # New metrics may join a line; every pinned one must keep its value. The tolerance allows
    # float rounding (summation order across thread counts), not a changed computation.
    for got, want in zip(rows, PINNED):
        for key, value in want.items():
            assert key in got, (want["step"], key)
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (want["step"], key)


def test_the_sciworld_preset_gives_rejected_actions_a_signal():
    """SciWorld's smoke run once updated nothing: every action of the warmed-up tiny model was
    rejected and every group tied (`make smoke` checks the update itself)."""
    preset = smoke_overrides("train", {"env": {"id": "sciworld"}})
    assert "algo.invalid_turn_penalty=0.5" in preset
    assert "algo.invalid_turn_penalty=0.5" not in smoke_overrides("train", {"env": {"id": "babyai"}})
