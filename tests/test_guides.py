"""The user guides' code runs against the current code: a guide that no longer matches it fails here.

For each of `docs/guides/environment.md` and `docs/guides/algorithm.md`, in a fresh working folder and in page
order: a block with a title (```python title="guess_game.py"```, ```yaml title="guess_grpo.yaml"```) is written to
that file, a ```python block without one is executed (one namespace per page), and a ```diff block titled with a
repository file must find its context and removed lines in that file. Other blocks (bash) are not run. What a page
registers (environments, advantage estimators, losses, KL estimators) and the modules it imports from its folder
are removed afterwards, so that other tests in the process see the registries as they were.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from agentgym_rl.algos import registry as algo_registry
from agentgym_rl.envs import registry as env_registry

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ["environment.md", "algorithm.md"]
FENCE = re.compile(r"^```(\w+)[ \t]*(.*?)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r'title="([^"]+)"')


def blocks(page: Path) -> list[tuple[str, str | None, str]]:
    """(language, title or None, text) of each top-level fenced block of `page`, in order."""
    found = []
    for language, options, text in FENCE.findall(page.read_text()):
        title = TITLE.search(options)
        found.append((language, title.group(1) if title else None, text))
    return found


def check_diff(title: str, text: str) -> None:
    """Every context (" ") and removed ("-") line of a diff block is a line of the repository file it names."""
    source = ROOT / title
    assert source.is_file(), f"a diff block names {title}, which does not exist"
    lines = {line.strip() for line in source.read_text().splitlines()}
    for line in text.splitlines():
        if line[:1] in (" ", "-") and line[1:].strip():
            assert line[1:].strip() in lines, f"{title} has no line {line[1:].strip()!r} (a diff block of a guide)"


@pytest.fixture
def registries():
    """The registry tables as they were before the page ran, restored after it."""
    tables = [env_registry._REGISTRY, algo_registry.ADVANTAGE, algo_registry.LOSS, algo_registry.KL,
              algo_registry.SCHEDULE]
    before = [set(table) for table in tables]
    yield
    for table, keys in zip(tables, before):
        for key in set(table) - keys:
            del table[key]


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guide_runs(guide, tmp_path, monkeypatch, registries):
    page = ROOT / "docs" / "guides" / guide
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # its files import one another, as in a script's folder
    namespace = {"__name__": f"guide_{page.stem}"}
    ran = 0
    try:
        for number, (language, title, text) in enumerate(blocks(page), 1):
            where = f"{guide}, block {number}"
            if language == "diff" and title:
                check_diff(title, text)
            elif title:
                path = tmp_path / title
                assert path.resolve().is_relative_to(tmp_path.resolve()), f"{where}: {title} is outside its folder"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            elif language == "python":
                exec(compile(text, where, "exec"), namespace)
                ran += 1
    finally:
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(tmp_path.resolve()):
                del sys.modules[name]
    assert ran, f"{guide} has no python block to run"
