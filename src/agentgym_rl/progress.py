"""Progress bars drawn only on a terminal.

A captured log (a file, CI, `nohup`) gets the commands' own lines and nothing else: a bar
redrawn with carriage returns would fill it with partial lines and escape codes.
"""

from __future__ import annotations

import sys
from typing import Any


def bars_shown() -> bool:
    """Whether progress bars are drawn: only when stderr, where tqdm draws them, is a terminal."""
    return sys.stderr.isatty()


def progress_bar(*args: Any, disable: bool = False, **kwargs: Any) -> Any:
    """`tqdm(*args, **kwargs)`, disabled (still iterable, still counting) off a terminal."""
    from tqdm import tqdm

    return tqdm(*args, disable=disable or not bars_shown(), **kwargs)
