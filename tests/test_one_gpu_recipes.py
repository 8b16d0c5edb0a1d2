"""A user's own model on one GPU: the README's commands, run as written with `--smoke` on the tiny
model on the CPU (`run.device: auto` takes the CPU here: the tests hide GPUs), the model named by
a Hub id that is already in the local Hugging Face cache."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import CORPUS
from test_cli import run

from agentgym_rl.agent.models import hub_cached, model_folder
from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny
from agentgym_rl.errors import UserError

REPO = Path(__file__).resolve().parent.parent
HUB_ID = "local/tiny-chat"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hugging Face cache holding the tiny model as `huggingface-cli download local/tiny-chat`
    leaves a model: models--local--tiny-chat/{refs/main, snapshots/<commit>/}."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--local--tiny-chat"
    commit = "0123456789abcdef0123456789abcdef01234567"
    build_tiny(CORPUS * 3, repo / "snapshots" / commit, TinyModelConfig(
        vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
        max_positions=4096))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return cache


@pytest.fixture
def in_cache(hub_cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def readme_commands() -> list[str]:
    """The train commands of the README's "Your model on one GPU" block."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"### Your model on one GPU\n\n```bash\n(.*?)```", text, re.S)
    assert block, "README has no 'Your model on one GPU' block"
    return [line for line in block.group(1).splitlines() if line.startswith(".venv/bin/agentgym-rl train")]


def test_a_hub_id_is_read_from_the_local_cache_and_never_fetched(in_cache):
    assert hub_cached(HUB_ID) == next((in_cache / "models--local--tiny-chat" / "snapshots").iterdir())
    assert hub_cached("local/not-there") is None
    with pytest.raises(UserError, match="huggingface-cli download local/not-there"):
        model_folder("local/not-there")


def test_the_readme_names_three_commands_and_the_recipes_exist():
    commands = readme_commands()
    assert len(commands) == 2 and commands[0].endswith("--smoke") and not commands[1].endswith("--smoke")
    for command in commands:
        assert (REPO / shlex.split(command)[2]).is_file()


@pytest.mark.parametrize("recipe", ["one_gpu_babyai_grpo", "one_gpu_textcraft_grpo"])
def test_the_readmes_smoke_command_runs_on_the_cpu(in_cache, tmp_path, recipe):
    words = shlex.split(readme_commands()[0])[1:]  # what follows `agentgym-rl`
    words = [str(REPO / word.replace("one_gpu_babyai_grpo", recipe)) if word.startswith("configs/") else word
             for word in words]
    words = [f"model.path={HUB_ID}" if word.startswith("model.path=") else word for word in words]
    result = run(*words, f"run.output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^device cpu \(\d+ threads?\), float32$", result.stdout, re.M), result.stdout[:2000]
    rows = [json.loads(line) for line in (tmp_path / f"{recipe}_smoke" / "metrics.jsonl").read_text().splitlines()]
    assert any(row["step"] == 1 and "train/success" in row for row in rows)
