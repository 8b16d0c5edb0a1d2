"""Generators: turn batches of prompt token ids into sampled continuations.

The rollout engine only knows the `Generator` protocol, so a vLLM or HTTP backend can
replace the Hugging Face one without touching it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from .allocator import release_free_memory
from .constrained import AllowedReplies
from .sampling import GreedyLogprobs, StreamSampler
from .threads import StepTimer, shared_chooser

# Left padding makes every row of a prefill as wide as its longest prompt (or, continuing a cache,
# its longest new suffix). When leaving the rows that are only padding out of the first columns
# saves at least this share of the prefill's columns, those columns are run as a separate
# forward pass over the rows that have tokens there (`HFGenerator._prefill_head`): worth an extra
# pass, not for a few columns.
MIN_HEAD_SAVING = 0.1

# The head's rows take a copy of their cached keys and values as context: at most this share of
# a continued batch's rows, so that the copy stays a fraction of the cache (a head of 10 of 11
# SmolLM2 rows copied ~1.5 GB and raised an evaluation's peak memory by ~0.5 GB). A head of rows
# with nothing cached (episodes joining the batch) copies nothing and has no such cap.
MAX_HEAD_ROW_SHARE = 0.25


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        ids: generated token ids, ending with the stop token when `finished`.
        logprobs: log-probability of each id under the sampling distribution, len == len(ids).
        finished: True when a stop token ended it, False when it hit the token limit.
    """

    ids: list[int]
    logprobs: list[float]
    finished: bool


class Generator(Protocol):
    """Samples continuations of token-id prompts; the rollout engine is its only caller.

    A generator may also define `reset()`, optional and without arguments: forget any state kept
    between `generate` calls (such as a KV cache of earlier turns). The rollout engine calls it at
    the start and end of every run, since the weights may change between runs.
    """

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 streams: list[int] | None = None) -> list[Generation]:
        """Sample one continuation per prompt; with `streams`, prompt i's from its own random
        stream (`agent.sampling`), so that it samples the same whatever it is batched with."""
        ...

    # A generator that can restrict replies also takes `allowed` (see `HFGenerator.generate`)
    # and sets `restricts_replies = True`.

    def sync_weights(self, model: Any) -> None:
        """Sample from `model`'s weights from now on (the learner's, after an update). A backend
        that keeps its own copy (another device or dtype, an inference engine) loads them."""
        ...


@dataclass
class _Batch:
    """What one `generate` call leaves for the next: its columns and their KV cache.

    Attributes:
        sequences: (B, W) every column the model saw or wrote: prompts, padding, generations.
        mask: (B, W) 1 on real tokens (prompt and generated ids up to the stop token), 0 on the
            left or middle padding and on the pad ids written after a row's stop token.
        rows: the real tokens of each row, i.e. `sequences[r][mask[r] == 1]`.
        cache: keys and values of the first `cache.get_seq_length()` (W or W - 1) columns.
    """

    sequences: Any
    mask: Any
    rows: list[list[int]]
    cache: Any


@contextlib.contextmanager
def _without_model_defaults(model: Any) -> Iterator[None]:
    """Run `generate` under transformers' global defaults, not the model's own
    `generation_config.json`: transformers fills every setting a `GenerationConfig` leaves unset
    from it, and an instruct model's (Qwen2.5-Instruct's repetition_penalty 1.05, top_k 20,
    top_p 0.8) would move what is sampled, and the log-probabilities recorded, away from
    softmax(logits / T), which the learner scores."""
    from transformers import GenerationConfig

    own = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = own


