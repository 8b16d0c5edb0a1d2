"""Big CPU tensors handed back to the operating system when freed (glibc's malloc).

glibc serves an allocation from its heap unless it is larger than the mmap threshold, which it
raises, up to 32 MiB, each time a large mmapped block is freed. A 135M model's activations are
1-25 MiB tensors of many sizes, allocated and freed at every layer: once the threshold has grown
past them they come from the heap, whose freed pieces the process keeps, fragmented, so its
resident memory grows far beyond what is alive. One LoRA update of SmolLM2-135M-Instruct on 4
rows of 1,000 tokens peaked at 4.72 GB of resident memory with the default and 1.97 GB with a
fixed threshold of 1 MiB (full fine-tuning: 3.86 and 2.62 GB), ~20% slower (docs/BENCHMARKS.md).

Generation needs no fixed threshold: its big tensors (each turn's re-packed KV cache) are made
once a turn, so handing the heap's free pages back after every turn (`release_free_memory`,
which the generator calls) keeps its resident memory near what is alive at no cost per tensor.
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
