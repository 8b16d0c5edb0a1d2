"""The docs site and the README: the site builds strictly (a broken link or a missing page
fails), its config reference lists every key `agentgym-rl config --keys` lists, its command
reference every command, and the README stays a five-minute read."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from agentgym_rl.cli import app
from agentgym_rl.config.describe import _classes, show_config

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # --quiet would hide the warnings strict counts


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([*MKDOCS, "-f", str(root / "mkdocs.yml"), "-d", str(site)], capture_output=True,
                          text=True, env=env, cwd=root, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = build(ROOT, site)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def page_text(site: Path, page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text()))


def test_the_config_reference_lists_every_key_config_keys_lists(site):
    reference = (site / "reference" / "config" / "index.html").read_text()
    codes = set(re.findall(r"<code>([^<]+)</code>", reference))
    for kind in _classes():
        keys = [line.split()[0] for line in show_config(None, [], kind, keys=True).splitlines()]
        assert len(keys) > 20
        missing = [key for key in keys if key not in codes]
        assert not missing, f"{kind}: keys missing from the config reference: {missing}"


def test_the_metrics_reference_describes_every_metric_name(site):
    from agentgym_rl import metric_names

    text = page_text(site, "reference/metrics")
    assert all(key in text for key in metric_names.DOCS)
    assert metric_names.DOCS[metric_names.TRAIN_REWARD_STD] in text


def test_the_command_reference_lists_every_command_and_option(site):
    text = page_text(site, "reference/cli")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f"agentgym-rl {name}" in text, name
        for param in command.params:
            for option in param.opts:
                if option.startswith("--"):
                    assert option in text, f"{name} {option}"


def test_a_broken_link_fails_the_build(tmp_path):
    for path in ("mkdocs.yml", "docs", "scripts/docs_reference.py"):
        source, target = ROOT / path, tmp_path / path
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.png"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[a page that is not there](guides/nowhere.md)\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "nowhere.md" in result.stdout + result.stderr


def readme_prose(lines: list[str]) -> list[str]:
    """The README's lines outside code blocks."""
    prose, in_code = [], False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            prose.append(line)
    return prose


def test_the_readme_is_short_and_shows_the_gpu_commands_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    long_lines = [line[:60] for line in readme_prose(lines) if len(line) > 200]
    assert not long_lines
    first_screen = "\n".join(lines[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    assert first_screen.count("agentgym-rl train configs/gpu/one_gpu_babyai_grpo.yaml") == 2
    assert "make gpu" in first_screen


def test_the_readme_links_to_files_that_exist():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [target for target in targets if not target.startswith("http") and not (ROOT / target).exists()]
    assert not missing
