"""`scripts/gpu-check.sh` spends a short GPU loan on every part it can: each part runs under a
timeout within `BUDGET` seconds, and a part that fails or has no time left is listed at the end
instead of stopping the parts after it (its whole run on a CPU, `DEVICE=cpu`, takes ~3 minutes and
is done by hand before a loan; docs/SCALING.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check.sh"


def test_with_no_budget_left_every_part_is_reported_and_none_runs(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path), "BUDGET": "0", "PYTHON": sys.executable,
           "WHEELS": str(tmp_path / "no-wheels")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    failed = (tmp_path / "failed.txt").read_text().splitlines()
    skipped = [line for line in failed if line.startswith("skipped, no time left: ")]
    # the GRPO step, the slots step and torchrun; eval, the one-GPU recipe and serve-model need a checkpoint
    assert [line.split(" run.name=")[-1] for line in skipped] == ["grpo", "slots", "fsdp"]
    assert "the GRPO step left no checkpoint: eval and the one-GPU recipe not run" in failed
    assert failed[-1].startswith("serve-model and its evals not run")
    assert not (tmp_path / "grpo").exists()
    assert "these parts failed or did not run" in done.stderr


def test_a_failing_part_is_listed_and_the_parts_after_it_still_run(tmp_path):
    # A stand-in Python whose train commands fail at once; everything else is the real one.
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/bash\nfor a in "$@"; do [ "$a" = train ] && exit 1; done\nexec {sys.executable} "$@"\n')
    stub.chmod(0o755)
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"), "PYTHON": str(stub),
           "WHEELS": str(tmp_path / "no-wheels")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    failed = (tmp_path / "out" / "failed.txt").read_text().splitlines()
    exited = [line for line in failed if line.startswith("exit 1 after ")]
    assert [line.split(" run.name=")[-1] for line in exited] == ["grpo", "slots", "fsdp"]
    assert "the GRPO step left no checkpoint: eval and the one-GPU recipe not run" in failed
