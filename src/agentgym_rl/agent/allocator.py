"""Big CPU tensors handed back to the operating system when freed (glibc's malloc).

glibc serves an allocation from its heap unless it is larger than the mmap threshold, which it
raises, up to 32 MiB, each time a large mmapped block is freed. A 135M model's activations are
1-25 MiB tensors of many sizes, allocated and freed at every layer: once the threshold has grown
past them they come from the heap, whose freed pieces the process keeps, fragmented, so its
resident memory grows far beyond what is alive. One LoRA update of SmolLM2-135M-Instruct on 4
rows of 1,000 tokens peaked at 4.72 GB of resident memory with the default and 1.97 GB with a
fixed threshold of 1 MiB (full fine-tuning: 3.86 and 2.62 GB), ~20% slower (docs/BENCHMARKS.md):
every tensor above the threshold is a fresh mapping whose pages fault in on first touch.

The learner also hands the heap's free pages back after every micro-batch (`release_free_memory`):
what one micro-batch fragmented is not kept under the next. With that, a full fine-tune can
afford a 16 MiB threshold (a layer's hidden states then come from the heap, without faults);
a LoRA update cannot, its heap fragmenting within one micro-batch. "auto" picks per process.

Generation needs no fixed threshold: its big tensors (each turn's re-packed KV cache) are made
once a turn, so handing the heap's free pages back after every turn (which the generator does)
keeps its resident memory near what is alive at no cost per tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the threshold (malloc.h)."""


@cache
def _libc_function(name: str, argtypes: tuple) -> ctypes._CFuncPtr | None:
    """glibc's function `name`, or None where the C library has none (musl, macOS)."""
    library = ctypes.util.find_library("c")
    if not library:
        return None
    try:
        function = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


AUTO_FULL_KB = 16 * 1024
"""`"auto"` while fully fine-tuning. One GRPO step of SmolLM2 on 32 BabyAI episodes of 8 turns:
update 247 s and 3.24 GB peak, against 327 s and 2.82 GB at 1 MiB (docs/BENCHMARKS.md)."""
AUTO_OTHER_KB = 1024
"""`"auto"` with a LoRA adapter and in evaluation. The same step with LoRA: 2.35 GB, against
4.02-4.18 GB at 16 MiB."""


def mmap_threshold_kb(setting: int | str, full_fine_tuning: bool) -> int:
    """The threshold in KiB that `run.malloc_mmap_threshold_kb` asks for: a number as it is,
    "auto" by whether the process updates every weight of its model."""
    if setting == "auto":
        return AUTO_FULL_KB if full_fine_tuning else AUTO_OTHER_KB
    return int(setting)


def set_mmap_threshold(kilobytes: int) -> bool:
    """Allocations above `kilobytes` KiB get their own mapping, returned to the system when
    freed, for the rest of the process (0 leaves glibc's adaptive default). Whether it was set:
    False where the C library has no mallopt."""
    if not kilobytes:
        return False
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, kilobytes * 1024) == 1)


def release_free_memory() -> bool:
    """Hand the free pages of malloc's heap back to the system now (glibc's `malloc_trim`);
    whether any were: False too where the C library has no such call."""
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    return bool(trim and trim(0) == 1)
