"""Shared prompts run once in the update: rows that open with the same tokens as one tree row.

The samples of a GRPO group open with the same prompt (the system message, the task's first
observation and any reply prefix: 159-233 of the 416-844 tokens of SmolLM2's 4-turn BabyAI
episodes in docs/BENCHMARKS.md), and a padded batch runs the model over it once per sample. A *family* of rows that share a prefix of P tokens is laid out as
one tree row instead, the prefix once and then each member's remaining tokens:

    rows      [p p p a a]  [p p p b]  [p p p c c c]          (B, T) as collated
    tree row  [p p p | a a | b | c c c]                      one row of P + Σ suffixes
    positions [0 1 2 | 3 4 | 3 | 3 4 5]                      each suffix continues the prefix

A suffix token attends to the prefix and to the earlier tokens of its own suffix
(`agent.attention.grouped_sdpa` does this when handed the layout), so every token's hidden state
is the one its row computes alone; the tree's hidden states are gathered back into the (B, T)
layout (`tree_inputs`' gather index) and everything after the trunk is unchanged. The prefix's gradient
is the sum over the family's members, as autograd's gather gives it.

The prefix stops before the first token any member trains on, so no trained token is shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import TokenBatch, pack_by_width

MIN_SHARED = 32
"""Fewest shared tokens a family needs: a floor (not tuned) against families that save less than
their extra attention calls cost."""


@dataclass(frozen=True)
class TreeRow:
    """One tree row: `prefix` tokens, then the suffix spans [start, end) of its members in order."""

    rows: tuple[int, ...]
    """The batch rows laid out here, in the order of `suffixes`."""
    prefix: int
    suffixes: tuple[tuple[int, int], ...]

    @property
    def width(self) -> int:
        return self.suffixes[-1][1] if self.suffixes else self.prefix


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def families(tokens: list[list[int]], first_trained: list[int], max_tokens: int = 0, max_rows: int = 0,
             min_shared: int = MIN_SHARED) -> list[tuple[list[int], int]]:
    """Group rows into families that share a prefix, as (rows, prefix length), saving the most.

    A row's shareable part is its tokens before `first_trained[row]` (the position of its first
    trained token). Rows sorted by that part have their longest common prefixes next to each
    other; a family is a run of neighbours, sharing the shortest common prefix of the run, and
    saves (members - 1) × prefix tokens. The runs that save the most in total are found by
    dynamic programming over the sorted rows, keeping each family to at least `min_shared`
    shared tokens, its tree row within `max_tokens` and its members within `max_rows` (0: no
    cap). A row alone has prefix 0.

    Args:
        tokens: each row's token ids (no padding).
        first_trained: each row's first position on the loss mask (its length if none).
    Returns:
        families covering every row once, ordered by their first row; rows ascending.
    """
    shareable = [row[:cut] for row, cut in zip(tokens, first_trained)]
    order = sorted(range(len(tokens)), key=lambda r: (shareable[r], r))
    n = len(order)
    # neighbours[k]: tokens shared by the k-th and (k+1)-th sorted rows.
    neighbours = [_common_prefix(shareable[order[k]], shareable[order[k + 1]]) for k in range(n - 1)]
    best = [0] * (n + 1)  # best[j]: most tokens saved over the first j sorted rows
    cut = list(range(n + 1))  # cut[j]: where the family ending at sorted row j - 1 starts
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], j - 1
        shared, total = len(shareable[order[j - 1]]), len(tokens[order[j - 1]])
        for i in range(j - 2, -1, -1):  # the family of sorted rows i .. j - 1
            shared = min(shared, neighbours[i])
            total += len(tokens[order[i]])
            members = j - i
            if shared < min_shared or (max_rows and members > max_rows):
                break
            if max_tokens and total - (members - 1) * shared > max_tokens:
                break  # widening the family only widens its tree row
            if best[i] + (members - 1) * shared > best[j]:
                best[j], cut[j] = best[i] + (members - 1) * shared, i
    out: list[tuple[list[int], int]] = []
    j = n
    while j > 0:
        i = cut[j]
        rows = sorted(order[i:j])
        shared = min(neighbours[i:j - 1]) if j - i > 1 else 0
        out.append((rows, shared))
        j = i
    return sorted(out)


def tree_rows(lengths: list[int], family_list: list[tuple[list[int], int]]) -> list[TreeRow]:
    """The tree row of each family: its prefix, then each member's tokens after it."""
    out = []
    for rows, prefix in family_list:
        spans, start = [], prefix
        for row in rows:
            spans.append((start, start + lengths[row] - prefix))
            start += lengths[row] - prefix
        out.append(TreeRow(tuple(rows), prefix, tuple(spans)))
    return out


def tree_inputs(input_ids: torch.Tensor, lengths: list[int], trees: list[TreeRow],
                pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree rows' tensors, for a padded (B, T) batch whose rows `trees` cover once each.

    Returns:
        input_ids (U, W) long and position_ids (U, W) long of the U tree rows, right-padded to
        the widest (W); and gather (B, T) long: for batch position (b, t), the index into the
        tree rows flattened to U·W holding the same token (padding positions point at index 0).
    """
    batch, width = input_ids.shape
    tree_width = max(tree.width for tree in trees)
    ids = torch.full((len(trees), tree_width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(trees), tree_width), dtype=torch.long)
    gather = torch.zeros((batch, width), dtype=torch.long)
    for u, tree in enumerate(trees):
        base = u * tree_width
        first = tree.rows[0]
        ids[u, :tree.prefix] = input_ids[first, :tree.prefix]
        positions[u, :tree.prefix] = torch.arange(tree.prefix)
        for row, (start, end) in zip(tree.rows, tree.suffixes):
            n = lengths[row]
            ids[u, start:end] = input_ids[row, tree.prefix:n]
            positions[u, start:end] = torch.arange(tree.prefix, n)
            gather[row, :tree.prefix] = base + torch.arange(tree.prefix)
            gather[row, tree.prefix:n] = base + torch.arange(start, end)
    return ids, positions, gather


def tree_micro_batches(batch: TokenBatch, size: int, max_tokens: int = 0,
                       min_shared: int = MIN_SHARED) -> list[tuple[list[int], TokenBatch, list[TreeRow]]]:
    """`batch.micro_batches` with families of rows that share a prefix kept together: each item
    is (row indices, the micro-batch of those rows, its tree rows indexing the micro-batch's
    rows). At most `size` rows a micro-batch and, with `max_tokens`, at most that many tree-row
    cells (tree rows × the widest), never less than one tree row; tree rows are taken narrowest
    first, so tree rows of similar width share a micro-batch."""
    lengths = batch.attention_mask.sum(1).tolist()
    trained = batch.trained_positions()
    firsts = [int(row.nonzero()[0]) if row.any() else n for row, n in zip(trained, lengths)]
    tokens = [ids[:n].tolist() for ids, n in zip(batch.input_ids, lengths)]
    trees = tree_rows(lengths, families(tokens, firsts, max_tokens, size, min_shared))
    out: list[tuple[list[int], TokenBatch, list[TreeRow]]] = []
    for units in pack_by_width([tree.width for tree in trees], [len(tree.rows) for tree in trees], size,
                               max_tokens, cell_rows=[1] * len(trees)):
        taken = [trees[u] for u in units]
        rows = [row for tree in taken for row in tree.rows]
        local = {row: i for i, row in enumerate(rows)}
        out.append((rows, batch.select(rows),
                    [TreeRow(tuple(local[r] for r in tree.rows), tree.prefix, tree.suffixes) for tree in taken]))
    return out
