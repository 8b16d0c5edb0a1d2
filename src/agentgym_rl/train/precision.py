"""Mixed precision for the learner's passes (`optim.compute_dtype`).

The parameters and the optimizer's state keep their dtype (`run.dtype`, float32 by default);
under autocast the model's trunk runs its matrix products in bfloat16, and the output head and
the softmax over the vocabulary run in the parameters' dtype on the trunk's output
(`learner.token_outputs`; an FSDP-sharded model runs its head inside its forward, under autocast). On a CPU that computes
bfloat16 natively (`avx512_bf16` or `amx_bf16`) a forward and backward pass of SmolLM2-135M took
a third of the float32 time (docs/BENCHMARKS.md); on one that does not, torch emulates it and it
is slower, so "auto" asks the hardware.
"""

from __future__ import annotations

from pathlib import Path

import torch

NATIVE_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of CPUs with bfloat16 arithmetic in hardware."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first processor's flags in `cpuinfo` (empty where there is no such file: not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def autocast_dtype(setting: str, device: torch.device, flags: set[str] | None = None) -> torch.dtype | None:
    """The dtype the learner's trunk autocasts to under `optim.compute_dtype` (None: no autocast,
    float32 throughout).

    Args:
        setting: "float32", "bfloat16", or "auto": bfloat16 where the device computes it natively
            (a CUDA device that supports it; a CPU with one of `NATIVE_CPU_FLAGS`), else float32.
        device: where the learner's model is.
        flags: the CPU's flags (default: read from /proc/cpuinfo), for "auto" on a CPU.
    """
    if setting == "float32":
        return None
    if setting == "bfloat16":
        return torch.bfloat16
    if setting != "auto":
        raise ValueError(f"optim.compute_dtype must be float32, bfloat16 or auto, got {setting!r}")
    if device.type == "cuda":
        try:  # without emulation: a GPU before Ampere would run bfloat16 slower than float32
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.3 had no such argument and counted native support only
            native = torch.cuda.is_bf16_supported()
        return torch.bfloat16 if native else None
    if device.type == "cpu":
        native = set(NATIVE_CPU_FLAGS) & (cpu_flags() if flags is None else flags)
        return torch.bfloat16 if native else None
    return None
