"""A trajectory's tokens as the trainer saw them: each id's text, its loss mask and logprob."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..agent.loading import load_tokenizer
from ..config import load_yaml
from .index import within


def tokenizer_folder(run_dir: Path) -> Path | None:
    """Where a run's tokenizer is: the tiny model it built, else its newest checkpoint's model,
    else the `model.path` of its config when that folder exists here."""
    if (run_dir / "base_model" / "tokenizer_config.json").is_file() and within(run_dir / "base_model", run_dir):
        return run_dir / "base_model"
    for model in sorted((run_dir / "checkpoints").glob("*/model"), reverse=True):
        if (model / "tokenizer_config.json").is_file() and within(model, run_dir):
            return model
    try:
        path = (load_yaml(run_dir / "config.yaml").get("model") or {}).get("path")
    except Exception:
        return None
    return Path(path) if path and (Path(path) / "tokenizer_config.json").is_file() else None


class TokenViews:
    """Decodes trajectories' token ids with their run's tokenizer (loaded once per run)."""

    def __init__(self) -> None:
        self._tokenizers: dict[Path, Any] = {}
        self._lock = threading.Lock()

    def tokenizer(self, run_dir: Path) -> Any | None:
        with self._lock:
            if run_dir not in self._tokenizers:
                folder = tokenizer_folder(run_dir)
                self._tokenizers[run_dir] = load_tokenizer(folder) if folder else None
            return self._tokenizers[run_dir]

    def view(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """{"text": [one string per id], "mask": [...], "logprob": [... or None], "window_starts":
        [...]} (where each context window after the first begins, `rollout.keep_turns`), or a
        "note" saying why there is none (no ids recorded, no tokenizer to read them)."""
        ids = record.get("input_ids")
        if not isinstance(ids, list) or not ids:
            return {"note": "this trajectory has no token ids (an evaluation that kept only the text)"}
        tokenizer = self.tokenizer(run_dir)
        if tokenizer is None:
            return {"note": "no tokenizer found in the run folder to decode its token ids"}
        mask = record.get("loss_mask") or [0] * len(ids)
        logprobs = record.get("logprobs") or []
        # Recorded for generated tokens only (0 elsewhere); demonstrations have none.
        logprobs = ([lp if m else None for lp, m in zip(logprobs, mask)] if len(logprobs) == len(ids)
                    else [None] * len(ids))
        starts = [start for start in record.get("window_starts") or [] if isinstance(start, int)]
        return {"text": [tokenizer.decode([i]) for i in ids], "mask": mask, "logprob": logprobs,
                "window_starts": starts}
