"""An optional dependency a config asks for (a logger, vLLM, Ray, the web env's browser,
SciWorld's Java) that is missing is one line before any work: no model is built and no run
folder is written."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from test_cli import run
from test_run_safety import REPO, TOY


@pytest.mark.parametrize("overrides, missing, said", [
    (["run.loggers=[tensorboard,mlflow]"], "mlflow", "run.loggers names mlflow, which is not installed"),
    (["run.loggers=[wandb]"], "wandb", "run.loggers names wandb, which is not installed"),
    (["rollout.generator=vllm"], "vllm", "rollout.generator: vllm needs vLLM"),
    (["env.urls=[ray:local]"], "ray", "env.urls names Ray, which is not installed"),
    (["rollout.workers=2"], "ray", "rollout.workers run on Ray, which is not installed"),
    (["env.id=web", "env.kwargs={}"], "playwright", "the web environment needs Playwright"),
    (["env.id=sciworld", "env.kwargs={}"], "java", "sciworld needs Java"),
    (["env.id=mix", "env.kwargs={members: [{id: babyai}, {id: sciworld}]}"], "java", "sciworld needs Java"),
])
def test_a_missing_dependency_is_one_line_before_any_run_folder(tmp_path, monkeypatch, counter_env_registered,
                                                                 overrides, missing, said):
    find_spec, which = importlib.util.find_spec, shutil.which
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == missing else which(name, *a, **k))
    result = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
                 "run.name=toy", *overrides)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "toy").exists()


def test_the_web_env_without_chromium_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CHROMIUM", str(tmp_path / "no-such-chromium"))
    result = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
                 "run.name=toy", "env.id=web", "env.kwargs={}")
    assert result.returncode == 2 and "the web environment: Chromium executable" in result.stderr, result.stderr
    assert not (tmp_path / "toy").exists()
