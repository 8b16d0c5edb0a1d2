"""Sampling over a `SlotCache`: each episode keeps its keys and values in its own slot across
turns, and a turn runs only its new tokens (the first slice of the CUDA-graph decoding backend,
docs/SCALING.md; eager here, on any device: no graphs are captured yet).

Its replies equal `HFGenerator`'s: the same ids and logprobs (up to rounding) for the same prompts
and streams, greedy or sampled (tests/test_slot_generator.py). Sampling draws each row's noise
on the device from (stream, position) (`sampling.position_seeds`), so a row samples the same
whatever else is in the batch.
"""

from __future__ import annotations

from typing import Any

from .generator import Generation
from .sampling import gumbel_noise, position_seeds
from .slot_cache import SlotCache


class SlotGenerator:
    """Batched sampling with a Hugging Face causal LM over `slots` rows of `max_len` tokens.

    A prompt continues the slot whose cached tokens are the longest proper prefix of it (the same
    episode's earlier turns: only the rest is run through the model), else takes a slot no prompt
    of the call continues, emptied. Every forward runs all slots (fixed shapes, as a CUDA graph
    needs); a slot without a prompt in the call gets padding that it never keeps.

    Args:
        model: a `transformers` causal LM whose forward takes per-row position ids and a 4D mask.
        pad_id: the id given to padding (never attended to).
        stop_ids: token ids that end a reply.
        temperature: 0 means greedy decoding.
        slots: rows of the cache: the most prompts of one batch (more are played in turns,
            without continuing each other's caches).
        max_len: tokens a slot holds: an episode's whole conversation.
    """

    restricts_replies = False

    def __init__(self, model: Any, pad_id: int, stop_ids: list[int], temperature: float = 1.0,
                 slots: int = 16, max_len: int = 2048):
        self.model, self.pad_id, self.stop_ids, self.temperature = model, pad_id, list(stop_ids), temperature
        self.slots, self.max_len = slots, max_len
        self._cache: SlotCache | None = None
        self._held: list[list[int]] = [[] for _ in range(slots)]
        """Each slot's ids, those in its cache first (`lengths` of them), then its last sampled id."""
        self.prefilled_columns = 0
        """Prompt tokens run through the model, summed over rows (padding not counted)."""
        self.reused_columns = 0
        """Prompt tokens read from a slot's cache instead."""

    @property
    def max_cached_batch(self) -> int:
        """Episodes worth playing at once: one a slot (more would not continue their caches)."""
        return self.slots

    def reset(self) -> None:
        """Forget every slot (the weights changed: their keys and values are stale)."""
        self._held = [[] for _ in range(self.slots)]
        if self._cache is not None:
            self._cache.reset()

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:
            self.model.load_state_dict(model.state_dict() if hasattr(model, "state_dict") else model)
        self.reset()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, allowed: Any = None,
                 streams: list[int] | None = None) -> list[Generation]:
        """One reply per prompt (with `streams`, prompt i samples from stream i)."""
        if allowed is not None:
            raise ValueError("a slot generator does not restrict replies to given sequences yet")
        room = self.max_len - 1  # the last column takes padding
        too_long = next((len(p) for p in prompts if len(p) + max_new_tokens > room), None)
        if too_long is not None:
            raise ValueError(f"a prompt of {too_long} tokens and {max_new_tokens} new ones pass the slots' "
                             f"{room} tokens")
        out: list[Generation] = []
        for start in range(0, len(prompts), self.slots):
            out += self._generate(prompts[start:start + self.slots], max_new_tokens,
                                  None if streams is None else streams[start:start + self.slots])
        return out

    # ------------------------------------------------------------------ internals
    def _assign(self, prompts: list[list[int]]) -> list[int]:
        """The slot of each prompt: the one continuing it the furthest, else one left free
        (emptied)."""
        lengths = self._cache.lengths.tolist()
        taken: list[int | None] = []
        for prompt in prompts:
            best = max((slot for slot in range(self.slots) if slot not in taken and 0 < lengths[slot] < len(prompt)
                        and prompt[:lengths[slot]] == self._held[slot][:lengths[slot]]),
                       key=lambda slot: lengths[slot], default=None)
            taken.append(best)
        free = iter(slot for slot in sorted(range(self.slots), key=lambda slot: lengths[slot]) if slot not in taken)
        assigned = [slot if slot is not None else next(free) for slot in taken]
        for slot, kept in zip(assigned, taken):
            if kept is None:
                self._cache.lengths[slot] = 0
        return assigned

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, streams: list[int] | None) -> list[Generation]:
        import torch

        device = next(self.model.parameters()).device
        if self._cache is None:
            self._cache = SlotCache(self.model.config.num_hidden_layers, self.slots, self.max_len, device)
        cache = self._cache
        rows = self._assign(prompts)
        cached = cache.lengths.tolist()
        suffixes = [prompt[cached[row]:] for prompt, row in zip(prompts, rows)]
        # A prompt that starts afresh as another does (a group's samples) is run once: its rows
        # take the first one's keys and values after the prefill.
        first_of: dict[tuple[int, ...], int] = {}
        copies = [(first_of.setdefault(tuple(prompt), row), row) if cached[row] == 0 else (row, row)
                  for prompt, row in zip(prompts, rows)]
        run = {source for source, _ in copies}
        self.reused_columns += sum(cached[row] for row in rows)
        self.prefilled_columns += sum(len(suffix) for suffix, row in zip(suffixes, rows) if row in run)
        width = max(map(len, suffixes))
        prefill = sorted(run)  # only these slots run the prefill
        ids = torch.full((len(prefill), width), self.pad_id, dtype=torch.long)
        counts = torch.zeros(len(prefill), dtype=torch.long)
        for place, row in enumerate(prefill):
            suffix = suffixes[rows.index(row)]
            ids[place, width - len(suffix):] = torch.tensor(suffix)
            counts[place] = len(suffix)
        index = torch.tensor(rows, device=device)
        sources = torch.tensor([prefill.index(source) for source, _ in copies], device=device)
        position = torch.tensor([len(p) for p in prompts], device=device)  # of each row's next new token
        stream_rows = None if streams is None else torch.tensor(streams, dtype=torch.long, device=device)
        replies: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        active = [True] * len(prompts)
        stops = set(self.stop_ids)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            logits = self._forward(ids.to(device), counts.to(device), torch.tensor(prefill, device=device))
            copied = [(source, row) for source, row in copies if source != row]
            if copied:
                cache.copy_rows(torch.tensor([s for s, _ in copied], device=device),
                                torch.tensor([r for _, r in copied], device=device))
            logits = logits[sources]  # (N, V)
            for step in range(max_new_tokens):
                chosen, chosen_logprobs = self._sample(logits, stream_rows, position + step)
                feed, fed = [self.pad_id] * self.slots, [0] * self.slots  # built here, sent once
                for i, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist())):
                    if not active[i]:
                        continue
                    replies[i].append(token)
                    logprobs[i].append(logprob)
                    if token in stops:
                        active[i] = False
                    else:
                        feed[rows[i]], fed[rows[i]] = token, 1
                if not any(active) or step + 1 == max_new_tokens:
                    break
                logits = self._forward(torch.tensor(feed, device=device)[:, None],
                                       torch.tensor(fed, device=device))[index]
        self.model.train(was_training)
        for row, prompt, reply in zip(rows, prompts, replies):
            self._held[row] = prompt + reply  # the cache holds all but the last sampled id
        return [Generation(reply, logprob, reply[-1] in self.stop_ids if reply else False)
                for reply, logprob in zip(replies, logprobs)]

    def _forward(self, ids: Any, counts: Any, rows: Any = None) -> Any:
        """(B, V) float32 next-token logits after `ids` (B, Q), left-padded, `counts` real tokens
        a row, which the slots then hold; with `rows` (N,), of those slots alone. Only the last
        column's logits are made: a prefill's others would be (B, Q, V), gigabytes for a long
        prompt."""
        positions, mask = self._cache.step(ids.shape[1], ids.shape[1] - counts, rows)
        logits = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                            past_key_values=self._cache, use_cache=True, logits_to_keep=1).logits
        self._cache.advance(counts)
        return logits[:, -1].float()

    def _sample(self, logits: Any, streams: Any, positions: Any) -> tuple[Any, Any]:
        """(N,) ids and their logprobs: greedy, or from each row's stream at `temperature`
        (the Gumbel-max draw of `sampling.StreamSampler`), else from torch's random state."""
        import torch

        if self.temperature <= 0:
            logprobs = logits.log_softmax(-1)
            chosen = logprobs.argmax(-1)
            return chosen, logprobs.gather(-1, chosen[:, None]).squeeze(-1)
        tempered = logits / self.temperature
        if streams is not None:
            chosen = (tempered.double() + gumbel_noise(position_seeds(streams, positions), logits.shape[-1])).argmax(-1)
        else:
            chosen = torch.multinomial(tempered.softmax(-1), 1).squeeze(-1)
        return chosen, tempered.log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1)
