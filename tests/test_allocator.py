"""`run.malloc_mmap_threshold_kb`: big tensors freed go back to the system (glibc)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from agentgym_rl.agent.allocator import _libc_function, mmap_threshold_kb, set_mmap_threshold

# In a process of its own: the threshold holds for the rest of the process that sets it.
FREED = """
import sys, torch
from agentgym_rl.agent.allocator import release_free_memory, set_mmap_threshold

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

assert set_mmap_threshold(int(sys.argv[1])) == (sys.argv[1] != "0")
trim = sys.argv[2] == "trim"
# Grow glibc's adaptive threshold past the tensors below first, as a model's first steps do.
torch.empty(16 << 20, dtype=torch.uint8).fill_(1)  # allocated and freed at once
base = resident_mib()
pieces = [torch.empty((3 + i % 5) << 20, dtype=torch.uint8).fill_(1) for i in range(60)]
held = resident_mib() - base
del pieces[::2]  # every other piece: the heap cannot shrink from its top
if trim:
    assert release_free_memory()
print(round(held), round(resident_mib() - base))
"""


GLIBC = pytest.mark.skipif(_libc_function("malloc_trim", (ctypes.c_size_t,)) is None or sys.platform != "linux",
                           reason="glibc's malloc on Linux")


def run(kilobytes: int, trim: bool = False) -> tuple[int, int]:
    """(MiB held by 60 pieces of 3-7 MiB, MiB still resident after freeing every other one)."""
    result = subprocess.run([sys.executable, "-c", FREED, str(kilobytes), "trim" if trim else "keep"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    held, after = map(int, result.stdout.split())
    return held, after


@GLIBC
def test_with_a_threshold_freed_tensors_leave_the_process():
    held, kept_by_default = run(0)
    assert held > 250 and kept_by_default > 0.9 * held  # the heap keeps the freed half
    held, kept_with_threshold = run(1024)
    assert held > 250 and kept_with_threshold < 0.6 * held  # about the half still alive


def test_zero_leaves_the_default():
    assert set_mmap_threshold(0) is False


def test_auto_is_16_mib_for_a_full_fine_tune_and_1_mib_otherwise():
    assert mmap_threshold_kb("auto", full_fine_tuning=True) == 16384
    assert mmap_threshold_kb("auto", full_fine_tuning=False) == 1024
    assert mmap_threshold_kb(2048, full_fine_tuning=True) == mmap_threshold_kb(2048, full_fine_tuning=False) == 2048
    assert mmap_threshold_kb(0, full_fine_tuning=True) == 0


@GLIBC
def test_releasing_free_memory_hands_the_heaps_holes_back():
    """What the generator does after every turn, with glibc's own threshold."""
    held, kept = run(0, trim=True)
    assert held > 250 and kept < 0.6 * held


def test_a_recipe_run_sets_16_mib_fully_fine_tuning_and_1_mib_with_lora():
    from pathlib import Path

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.session import training_threshold_kb

    recipe = Path(__file__).resolve().parents[1] / "configs" / "smollm2_babyai_grpo.yaml"
    assert training_threshold_kb(load_config(RLConfig, recipe)) == 16384
    assert training_threshold_kb(load_config(RLConfig, recipe, ["model.lora_rank=16"])) == 1024
    assert training_threshold_kb(load_config(RLConfig, recipe, ["model.lora_rank=16",
                                                                 "run.malloc_mmap_threshold_kb=64"])) == 64
