"""Sampling over a `SlotCache`: each episode keeps its keys and values in its own slot across
turns, and a turn runs only its new tokens: the CUDA-graph decoding backend (docs/SCALING.md),
whose steps are captured as CUDA graphs on a CUDA device and run eagerly elsewhere.

Its replies equal `HFGenerator`'s: the same ids and logprobs (up to rounding) for the same prompts
and streams, greedy or sampled (tests/test_slot_generator.py). Sampling draws each row's noise
on the device from (stream, position) (`sampling.position_seeds`), so a row samples the same
whatever else is in the batch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

from .generator import Generation
from .sampling import stream_noise
from .slot_cache import SlotCache


STOP_CHECK_EVERY = 8
"""Decoding steps between two stop checks on a GPU: at most 7 steps run after the last row
stopped, against a device sync every step."""

SMALLEST_WIDTH = 64
"""The narrowest context bucket (columns attention reads)."""


def _bucket(need: int, smallest: int, most: int) -> int:
    """The first of smallest, then two sizes a doubling (x1.5 of a power of two, then the next
    power of two: 64, 96, 128, 192, ...; from 1: 1, 2, 4, 8, 12, 16, 24, ...) that holds `need`,
    at most `most`."""
    size = smallest
    while size < need:
        if size < 8:
            size *= 2
        else:
            size = size * 3 // 2 if size & (size - 1) == 0 else size // 3 * 4
    return min(size, most)


def context_width(columns: int, max_len: int) -> int:
    """The context bucket of a call whose rows write up to `columns` columns: the next of 64, 96,
    128, 192, 256, 384, ... (two a doubling: at most a third of the columns read are past every
    row, and 8,192-token slots have 15 buckets, so few graphs), at most `max_len`."""
    return _bucket(columns, SMALLEST_WIDTH, max_len)


def batch_bucket(rows: int, slots: int) -> int:
    """The rows a call of `rows` prompts decodes: the next of 1, 2, 4, 8, 12, 16, 24, 32, 48, ...,
    at most `slots` (a graph a bucket; at most a third of the rows run idle)."""
    return _bucket(rows, 1, slots)


@dataclass
class _DecodeState:
    """The decoding loop's tensors, one row per slot (B), all on the model's device.

    Attributes:
        logits: (B, V) float32 next-token logits of each slot.
        active: (B,) bool, the rows still replying.
        positions: (B,) int64, each row's position of its first new token (its streams' counter).
        streams: (B,) int64 sampling streams, or None (torch's random state).
        step: (B,) int64, the tokens each row has recorded in its reply so far: the column of its
            next one, and its offset from `positions` (rows may start replies at different steps
            of a call: a row given its episode's next turn restarts at 0).
        last: (B,) int64, each row's last sampled id (fed at the next step where still active).
        tokens, logprobs: (B, max_new_tokens + 1) the sampled ids (padding after a row stopped;
            the last column is where a row that used all its tokens writes its padding) and
            their log-probabilities.
        limit: () int64, the most tokens of a reply (a row that recorded as many stops).
        stops: (S,) int64, the ids that end a reply.
    """

    logits: Any
    active: Any
    positions: Any
    streams: Any
    step: Any
    last: Any
    tokens: Any
    logprobs: Any
    limit: Any
    stops: Any

    PER_SLOT = ("logits", "active", "positions", "streams", "step", "last", "tokens", "logprobs")
    """The fields with a row per slot (`limit` and `stops` are shared)."""

    def leading(self, rows: int) -> "_DecodeState":
        """The same state over its first `rows` rows: views, so a step over them writes here."""
        return replace(self, **{name: getattr(self, name)[:rows] for name in self.PER_SLOT
                                if getattr(self, name) is not None})

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange rows `a` and `b` of every per-slot tensor, in place."""
        for name in self.PER_SLOT:
            tensor = getattr(self, name)
            if tensor is not None:
                tensor[[a, b]] = tensor[[b, a]]

    def tensors(self) -> list[Any]:
        """Every tensor of the state (streams when set)."""
        return [getattr(self, field.name) for field in fields(self) if getattr(self, field.name) is not None]

    @classmethod
    def empty(cls, slots: int, vocab: int, max_new_tokens: int, streams: bool, stop_ids: list[int],
              device: Any) -> "_DecodeState":
        import torch

        def zeros(*shape: int, dtype: Any = torch.long) -> Any:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(logits=zeros(slots, vocab, dtype=torch.float32), active=zeros(slots, dtype=torch.bool),
                   positions=zeros(slots), streams=zeros(slots) if streams else None, step=zeros(slots),
                   last=zeros(slots), tokens=zeros(slots, max_new_tokens + 1),
                   logprobs=zeros(slots, max_new_tokens + 1, dtype=torch.float32), limit=zeros(),
                   stops=torch.tensor(stop_ids or [-1], dtype=torch.long, device=device))


Refill = Callable[[list[tuple[int, Generation]]], "list[tuple[list[int], int | None] | None]"]
"""What a call that refills its rows asks at a stop check, given the (prompt index, reply) of each
row whose reply ended since the last: for each, (its next prompt, the stream it samples from),
which the row decodes next in the same call, or None when the row is done. Given together, so
that their environments may step at once."""


@dataclass
class _Turns:
    """A refilling call's rows, host side: each prompt's current one, which still decode turns
    (`live`), and each one's last reply once `refill` said it was done (`finals`)."""

    prompts: list[list[int]]
    refill: Refill
    live: set[int]
    finals: dict[int, Generation] = field(default_factory=dict)


class SlotGenerator:
    """Batched sampling with a Hugging Face causal LM over `slots` rows of `max_len` tokens.

    A prompt continues the slot whose cached tokens are the longest proper prefix of it (the same
    episode's earlier turns: only the rest is run through the model), else takes a slot no prompt
    of the call continues, emptied. A call's rows are then moved into its batch bucket, the first
    `batch_bucket(len(prompts), slots)` slots, by swapping a row outside them with a slot inside
    that the call does not use (`SlotCache.swap_rows`: nothing cached is lost), and every decoding
    step runs those slots (fixed shapes, as a CUDA graph needs); a slot without a prompt in the
    call gets padding that it never keeps. When the rows still replying fit a smaller bucket (at a
    stop check), they are swapped into it the same way, with what they sampled so far, and the
    steps after run that bucket: a call's last long replies do not decode its stopped rows.

    Args:
        model: a `transformers` causal LM whose forward takes per-row position ids and a 4D mask.
        pad_id: the id given to padding (never attended to).
        stop_ids: token ids that end a reply.
        temperature: 0 means greedy decoding.
        slots: rows of the cache: the most prompts of one batch (more are played in turns,
            without continuing each other's caches).
        max_len: tokens a slot holds: an episode's whole conversation.
        stop_check_every: decoding steps between two looks of the host at whether any row still
            replies (None: every step on the CPU, `STOP_CHECK_EVERY` on a GPU, whose steps then
            queue without waiting for the host). Rows that stopped only idle in between.
        cuda_graphs: replay each decoding step as a captured CUDA graph (None: on a CUDA device;
            the CPU always decodes eagerly, through the same step).

    Attention reads a context bucket of each slot (`SlotCache.width`, `context_width`): the
    columns a call's rows will hold, rounded up to one of a few widths, so a step's cost follows
    the conversations' length, not `max_len`. A graph is captured once per (context, batch)
    bucket.
    """

    restricts_replies = False
    refills_rows = True
    """`generate` takes `refill`: continuous admission (`rollout.continuous_turns`)."""

    def __init__(self, model: Any, pad_id: int, stop_ids: list[int], temperature: float = 1.0,
                 slots: int = 16, max_len: int = 2048, stop_check_every: int | None = None,
                 cuda_graphs: bool | None = None):
        from .attention import use_grouped_attention

        use_grouped_attention(model)  # a slot step always has a mask: no copies of grouped key/value heads for it
        self.model, self.pad_id, self.stop_ids, self.temperature = model, pad_id, list(stop_ids), temperature
        self.slots, self.max_len = slots, max_len
        if stop_check_every is None:  # a check is cheap on the CPU, where each step waits anyway
            stop_check_every = 1 if next(model.parameters()).device.type == "cpu" else STOP_CHECK_EVERY
        if stop_check_every < 1:
            raise ValueError(f"stop_check_every must be >= 1, got {stop_check_every}")
        self.stop_check_every = stop_check_every
        self.host_checks = 0
        """Times the host read whether any row still replies (each a device sync off the CPU)."""
        self.compactions = 0
        """Times a call's replying rows were moved into a smaller batch bucket."""
        self.cuda_graphs = cuda_graphs
        self._state: _DecodeState | None = None
        self._graphs: dict[tuple[int, int], Any] = {}
        """One captured decoding step per (context width, batch) bucket."""
        self._graph_pool: Any = None
        """The memory pool every bucket's graph captures into (torch.cuda.graph_pool_handle): the
        graphs replay one at a time and keep nothing in it between replays (each step writes the
        decode state's and the cache's own tensors), so one pool holds one step's temporaries
        instead of a pool a bucket."""
        self._graphs_failed = False
        self._cache: SlotCache | None = None
        self._held: list[list[int]] = [[] for _ in range(slots)]
        """Each slot's ids, those in its cache first (`lengths` of them), then its last sampled id;
        in the middle of a call, a replying row's prompt (its cache holds that and its reply so far)."""
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
                 streams: list[int] | None = None, refill: Refill | None = None) -> list[Generation]:
        """One reply per prompt (with `streams`, prompt i samples from stream i).

        With `refill`, a row whose reply ends (seen at a stop check) is handed to `refill([(i,
        reply), ...])` and takes the prompt it returns, say its episode's next turn, in the same call:
        its slot continues its cache, the new tokens but the last run at once, and the next
        decoding step feeds that last one and samples the reply's first token, beside rows still
        in the middle of theirs. Rows that end early do not wait for the others. Returns each
        prompt's last reply (the one `refill` answered None to)."""
        if max_new_tokens < 1:
            return [Generation([], [], False) for _ in prompts]
        if allowed is not None:
            raise ValueError("a slot generator does not restrict replies to given sequences yet")
        self._check_room(prompts, max_new_tokens)
        out: list[Generation] = []
        for start in range(0, len(prompts), self.slots):
            chunk = prompts[start:start + self.slots]
            turns = None if refill is None else _Turns(
                list(chunk), lambda ended, at=start: refill([(at + i, reply) for i, reply in ended]),
                set(range(len(chunk))))
            out += self._generate(chunk, max_new_tokens, None if streams is None else streams[start:start + self.slots],
                                  turns)
        return out

    def _check_room(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        room = self.max_len - 1  # the last column takes padding
        too_long = next((len(p) for p in prompts if len(p) + max_new_tokens > room), None)
        if too_long is not None:
            raise ValueError(f"a prompt of {too_long} tokens and {max_new_tokens} new ones pass the slots' "
                             f"{room} tokens")

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

    def _into_batch(self, rows: list[int]) -> list[int]:
        """The call's slots (`rows`, one a prompt) moved into the first `cache.batch`: each row
        past them swaps with a slot inside that the call does not use, the emptiest first."""
        batch = self._cache.batch
        lengths = self._cache.lengths.tolist()
        unused = sorted((slot for slot in range(batch) if slot not in rows), key=lambda slot: lengths[slot])
        moved = list(rows)
        for place, row in enumerate(rows):
            if row >= batch:
                moved[place] = unused.pop(0)
                self._swap(row, moved[place])
        return moved

    def _swap(self, a: int, b: int, state: "_DecodeState | None" = None) -> None:
        """Exchange slots `a` and `b`: their caches, held ids and (mid-call) decoding rows."""
        self._cache.swap_rows(a, b)
        self._held[a], self._held[b] = self._held[b], self._held[a]
        if state is not None:
            state.swap_rows(a, b)

    def _compact(self, state: "_DecodeState", rows: list[int], batch: int) -> None:
        """Shrink the call's decoding to its first `batch` slots, which hold as many as still
        reply: each replying row past them swaps with a slot inside that no longer replies (the
        rows' tokens and logprobs so far go with them), and `rows` (the call's slots, in prompt
        order) follows the moves."""
        replying = state.active[:self._cache.batch].tolist()
        free = [slot for slot in range(batch) if not replying[slot]]
        for row in range(batch, len(replying)):
            if replying[row]:
                target = free.pop(0)
                self._swap(row, target, state)
                rows[:] = [target if slot == row else row if slot == target else slot for slot in rows]
        self._cache.batch = batch
        self.compactions += 1

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, streams: list[int] | None,
                  turns: _Turns | None = None) -> list[Generation]:
        import torch

        device = next(self.model.parameters()).device
        if self._cache is None:
            self._cache = SlotCache(self.model.config.num_hidden_layers, self.slots, self.max_len, device)
        cache = self._cache
        # The last sampled token is never fed, so a row writes len(prompt) + max_new_tokens - 1 columns.
        cache.width = context_width(max(map(len, prompts)) + max_new_tokens - 1, self.max_len)
        cache.batch = batch_bucket(len(prompts), self.slots)
        rows = self._into_batch(self._assign(prompts))
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
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            logits = self._forward(ids.to(device), counts.to(device), torch.tensor(prefill, device=device))
            copied = [(source, row) for source, row in copies if source != row]
            if copied:
                cache.copy_rows(torch.tensor([s for s, _ in copied], device=device),
                                torch.tensor([r for _, r in copied], device=device))
            # Decoding keeps every slot (the shapes a CUDA graph captures): the call's rows read
            # their prefill's logits, the others never record a token.
            state = self._decode_state(logits, sources, index, position, stream_rows, max_new_tokens, device)
            for row, prompt in zip(rows, prompts):
                self._held[row] = prompt  # what its cache holds, the reply aside (a refill may read it)
            self._decode(state, max_new_tokens, rows, device, turns)
            # Where the rows ended up (compaction moves them).
            replies = self._read(state, rows, prompts) if turns is None else [turns.finals[i] for i in range(len(rows))]
        self.model.train(was_training)
        return replies

    def _read(self, state: "_DecodeState", rows: list[int], prompts: list[list[int]]) -> list[Generation]:
        """The replies in `rows` (slots) of `state`; each slot's held ids become its prompt and
        reply (its cache holds all of them but the last sampled id)."""
        import torch

        index = torch.tensor(rows, device=state.step.device)
        counts = state.step[index].tolist()
        width = max(counts, default=0)
        tokens, scores = state.tokens[index, :width].tolist(), state.logprobs[index, :width].tolist()
        out = []
        for row, prompt, ids, logprobs, count in zip(rows, prompts, tokens, scores, counts):
            self._held[row] = prompt + ids[:count]
            out.append(Generation(ids[:count], logprobs[:count], count > 0 and ids[count - 1] in self.stop_ids))
        return out

    def _refill(self, state: "_DecodeState", rows: list[int], replying: list[bool], turns: _Turns,
                max_new_tokens: int) -> bool:
        """Hand each live row that stopped replying to `turns.refill`, set the context bucket to
        what the live rows' prompts need (it shrinks as long episodes end) and admit the prompts
        `refill` returns (`_admit`); whether any row ended."""
        ended = [i for i in sorted(turns.live) if not replying[rows[i]]]
        if not ended:
            return False
        replies = self._read(state, [rows[i] for i in ended], [turns.prompts[i] for i in ended])
        admitted = []
        for i, reply, turn in zip(ended, replies, turns.refill(list(zip(ended, replies)))):
            if turn is None:
                turns.live.discard(i)
                turns.finals[i] = reply
            else:
                turns.prompts[i] = turn[0]
                admitted.append((rows[i], turn[0], turn[1]))
        self._check_room([prompt for _, prompt, _ in admitted], max_new_tokens)
        if turns.live:  # a replying row writes up to len(prompt) + max_new_tokens - 1 columns
            longest = max(len(turns.prompts[i]) for i in turns.live)
            self._cache.width = context_width(longest + max_new_tokens - 1, self.max_len)
        if admitted:
            self._admit(state, admitted)
        return True

    def _admit(self, state: "_DecodeState", admitted: list[tuple[int, list[int], int | None]]) -> None:
        """Start a reply in each (slot, prompt, stream) of `admitted` in the middle of a call: the
        slot keeps the cached part of the prompt (its episode's earlier turns) or, for a prompt it
        does not continue, takes the longest start of it another slot holds (the system prompt
        and worked example every episode opens with, a group's first observation); the prompt's
        other tokens but the last run through the model now, and the row is set to feed that last
        token at the next decoding step, whose logits give the reply's first token, at the
        prompt's length in the stream (as a call of its own would sample it), within the context
        bucket `_refill` set."""
        import torch

        cache, device = self._cache, state.step.device
        lengths = cache.lengths.tolist()
        busy = {row for row, _, _ in admitted}
        suffixes, copies = [], []
        for row, prompt, _ in admitted:
            # The row's own slot first (its episode's next turn), else the slot holding the most.
            donor, kept = max(((slot, self._cached_start(slot, prompt, lengths[slot])) for slot in range(self.slots)
                               if slot == row or slot not in busy), key=lambda pair: (pair[1], pair[0] == row))
            if donor != row:
                copies.append((donor, row, kept))
            cache.lengths[row] = kept
            suffixes.append(prompt[kept:])
            self._held[row] = prompt  # what its cache holds from now on, the reply aside
            self.reused_columns += kept
            self.prefilled_columns += len(prompt) - kept
        if copies:  # copy_rows gives each row its donor's length: the part it shares is kept
            cache.copy_rows(torch.tensor([donor for donor, _, _ in copies], device=device),
                            torch.tensor([row for _, row, _ in copies], device=device))
            for _, row, kept in copies:
                cache.lengths[row] = kept
        run = [(row, suffix[:-1]) for (row, _, _), suffix in zip(admitted, suffixes) if len(suffix) > 1]
        if run:
            width = max(len(ids) for _, ids in run)
            ids = torch.full((len(run), width), self.pad_id, dtype=torch.long)
            for place, (_, suffix) in enumerate(run):
                ids[place, width - len(suffix):] = torch.tensor(suffix)
            self._forward(ids.to(device), torch.tensor([len(suffix) for _, suffix in run], device=device),
                          torch.tensor([row for row, _ in run], device=device))
        index = torch.tensor([row for row, _, _ in admitted], device=device)
        state.last[index] = torch.tensor([suffix[-1] for suffix in suffixes], device=device)
        state.positions[index] = torch.tensor([len(prompt) for _, prompt, _ in admitted], device=device)
        state.step[index] = 0
        if state.streams is not None:
            state.streams[index] = torch.tensor([stream or 0 for _, _, stream in admitted], device=device)
        state.active[index] = True

    def _decode_state(self, logits: Any, sources: Any, index: Any, position: Any, streams: Any,
                      max_new_tokens: int, device: Any) -> "_DecodeState":
        """The decoding loop's tensors, one row a slot, filled in place (a captured graph reads
        these very tensors): the call's rows (`index`, (N,)) active, with the prefill's next-token
        logits (`logits[sources]`), their next positions and streams; the other slots idle."""
        import torch

        state = self._state
        if (state is None or state.tokens.shape[1] <= max_new_tokens or (streams is None) != (state.streams is None)
                or state.logits.shape[-1] != logits.shape[-1]):
            state = self._state = _DecodeState.empty(self.slots, logits.shape[-1], max_new_tokens, streams is not None,
                                                     self.stop_ids, device)
            self._graphs, self._graph_pool = {}, None  # a graph replays the tensors it was captured over
        state.logits.zero_()
        state.logits[index] = logits[sources]
        state.active.zero_()
        state.active[index] = True
        state.positions.zero_()
        state.positions[index] = position
        if streams is not None:
            state.streams.zero_()
            state.streams[index] = streams
        state.step.zero_()
        state.limit.fill_(max_new_tokens)
        state.tokens.fill_(self.pad_id)
        state.logprobs.zero_()
        return state

    def _wants_graphs(self, device: Any) -> bool:
        return self.cuda_graphs is not False and device.type == "cuda" and not self._graphs_failed

    def _capture(self, state: "_DecodeState") -> None:
        """Capture one decoding step over `state`'s tensors as a CUDA graph (torch.cuda.CUDAGraph)
        at the cache's current width, after two eager warm-up steps on a side stream, every row
        idle: an idle row feeds padding its slot never keeps, and the state's values are put back
        after, so a capture in the middle of a call (a compacted batch) loses none of its rows. A
        step that cannot be captured (an operation that waits on the host) leaves decoding eager,
        said once."""
        kept = [(tensor, tensor.clone()) for tensor in state.tensors()]
        try:
            self._capture_step(state)
        finally:
            for tensor, value in kept:
                tensor.copy_(value)

    def _capture_step(self, state: "_DecodeState") -> None:
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                self._idle_steps(state, 2)
            torch.cuda.current_stream().wait_stream(stream)
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                self._decode_step(state)
        except RuntimeError as error:
            self._graphs_failed = True
            warnings.warn(f"decoding steps could not be captured as a CUDA graph; decoding eagerly ({error})",
                          stacklevel=2)
            return
        self._graphs[self._cache.width, self._cache.batch] = graph

    def _idle_steps(self, state: "_DecodeState", count: int) -> None:
        """`count` decoding steps with every row idle (a graph's warm-up): each slot is fed
        padding it never keeps, so its cache and length stay as they were."""
        state.active.zero_()
        for _ in range(count):
            self._decode_step(state)

    def _cached_start(self, slot: int, prompt: list[int], length: int) -> int:
        """How many of `prompt`'s first ids `slot`'s cache holds (its `length` cached ids, the
        first of which its held ids name), at most all but the last."""
        import numpy as np

        count = min(length, len(self._held[slot]), len(prompt) - 1)
        if count <= 0:
            return 0
        differ = np.asarray(prompt[:count]) != np.asarray(self._held[slot][:count])
        return int(differ.argmax()) if differ.any() else count

    def _decode(self, state: "_DecodeState", max_new_tokens: int, rows: list[int], device: Any,
                turns: _Turns | None = None) -> None:
        """Sample up to `max_new_tokens` tokens a row into `state`, in place. The host looks at
        the rows only every `stop_check_every` steps (which still reply): in between, a step is
        device work alone, and a row that stopped only feeds padding its slot never keeps. With
        `turns`, a row that stopped is refilled there (`_refill`) and the call goes on until none
        is refilled and none replies. When those still replying fit a smaller batch bucket, they
        are moved into it (`_compact`, `rows` follows them), so a call's last long replies do not
        decode every row of its start. The last token sampled is not fed back."""
        self._record(state.leading(self._cache.batch))
        graph = self._graph(state, device)
        steps = 1
        while turns is not None or steps < max_new_tokens:
            if steps % self.stop_check_every == 0:
                self.host_checks += 1
                replying = state.active[:self._cache.batch].tolist()
                if turns is not None and self._refill(state, rows, replying, turns, max_new_tokens):
                    replying = state.active[:self._cache.batch].tolist()
                    graph = self._graph(state, device)  # the context bucket may have changed
                if not any(replying):
                    break
                if batch_bucket(sum(replying), self.slots) < self._cache.batch:
                    self._compact(state, rows, batch_bucket(sum(replying), self.slots))
                    graph = self._graph(state, device)
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(state.leading(self._cache.batch))
            steps += 1

    def _graph(self, state: "_DecodeState", device: Any) -> Any:
        """The captured decoding step of the current (context, batch) bucket, captured now if it
        is new; None when decoding is eager."""
        key = (self._cache.width, self._cache.batch)
        if key not in self._graphs and self._wants_graphs(device):
            self._capture(state.leading(self._cache.batch))
        return self._graphs.get(key)

    def _decode_step(self, state: "_DecodeState") -> None:
        """One decoding step over every slot, on the device alone and in place (fixed shapes, no
        host sync: what a CUDA graph captures): the tokens of the rows that still reply go through
        the model, then each row's next token is sampled and recorded."""
        import torch

        feed = torch.where(state.active, state.last, self.pad_id)
        state.logits.copy_(self._forward(feed[:, None], state.active.long()))
        self._record(state)

    def _record(self, state: "_DecodeState") -> None:
        """Sample each slot's token from its logits, at its stream's position; record it where
        the row still replies, and stop a row whose token ends the reply."""
        import torch

        chosen, logprobs = self._sample(state.logits, state.streams, state.positions + state.step)
        column = state.step[:, None]
        state.tokens.scatter_(1, column, torch.where(state.active, chosen, self.pad_id)[:, None])
        state.logprobs.scatter_(1, column, torch.where(state.active, logprobs, 0.0)[:, None])
        state.step.add_(state.active.long())
        state.active.logical_and_(~torch.isin(chosen, state.stops) & (state.step < state.limit))
        state.last.copy_(chosen)

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
            chosen = (tempered.double() + stream_noise(streams, positions, logits.shape[-1])).argmax(-1)
        else:
            chosen = torch.multinomial(tempered.softmax(-1), 1).squeeze(-1)
        return chosen, tempered.log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1)
