"""Reading the JSON-lines files a run writes (`metrics.jsonl`, trajectory files), which a
process killed mid-write leaves ending in half a line."""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

from .errors import UserError


def warn_on_stderr(message: str) -> None:
    """Where the readers of run files say what they skipped, unless told otherwise."""
    print(message, file=sys.stderr)


def read_json_lines(path: str | Path, warn: Callable[[str], object] = warn_on_stderr) -> list[Any]:
    """The JSON value of every non-empty line of `path`.

    A last line without its newline that does not parse is what a write cut short leaves: it
    is skipped with a warning (to `warn`; stderr by default). Any other line that does not
    parse is a `UserError` naming the file and line. A `.gz` file is read through gzip (e.g.
    a validation's episodes kept as `train.baseline`).
    """
    source = Path(path)
    if source.suffix == ".gz":
        try:
            return _read(gzip.open(source, "rt", encoding="utf-8", errors="replace"), source, warn)
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            raise UserError(f"{source}: not a whole gzip file ({error})") from None
    return _read(source.open(encoding="utf-8", errors="replace"), source, warn)


def _read(opened: Any, source: Path, warn: Callable[[str], object]) -> list[Any]:
    values = []
    with opened as lines:  # line by line: trajectory files grow large
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                values.append(json.loads(line))
            except json.JSONDecodeError as error:
                if not line.endswith("\n"):  # the last line, and its write never finished
                    warn(f"warning: {source} ends in an unfinished line ({len(line)} characters, written when the "
                         "process was stopped?); it is skipped")
                    break
                raise UserError(f"{source}:{number}: not JSON ({error.msg}); fix or remove that line") from None
    return values
