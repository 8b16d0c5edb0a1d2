"""The smoke preset (`--smoke`): every config resolves with it, and a smoke run of the BabyAI
GRPO config updates the policy from advantages that are not all zero (`make smoke` runs every
config this way)."""

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
        assert resolved["train"]["steps"] == 2 and resolved["env"]["invalid_action_penalty"] > 0
        # A pretrained model starts as it is; the tiny model is warmed up (fewer demonstrations
        # where the expert's episodes are long or slow: SciWorld, the web).
        assert (resolved["warmup"]["episodes"] == 0) == (resolved["model"]["path"] is not None)
    if "dpo" in resolved or "rft" in resolved:  # start from a tiny model they build, not another run's folder
        assert resolved["model"]["path"] is None and resolved["warmup"]["episodes"] > 0


def test_the_users_overrides_go_over_the_preset():
    code, out, err = cli("config", str(REPO / "configs" / "babyai_grpo.yaml"), "--smoke", "train.steps=3",
                         "run.name=mine")
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["train"]["steps"] == 3 and resolved["run"]["name"] == "mine"
    assert smoke_overrides("train", {"run": {"name": "x"}})[:2] == ["run.overwrite=true", "run.name=x_smoke"]


def test_smoke_and_resume_together_is_one_line():
    code, _, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), "--smoke", "--resume")
    assert code == 2 and "--resume continues a run and --smoke starts it afresh" in err


@pytest.mark.slow
def test_a_smoke_run_updates_the_policy_from_nonzero_advantages(tmp_path):
    code, out, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), "--smoke",
                         f"run.output_dir={tmp_path}")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "babyai_grpo_smoke" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "update/trajectories" in r]
    assert len(steps) == 2
    assert all(r["update/trajectories"] > 0 and r["update/optimizer_steps"] > 0 and r["adv/adv_abs_mean"] > 0
               for r in steps), steps
    assert "all 2 steps updated the policy" in out + err
    # The penalty made the difference: some actions were valid, some not.
    assert all(0 < r["train/invalid_action_rate"] < 1 for r in steps)
