"""Progress bars on a terminal, progress lines in a captured log.

A captured log (a file, CI, `nohup`) cannot take a bar redrawn with carriage returns: it would
fill with partial lines and escape codes. There the bar becomes a whole line at most once a
minute while the work is under way (`validation (step 0):  33% 30/90 [12:01<24:03, 24.05s/ep]`),
so that a long evaluation in a log says how far it is instead of nothing for half an hour.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator

LOG_EVERY_S = 60.0
"""The least time between two progress lines of one bar in a captured log."""

_clock = time.monotonic  # a test replaces it


def bars_shown() -> bool:
    """Whether progress bars are drawn: only when stderr, where tqdm draws them, is a terminal."""
    return sys.stderr.isatty()


def progress_bar(*args: Any, disable: bool = False, **kwargs: Any) -> Any:
    """`tqdm(*args, **kwargs)` on a terminal; a `ProgressLines` off one (nothing when `disable`)."""
    if bars_shown() or disable:
        from tqdm import tqdm

        return tqdm(*args, disable=disable, **kwargs)
    return ProgressLines(*args, **kwargs)


class ProgressLines:
    """The part of tqdm's interface the commands use (iterate, `update`, `set_postfix`,
    `set_description`, `with`), written to stderr as a line at most every `LOG_EVERY_S` seconds
    after the last, only on an update that leaves work to do: not at the start, whose count
    says nothing yet, nor at the end, which the command's own lines report."""

    disable = True  # no bar is drawn: callers print their own lines directly, not above a bar

    def __init__(self, iterable: Iterable | None = None, desc: str = "", total: int | None = None,
                 unit: str = "it", initial: int = 0, **_ignored: Any) -> None:
        self.iterable, self.desc, self.unit, self.n, self.initial = iterable, desc, unit, initial, initial
        self.total = total  # every caller gives it, an iterated bar too
        self.postfix = ""
        self.began = self.last_line = _clock()

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update()

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def close(self) -> None:
        return None

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def update(self, n: int = 1) -> None:
        from tqdm import tqdm

        self.n += n
        now = _clock()
        if now - self.last_line < LOG_EVERY_S or (self.total is not None and self.n >= self.total):
            return
        self.last_line = now
        line = tqdm.format_meter(self.n, self.total, now - self.began, ncols=0, prefix=self.desc, unit=self.unit,
                                 ascii=True, postfix=self.postfix or None, initial=self.initial)
        print(line, file=sys.stderr, flush=True)


def count_as_done(bar: Any, n: int) -> None:
    """Advance `bar` (a `progress_bar`) by `n` units done before it began, such as episodes read
    back from a journal: they count towards its total but not its rate, so the time it shows
    left is the work left at the pace of the work done here."""
    if not n:
        return
    bar.n += n
    bar.initial = getattr(bar, "initial", 0) + n  # the whole run's rate: (n - initial) / elapsed
    if hasattr(bar, "last_print_n"):  # tqdm's smoothed rate takes the units since its last redraw
        bar.last_print_n += n
        bar.refresh()