class HFGenerator:
    """Batched sampling with a Hugging Face causal LM (left-padded, KV-cached).

    Sampling is plain temperature sampling over the whole vocabulary (no top-k/top-p), so
    the returned logprobs are exactly those of the distribution the ids were drawn from.

    Prefix caching: a multi-turn episode's prompt at turn t+1 is its prompt at turn t, the ids
    generated for it, then new ids (end of turn, observation). With `reuse_cache` the generator
    keeps the last batch's KV cache and, when prompts extend its rows, runs only the new columns:
    the new ids of each row are left-padded to a common width and appended after the cached
    columns, padding masked out. Position ids are the cumulative sum of the attention mask, so
    every real token keeps the position it has in the unpadded conversation and the result
    equals a full prefill up to floating-point rounding (greedy ids are the same). Prompts that
    extend no row (a new episode) join as rows that attend to none of the cached columns. So that
    one long prompt or suffix does not widen every row's prefill, the leading columns where most
    rows hold only padding are run first for the rows that have tokens there (`_prefill_head`).
    A continued cache is re-packed first (`_continue`), so a padding column no row attends to
    never stays in it. A batch with no match or over `batch_size` prompts is prefilled afresh.
    Call `reset()` whenever the weights change (the rollout engine does, per run). A fresh
    prefill starts from `kv_cache.appending_cache`, which writes each decoding step into spare
    columns instead of copying the cache.

    Args:
        model: a `transformers` causal LM: the learner's own (the default: nothing to copy) or a
            separate copy that `sync_weights` keeps up to date.
        pad_id: padding token id.
        stop_ids: token ids that end a turn.
        temperature: 0 means greedy decoding.
        batch_size: the most prompts per forward pass; the cache is kept only when a call's
            prompts fit one batch, hence a default large enough for 90 validation episodes.
        reuse_cache: keep the KV cache between calls (prefix caching). Only models whose cache
            is a `DynamicCache` of full-attention layers are continued; others always prefill.
        threads: torch's CPU threads while generating: 0 chooses, call by call, between torch's
            own count and 1 by timing decoding steps (`agent.threads`: 1 wins on a busy
            machine); N pins N, for runs that must repeat bit for bit. The count in force before
            a call is restored after it. Ignored on a GPU.
        stop_when: asked after every decoding step; when it answers True the call ends there,
            its unfinished replies returned as cut off (a server's time limit or shutdown).
    """

    restricts_replies = True
    """`generate` takes `allowed`: each reply restricted to given token sequences."""

    def __init__(self, model: Any, pad_id: int, stop_ids: list[int], temperature: float = 1.0,
                 batch_size: int = 128, reuse_cache: bool = True, threads: int = 0,
                 stop_when: Callable[[], bool] | None = None):
        from .attention import use_grouped_attention

        use_grouped_attention(model)  # left-padded batches always have a mask: no key/value copies for it
        self.model = model
        self.stop_when = stop_when
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.temperature = temperature
        self.batch_size = batch_size
        self.reuse_cache = reuse_cache
        self.threads = threads
        self._chooser = None
        self._thread_passes: Counter[int] = Counter()
        self.prefilled_columns = 0
        """Prompt columns run through the model, summed over rows (padding included)."""
        self.reused_columns = 0
        """Prompt columns read from the kept cache instead, summed over rows."""
        self.copied_columns = 0
        """Cached columns copied as a prefill head's context, summed over rows."""
        self._last: _Batch | None = None

    @property
    def thread_passes(self) -> dict[int, int]:
        """Forward passes of `generate` run on each thread count the chooser picked (empty when
        the count is pinned, or one thread is all there is)."""
        return dict(self._thread_passes)

    @property
    def cache_bytes_per_token(self) -> int:
        """KV-cache bytes each token of a kept row holds (`kv_cache.bytes_per_token`)."""
        from .kv_cache import bytes_per_token

        return bytes_per_token(self.model)

    @property
    def max_cached_batch(self) -> int:
        """The most prompts whose KV cache is kept for the next call (0: no cache is kept)."""
        return self.batch_size if self.reuse_cache else 0

    def reset(self) -> None:
        """Drop the kept KV cache (it is stale once the weights change)."""
        self._last = None

    def sync_weights(self, model: Any) -> None:
        """Take `model`'s weights and drop the KV cache. Sharing the learner's model object (the
        default), only the cache goes; a separate copy loads the learner's state dict."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
        self.reset()

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 allowed: list[list[list[int]]] | None = None, streams: list[int] | None = None) -> list[Generation]:
        """Sample one continuation per prompt; with `allowed`, prompt i's continuation is one of
        the token sequences `allowed[i]` (each ending with a stop id; `constrained.AllowedReplies`);
        with `streams`, prompt i samples from stream i (`sampling.StreamSampler`), else from
        torch's random state as transformers samples."""
        if not prompts:
            return []
        try:
            return self._generate(prompts, max_new_tokens, allowed, streams)
        finally:
            if next(self.model.parameters()).device.type == "cpu":
                # This turn's freed tensors (the last cache, its re-packed copy) are holes in the heap
                # that glibc would keep: without this an evaluation's memory grew ~1 GB past what was alive.
                release_free_memory()

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, allowed: list[list[list[int]]] | None,
                  streams: list[int] | None) -> list[Generation]:
        keep = self.reuse_cache and len(prompts) <= self.batch_size
        continued = self._continue(prompts, max_new_tokens) if keep else None
        self._last = None  # freed before the next batch's cache is built
        if continued is not None:
            generations, self._last = self._generate_batch(prompts, max_new_tokens, *continued, allowed, streams)
            return generations
        # Similar lengths together waste less padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        by_index: dict[int, Generation] = {}
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            chunk_prompts = [prompts[i] for i in chunk]
            chunk_allowed = None if allowed is None else [allowed[i] for i in chunk]
            chunk_streams = None if streams is None else [streams[i] for i in chunk]
            generations, batch = self._generate_batch(chunk_prompts, max_new_tokens, *self._fresh(chunk_prompts),
                                                      chunk_allowed, chunk_streams)
            by_index.update(zip(chunk, generations))
            if keep:
                self._last = batch
        return [by_index[i] for i in range(len(prompts))]

    def _fresh(self, prompts: list[list[int]]) -> tuple[Any, Any, None]:
        """Left-padded input ids and attention mask of a full prefill, no cache."""
        import torch

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        device = next(self.model.parameters()).device
        return input_ids.to(device), attention.to(device), None

    def _continue(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[Any, Any, Any] | None:
        """Input ids, attention mask and cache that continue the kept batch, or None to prefill.

        Each prompt takes the longest unused kept row that is a proper prefix of it; the rows of
        episodes that ended are dropped, and each kept row is re-packed to its real cached columns,
        left-padded to the most any row has (`kv_cache.select_columns`): the middle padding of
        earlier turns and the pads after stop tokens leave the cache, so its width follows the
        longest live conversation, not every turn's widest reply and observation.
        Returns:
            input_ids, attention: (B, C + S) — C re-packed cached columns, then each prompt's
                ids after them left-padded to the longest, S; a prompt extending no row has its
                C columns masked out entirely and its whole prompt as new ids.
            cache: the kept cache, re-packed in place, with room for the S new columns and the
                replies.
        """
        import torch

        from .kv_cache import select_columns

        last = self._last
        if last is None:
            return None
        by_length = sorted(range(len(last.rows)), key=lambda r: -len(last.rows[r]))
        used: set[int] = set()
        matches: list[int | None] = []
        for prompt in prompts:
            match = next((r for r in by_length if r not in used and len(last.rows[r]) < len(prompt)
                          and prompt[:len(last.rows[r])] == last.rows[r]), None)
            if match is not None:
                used.add(match)
            matches.append(match)
        if not used:
            return None
        # The cache lacks the last column (the last sampled id is never run through the model):
        # the columns kept are the cached ones, and a row's real ids after them join its suffix.
        cached = last.cache.get_seq_length()
        real = [[] if r is None else last.mask[r, :cached].nonzero().squeeze(1).tolist() for r in matches]
        kept = max(len(columns) for columns in real)
        suffixes = [prompt[len(columns):] for prompt, columns in zip(prompts, real)]
        suffix_width = max(len(s) for s in suffixes)
        device = last.sequences.device
        rows = torch.tensor([0 if r is None else r for r in matches], dtype=torch.long, device=device)
        # Left padding points at column 0 of the row: any finite keys will do under a 0 mask.
        columns = torch.tensor([[0] * (kept - len(c)) + c for c in real], dtype=torch.long, device=device)
        kept_mask = torch.tensor([[0] * (kept - len(c)) + [1] * len(c) for c in real], dtype=torch.long,
                                 device=device)
        kept_ids = last.sequences[rows[:, None], columns].masked_fill(kept_mask == 0, self.pad_id)
        cache = last.cache
        select_columns(cache, rows, columns, spare=suffix_width + max_new_tokens + 1)
        new_ids, new_mask, _ = self._fresh(suffixes)
        return torch.cat([kept_ids, new_ids], dim=1), torch.cat([kept_mask, new_mask], dim=1), cache

    def _generate_batch(self, prompts: list[list[int]], max_new_tokens: int, input_ids: Any, attention: Any,
                        cache: Any, allowed: list[list[list[int]]] | None = None, streams: list[int] | None = None
                        ) -> tuple[list[Generation], _Batch | None]:
        """Generate from `input_ids` (B, W) whose real tokens (`attention` == 1) are `prompts`,
        the first `cache.get_seq_length()` columns already in `cache` (None: none)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        width = input_ids.shape[1]
        reused = 0 if cache is None else cache.get_seq_length()
        self.reused_columns += len(prompts) * reused
        greedy = self.temperature <= 0
        # Each row from its own stream: transformers decodes greedily over scores the sampler noised.
        sampler = None if greedy or streams is None else StreamSampler(streams, [len(p) for p in prompts],
                                                                       self.temperature)
        # What records the chosen tokens' log-probabilities as it goes (None: computed from every
        # position's scores, which `generate` then keeps: sampling from one shared generator).
        recorder = GreedyLogprobs() if greedy else sampler
        # top_k=0 because None would mean transformers' default top-k of 50.
        sampling = {} if greedy or sampler else {"temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy and sampler is None,
            **sampling,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_scores=recorder is None,
            return_dict_in_generate=True,
            use_cache=True,
        )
        if cache is None:
            from .kv_cache import appending_cache

            cache = appending_cache(self.model.config)
        was_training = self.model.training
        self.model.eval()
        outer_threads = torch.get_num_threads()
        timer = self._thread_timer(outer_threads)
        processors = LogitsProcessorList([] if allowed is None else [AllowedReplies(allowed, width)])
        if timer is not None:
            processors.append(StepTimer(timer))
        if recorder is not None:
            processors.append(recorder)  # last: it samples from (or records) what the others left
        try:
            with torch.no_grad():
                head_columns = 0
                if reused == 0 and _continuable(cache):
                    head_columns = self._prefill_repeats(input_ids, attention, cache)
                while _continuable(cache) and (columns := self._prefill_head(input_ids, attention, cache)):
                    head_columns += columns
                self.prefilled_columns += head_columns + len(prompts) * (width - cache.get_seq_length())
                with _without_model_defaults(self.model):
                    out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config,
                                              past_key_values=cache, logits_processor=processors,
                                              stopping_criteria=_stopping(self.stop_when))
        finally:
            if timer is not None:
                timer.finish()
                self._thread_passes.update(timer.ran)
            torch.set_num_threads(outer_threads)
        self.model.train(was_training)
        generations, new_mask = self._read_generations(out, width, recorder)
        batch = None
        if self.reuse_cache and _continuable(out.past_key_values):
            batch = _Batch(out.sequences, torch.cat([attention, new_mask], dim=1),
                           [prompt + gen.ids for prompt, gen in zip(prompts, generations)], out.past_key_values)
        return generations, batch

    def _read_generations(self, out: Any, width: int, recorder: Any) -> tuple[list[Generation], Any]:
        """Each row's generation from `generate`'s output (prompts `width` columns wide), cut
        after its first stop id, with the chosen tokens' logprobs from `recorder` (None: from
        the kept scores); and the (B, new columns) mask of the tokens kept."""
        import torch

        new_ids = out.sequences[:, width:]
        if recorder is not None:
            token_logprobs = torch.stack(recorder.logprobs, dim=1)
        else:  # scores: one (B, V) tensor per generated position, already divided by temperature.
            logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1)
            token_logprobs = logprobs.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)
        stop = set(self.stop_ids)
        generations = []
        new_mask = torch.zeros_like(new_ids)
        for row, ids in enumerate(new_ids.tolist()):
            end = next((k + 1 for k, t in enumerate(ids) if t in stop), None)
            finished = end is not None
            end = end if finished else len(ids)
            new_mask[row, :end] = 1
            generations.append(Generation(ids[:end], token_logprobs[row, :end].tolist(), finished))
        return generations, new_mask

    def _prefill_repeats(self, input_ids: Any, attention: Any, cache: Any) -> int:
        """Prefill each distinct prompt of a fresh batch once, when some repeat (a GRPO group's
        samples, Pass@k's), and give every row its prompt's keys and values.

        All columns but the last are run for the distinct rows and copied into `cache` row by
        row; `generate` runs the last column for every row, as it would after any cache.
        Args:
            input_ids, attention: (B, W) the whole batch, left-padded, as `generate` gets it.
            cache: an empty appending `DynamicCache`; filled with W - 1 columns when a prompt repeats.
        Returns:
            the columns run, summed over rows (0: no prompt repeats, nothing run).
        """
        import torch

        from .kv_cache import SPARE_COLUMNS, AppendLayer, appending_cache

        batch, width = input_ids.shape
        if width < 2:
            return 0
        # The mask joins the ids: equal ids with different padding are different prompts.
        _, inverse = torch.unique(torch.cat([input_ids, attention], dim=1), dim=0, return_inverse=True)
        distinct = int(inverse.max()) + 1
        if distinct == batch:
            return 0
        rows = torch.arange(batch, device=input_ids.device)
        first = torch.full((distinct,), batch, device=input_ids.device).scatter_reduce(0, inverse, rows, "amin")
        mask = attention[first, :width - 1]
        shared = appending_cache(self.model.config)
        getattr(self.model, "base_model", self.model)(
            input_ids=input_ids[first, :width - 1], attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0), past_key_values=shared, use_cache=True)
        for index, layer in enumerate(shared.layers):
            if isinstance(cache.layers[index], AppendLayer):  # room for the last column and the replies
                cache.layers[index].next_spare = 1 + SPARE_COLUMNS
            cache.update(layer.keys[inverse], layer.values[inverse], index)
        return distinct * (width - 1)

    def _prefill_head(self, input_ids: Any, attention: Any, cache: Any) -> int:
        """Run the leading uncached columns for only the rows that have tokens in them.

        Rows are left-padded, so the columns right after the cache are, in most rows, padding.
        Picks the split column that minimises the prefilled columns (the head's rows × the head's
        width + every row × the rest), and when that saves at least `MIN_HEAD_SAVING` of them,
        runs the head over its rows (a copy of their cached keys and values as context, unless
        none of them has a real cached column) and appends its keys and values to `cache`, zeros in the other rows, where the attention
        mask hides them. `generate` then prefills only the rest, as it would after any cache.

        Args:
            input_ids, attention: (B, W) the whole batch, as `generate` gets it.
            cache: the `DynamicCache` of its first L columns (L may be 0); extended in place.
        Returns:
            the columns run, summed over rows (0: nothing was split off).
        """
        import torch

        from .kv_cache import SPARE_COLUMNS, AppendLayer, appending_cache

        batch, width = input_ids.shape
        reused = cache.get_seq_length()
        uncached = attention[:, reused:]
        # Offset of each row's first real uncached column (argmax: the first 1); a row with
        # none counts as starting at the end.
        first = torch.where(uncached.any(dim=1), uncached.argmax(dim=1), width - reused)
        full = batch * (width - reused)
        split, cost = 0, full
        # A head with context runs on a copy of its rows' cached keys and values: a few rows' worth,
        # not the cache. Rows with nothing cached need no copy.
        has_context = attention[:, :reused].any(dim=1)
        most_rows = max(1, int(MAX_HEAD_ROW_SHARE * batch))
        for offset in sorted(set(first.tolist())):
            head = first < offset
            head_rows = int(head.sum())
            small = head_rows <= most_rows or not bool((head & has_context).any())
            if 0 < offset < width - reused and small:  # generate must still prefill a column
                candidate = head_rows * offset + batch * (width - reused - offset)
                if candidate < cost:
                    split, cost = offset, candidate
        if full - cost < MIN_HEAD_SAVING * full:
            return 0
        rows = (first < split).nonzero().squeeze(1)
        context = bool(has_context[rows].any())
        # Appending layers with room for the head: copying a cache is what costs here.
        head_cache = appending_cache(self.model.config)
        if context:
            for index, layer in enumerate(cache.layers):
                head_cache.layers[index].next_spare = split
                head_cache.update(layer.keys[rows], layer.values[rows], index)
            self.copied_columns += len(rows) * reused
        start = reused if context else 0  # where the head's own columns begin in head_cache
        mask = attention[rows, reused - start:reused + split]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, start:]
        # The base model: its layers fill the cache; the language-model head is not needed.
        getattr(self.model, "base_model", self.model)(
            input_ids=input_ids[rows, reused:reused + split], attention_mask=mask, position_ids=positions,
            past_key_values=head_cache, use_cache=True)
        for index, layer in enumerate(head_cache.layers):
            keys, values = layer.keys[:, :, start:], layer.values[:, :, start:]
            all_keys = keys.new_zeros((batch, *keys.shape[1:]))
            all_values = values.new_zeros((batch, *values.shape[1:]))
            all_keys[rows], all_values[rows] = keys, values
            if isinstance(cache.layers[index], AppendLayer):  # room for the rest of the prefill and the replies
                cache.layers[index].next_spare = width - reused - split + SPARE_COLUMNS
            cache.update(all_keys, all_values, index)
        return len(rows) * split

    def _thread_timer(self, outer_threads: int) -> Any:
        """The timing of this call's thread counts (None: a pinned count is set instead)."""
        import torch

        if self.threads or next(self.model.parameters()).device.type != "cpu" or outer_threads == 1:
            torch.set_num_threads(self.threads or outer_threads)
            return None
        if self._chooser is None or self._chooser.candidates[0] != outer_threads:
            self._chooser = shared_chooser((outer_threads, 1))
        return self._chooser.call()


def _continuable(cache: Any) -> bool:
    """Whether `cache` can be continued after middle padding and row selection: only full-attention
    dynamic layers (a sliding window would count padding columns, recurrent states cannot be masked)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from .kv_cache import AppendLayer

    return isinstance(cache, DynamicCache) and all(type(layer) in (DynamicLayer, AppendLayer) for layer in cache.layers)


def _stopping(stop_when: Callable[[], bool] | None) -> Any:
    """transformers' stopping criteria ending every row once `stop_when()` is true (None: none)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    if stop_when is None:
        return StoppingCriteriaList()

    class _StopWhen(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            return torch.full((input_ids.shape[0],), bool(stop_when()), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopWhen()])
