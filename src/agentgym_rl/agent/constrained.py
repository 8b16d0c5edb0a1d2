"""Decoding restricted to given replies: each row's continuation must be one of its allowed
token sequences, e.g. every action the environment lists, written as the model was trained to
write it. An evaluation aid (how good are the model's choices once it cannot misspell them?):
the log-probabilities it reports are those of the restricted distribution."""

from __future__ import annotations

from typing import Any

Trie = dict[int, "Trie"]


def build_trie(sequences: list[list[int]]) -> Trie:
    """Token sequences as nested dicts, token -> the trie of what may follow it."""
    root: Trie = {}
    for sequence in sequences:
        node = root
        for token in sequence:
            node = node.setdefault(token, {})
    return root


def allowed_next(trie: Trie, generated: list[int]) -> list[int] | None:
    """Tokens that may follow `generated` (ids written so far in this reply); None when any may:
    the reply is complete, or it has left the trie (it never does while the trie is applied)."""
    node = trie
    for token in generated:
        node = node.get(token)
        if node is None:
            return None
    return list(node) or None


class AllowedReplies:
    """A transformers logits processor: row r may only continue one of `allowed[r]`.

    Args:
        allowed: per row, the token sequences its reply must be one of, each ending with a stop
            token (so none is a prefix of another); an empty list leaves the row free.
        prompt_width: columns of `input_ids` before the first generated token.
    """

    def __init__(self, allowed: list[list[list[int]]], prompt_width: int):
        self.tries = [build_trie(sequences) for sequences in allowed]
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """input_ids: (B, W + t) every column so far; scores: (B, V) the next token's scores."""
        import torch

        for row, trie in enumerate(self.tries):
            keep = allowed_next(trie, input_ids[row, self.prompt_width:].tolist()) if trie else None
            if keep is None:
                continue
            keep_ids = torch.tensor(keep, dtype=torch.long, device=scores.device)
            kept = scores[row, keep_ids]
            scores[row] = float("-inf")
            scores[row, keep_ids] = kept
        return scores
