"""Environments registered by string id with `"module:attr"` entry points.

Entry points are imported lazily so that `agentgym-rl envs` does not import every
environment's dependencies.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UserError
from .base import TextEnv
from .safe_kwargs import NotSettable, SafeArg, SafeMembers
from .tasks import SPLITS, Task
from .wrappers import InvalidActionPenalty, TurnLimit


@dataclass(frozen=True)
class EnvSpec:
    """How to build one environment and list its tasks.

    Attributes:
        env_id: the name users type, e.g. "babyai".
        entry_point: "module:Class" of the `TextEnv`.
        tasks_entry_point: "module:function"; function(split) -> list[Task].
        max_turns: default turn limit for evaluation (the paper's limits).
        expert_entry_point: "module:Class" of the expert policy, if there is one.
        kwargs: default constructor arguments.
        max_parallel: most instances a rollout keeps alive at once (0: no limit), for
            environments that hold a heavy resource each (a JVM, a browser).
        pure_python: whether its calls only compute in this Python process (never wait on a
            JVM, a browser, the network or a lock): an env server runs them on its event loop,
            the fastest way, while others run in threads so that a slow or hung call holds up
            only its own instance (`server.offload`).
        augment_entry_point: "module:function" making a renamed copy of an episode's messages,
            function(messages, rng) -> messages, an episode of the environment as well (e.g.
            BabyAI's colors permuted); the warm-up trains on such copies (`warmup.augment`).
        requires: what the user must provide before it can run (a server, data), if anything;
            such environments are left out of what runs by default (`bench-agent`).
        state_keys: its infos carry `state_key`, naming the true state (`TextEnv`); GiGPO's
            step level needs it, and falls back to the episode level without.
        discoveries: its step infos carry `discovered`, how much of the world the step showed
            for the first time (`TextEnv`); `algo.discovery_bonus` needs it.
        check_entry_point: "module:function", function(**kwargs) -> int | None, run by
            `env_factory` before any work for what building one instance does not check (a mix
            builds each member once): it raises ValueError or TypeError on a bad argument, and
            may return the most instances to keep alive at once (None: `max_parallel`).
        safe_kwargs: the constructor arguments a request may set (the viewer's playground),
            each with its bounds (`safe_kwargs.SafeArg`); every other one is refused there.
        installed_entry_point: "module:function", function(**kwargs) -> None, raising a
            UserError that says how to install what the environment needs beyond Python packages
            the project installs (a browser, Java), checked before any work (`check_installed`).
    """

    env_id: str
    entry_point: str
    tasks_entry_point: str
    max_turns: int
    expert_entry_point: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_parallel: int = 0
    pure_python: bool = False
    augment_entry_point: str | None = None
    requires: str | None = None
    state_keys: bool = False
    discoveries: bool = False
    check_entry_point: str | None = None
    safe_kwargs: dict[str, SafeArg | SafeMembers] = field(default_factory=dict)
    installed_entry_point: str | None = None


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> None:
    if spec.env_id in _REGISTRY:
        raise ValueError(f"environment {spec.env_id!r} is already registered")
    _REGISTRY[spec.env_id] = spec


def load_entry_point(entry_point: str) -> Callable[..., Any]:
    module_name, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def env_ids() -> list[str]:
    return sorted(_REGISTRY)


def spec(env_id: str) -> EnvSpec:
    try:
        return _REGISTRY[env_id]
    except KeyError:
        raise UserError(f"unknown environment {env_id!r}; registered: {', '.join(env_ids())}") from None


def make(env_id: str, max_turns: int | None = None, **kwargs: Any) -> TextEnv:
    """Build a registered environment, wrapped in a `TurnLimit` when `max_turns` is given."""
    env_spec = spec(env_id)
    env = load_entry_point(env_spec.entry_point)(**{**env_spec.kwargs, **kwargs})
    return TurnLimit(env, max_turns) if max_turns is not None else env


def members(env_id: str, kwargs: dict[str, Any] | None = None) -> list[str]:
    """The environments `env_id` plays: a mix's members (`env.kwargs.members`), else itself."""
    if env_id != "mix":
        return [env_id]
    parse_members = load_entry_point("agentgym_rl.envs.mix:parse_members")  # mix imports this module
    try:
        return [member.id for member in parse_members((kwargs or {}).get("members"))]
    except ValueError as error:
        raise UserError(f"bad arguments for environment 'mix': {error}") from None


def lacking(env_id: str, kwargs: dict[str, Any] | None, feature: str, urls: list[str] = ()) -> list[str]:
    """The environments `env_id` plays (`members`) whose `EnvSpec` does not set `feature`
    ("state_keys": they name no states; "discoveries": they report none). Played on AgentGym's
    own servers (an `env.urls` entry starting `agentgym+`), every one of them lacks both: that
    protocol answers a step with the observation, reward and end alone."""
    if feature not in ("state_keys", "discoveries"):
        raise ValueError(f"not a feature an EnvSpec declares: {feature!r}")
    if on_agentgym_servers(urls):
        return members(env_id, kwargs)
    return [member for member in members(env_id, kwargs) if not getattr(spec(member), feature)]


def on_agentgym_servers(urls: list[str]) -> bool:
    """Whether `env.urls` names one of AgentGym's own servers (`agentgym+http://...`)."""
    return any(url.startswith(AGENTGYM_SCHEME) for url in urls)


def check_installed(env_id: str, kwargs: dict[str, Any] | None = None) -> None:
    """A `UserError` saying what to install when `env_id` (a mix: any member) needs a program
    that is missing (`EnvSpec.installed_entry_point`)."""
    env_spec = spec(env_id)
    if env_spec.installed_entry_point is not None:
        load_entry_point(env_spec.installed_entry_point)(**(kwargs or {}))


def env_factory(env_id: str, kwargs: dict[str, Any] | None = None, urls: list[str] = (),
                timeout: float = 60.0) -> Callable[[], TextEnv]:
    """A function building fresh `env_id` environments with `kwargs`, checked by building
    one now so that bad arguments are a `UserError` before any work starts. With `urls`, the
    environments are clients of those servers (`agentgym-rl serve-env`; AgentGym's own for a
    URL starting `agentgym+`), taken in turn, that wait `timeout` seconds for an answer; a
    single `ray:` address plays them in Ray actors instead (`envs/ray_env.py`)."""
    kwargs = dict(kwargs or {})
    if any(url.startswith(RAY_SCHEME) for url in urls):
        return _ray_factory(env_id, kwargs, list(urls), timeout)
    if urls:
        return _remote_factory(env_id, kwargs, list(urls), timeout)
    env_spec = spec(env_id)
    max_parallel = env_spec.max_parallel
    try:
        make(env_id, **kwargs).close()
        if env_spec.check_entry_point:  # what building one instance does not check (a mix's members)
            max_parallel = load_entry_point(env_spec.check_entry_point)(**kwargs) or max_parallel
    except (TypeError, ValueError) as error:  # an unknown argument, or a bad value of one
        raise UserError(f"bad arguments for environment {env_id!r}: {error}") from None

    def factory() -> TextEnv:
        return make(env_id, **kwargs)

    factory.max_parallel = max_parallel  # type: ignore[attr-defined]
    return factory


def checked_kwargs(env_id: str, kwargs: Any,
                   base: Callable[[str], dict[str, Any]] = lambda env_id: {}) -> dict[str, Any]:
    """`kwargs` of `env_id` as a request gave them, each checked against the environment's
    `safe_kwargs`, over `base(env_id)`: the arguments the process was started with (a mix's
    members get theirs too).

    Raises:
        NotSettable: an argument that is not listed (the message names those that are).
        ValueError: an unknown environment, or a value of the wrong type or out of bounds.
    """
    if env_id not in _REGISTRY:
        raise ValueError(f"unknown environment {env_id[:40]!r}; registered: {', '.join(env_ids())}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"the arguments of {env_id!r} are a mapping, got {str(kwargs)[:80]!r}")
    safe = _REGISTRY[env_id].safe_kwargs
    checked = dict(base(env_id))
    for name, value in kwargs.items():
        if name not in safe:
            listed = ", ".join(sorted(safe)) or "none"
            raise NotSettable(f"{env_id}'s argument {str(name)[:40]!r} cannot be set by a request (it can: "
                              f"{listed}); the rest come from the command line")
        checked[name] = safe[name].check(f"{env_id}'s {name}", value)
    if env_id == "mix" and "members" in kwargs:
        for member in checked["members"]:  # each member's own, over those its environment was given
            member["kwargs"] = checked_kwargs(member["id"], member["kwargs"], base)
    return checked


AGENTGYM_SCHEME = "agentgym+"
"""Prefix of a URL in `env.urls` that names one of AgentGym's own servers (`agentgym+http://...`)."""


RAY_SCHEME = "ray:"
"""Prefix of an `env.urls` entry that plays the environments in Ray actors (`envs/ray_env.py`)."""


def _ray_factory(env_id: str, kwargs: dict[str, Any], urls: list[str], timeout: float) -> Callable[[], TextEnv]:
    if len(urls) != 1:
        raise UserError(f"env.urls {urls}: a Ray address (ray:local, ray:auto, ray://HOST:PORT) must be the only entry")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("env.urls names Ray, which is not installed: pip install 'agentgym-rl[ray]'") from None
    from .ray_env import ray_factory

    env_spec = spec(env_id)
    instruction = load_entry_point(env_spec.entry_point).instruction
    try:
        return ray_factory(env_id, env_spec.entry_point, {**env_spec.kwargs, **kwargs}, urls[0], timeout,
                           instruction, env_spec.max_parallel)
    except (TypeError, ValueError, ConnectionError) as error:
        raise UserError(f"environment {env_id!r} on {urls[0]}: {error}") from None


def _remote_factory(env_id: str, kwargs: dict[str, Any], urls: list[str], timeout: float) -> Callable[[], TextEnv]:
    from .remote import RemoteEnvError, in_turn

    if kwargs:
        raise UserError(f"env.kwargs {kwargs} cannot reach environment servers: start them with "
                        "`agentgym-rl serve-env ... --env-arg key=value` instead")
    makers = []
    for url in urls:  # every server is reachable and serves this environment, checked before any work
        try:
            makers.append(_agentgym_server(env_id, url, timeout) if url.startswith(AGENTGYM_SCHEME)
                          else _our_server(env_id, url, timeout))
        except RemoteEnvError as error:
            raise UserError(f"environment server {url}: {error}") from None
    return in_turn(makers)


def _our_server(env_id: str, url: str, timeout: float) -> tuple[Any, Callable[[], TextEnv]]:
    from .remote import EnvServer, HttpEnv

    server = EnvServer(url, retries=1, timeout=timeout)
    if server.env_id != env_id:
        server.close()
        raise UserError(f"environment server {url} serves {server.env_id!r}, not {env_id!r}")
    server.retries = 3
    return server, lambda: HttpEnv(server)


def _agentgym_server(env_id: str, url: str, timeout: float) -> tuple[Any, Callable[[], TextEnv]]:
    from .agentgym_remote import SERVER_NAMES, AgentGymEnv
    from .remote import ServerConnection

    if env_id not in SERVER_NAMES:
        raise UserError(f"{url}: AgentGym's servers are spoken to for {', '.join(SERVER_NAMES)}, not {env_id!r}")
    server = ServerConnection(url.removeprefix(AGENTGYM_SCHEME), retries=1, timeout=timeout, probe_path="/")
    hello = server.call("GET", "/")  # "This is environment BabyAI."
    if not (isinstance(hello, str) and SERVER_NAMES[env_id].lower() in hello.lower()):
        server.close()
        raise UserError(f"{url} does not answer as AgentGym's {SERVER_NAMES[env_id]} server (GET / gave "
                        f"{str(hello)[:100]!r})")
    server.retries = 3
    instruction, max_turns = load_entry_point(spec(env_id).entry_point).instruction, spec(env_id).max_turns
    train_items = [task.index for task in tasks(env_id, "train")]
    return server, lambda: AgentGymEnv(env_id, server, instruction, max_turns, train_items)


def with_max_parallel(make_env: Callable[[], TextEnv], limit: int) -> Callable[[], TextEnv]:
    """`make_env` whose rollouts keep at most `limit` environments alive (`max_parallel`)."""
    def factory() -> TextEnv:
        return make_env()

    factory.max_parallel = limit  # type: ignore[attr-defined]
    return factory


def with_invalid_action_penalty(make_env: Callable[[], TextEnv], penalty: float) -> Callable[[], TextEnv]:
    """`make_env` (an `env_factory`) whose environments are wrapped in `InvalidActionPenalty`;
    `make_env` itself when the penalty is 0."""
    if penalty < 0:
        raise UserError(f"invalid_action_penalty must be >= 0, got {penalty}")
    if not penalty:
        return make_env

    def factory() -> TextEnv:
        return InvalidActionPenalty(make_env(), penalty)

    factory.max_parallel = getattr(make_env, "max_parallel", 0)  # type: ignore[attr-defined]
    return factory


def tasks(env_id: str, split: str, kwargs: dict[str, Any] | None = None) -> list[Task]:
    """The tasks of a split ("train" or "test"), in a fixed order.

    `kwargs` are the environment's constructor arguments (`env.kwargs`); the tasks function
    receives those its signature names (Deep Search's `qa_dir` chooses its questions)."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    make_tasks = load_entry_point(spec(env_id).tasks_entry_point)
    named = inspect.signature(make_tasks).parameters
    try:
        return make_tasks(split, **{key: value for key, value in (kwargs or {}).items() if key in named})
    except (OSError, ValueError) as error:
        raise UserError(f"the {split} tasks of {env_id!r}: {error}") from None


def augmenter(env_id: str) -> Callable[[list[dict[str, Any]], Any], list[dict[str, Any]]]:
    """The environment's episode-renaming function (`EnvSpec.augment_entry_point`).

    Raises:
        UserError: the environment has none.
    """
    env_spec = spec(env_id)
    if env_spec.augment_entry_point is None:
        with_one = [e for e in env_ids() if spec(e).augment_entry_point]
        raise UserError(f"environment {env_id!r} has no renamed copies of its episodes (warmup.augment must be 0); "
                        f"environments that have them: {', '.join(with_one) or 'none'}")
    return load_entry_point(env_spec.augment_entry_point)


def make_expert(env_id: str) -> Any:
    """The expert policy of an environment (see `agent.policies.Policy`)."""
    env_spec = spec(env_id)
    if env_spec.expert_entry_point is None:
        raise UserError(f"environment {env_id!r} has no expert policy")
    return load_entry_point(env_spec.expert_entry_point)()


register(
    EnvSpec(
        env_id="babyai",
        entry_point="agentgym_rl.envs.babyai.env:BabyAIEnv",
        tasks_entry_point="agentgym_rl.envs.babyai.levels:babyai_tasks",
        max_turns=20,
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        pure_python=True,
        augment_entry_point="agentgym_rl.envs.babyai.augment:permute_colors",
        state_keys=True,
        discoveries=True,
        safe_kwargs={"list_actions": SafeArg(bool), "note_unchanged": SafeArg(bool)},
    )
)

register(
    EnvSpec(
        env_id="textcraft",
        entry_point="agentgym_rl.envs.textcraft.env:TextCraftEnv",
        tasks_entry_point="agentgym_rl.envs.textcraft.goals:textcraft_tasks",
        max_turns=20,  # AgentGym-RL's TextCraft horizon; the expert needs at most 20 on split items
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        pure_python=True,
        augment_entry_point="agentgym_rl.envs.textcraft.augment:rename_items",
        state_keys=True,
        safe_kwargs={"variant": SafeArg(int, 0, 1000),
                     "expert_order": SafeArg(str, choices=("gets_first", "depth_first")),
                     "list_actions": SafeArg(bool)},
    )
)

register(
    EnvSpec(
        env_id="sciworld",
        entry_point="agentgym_rl.envs.sciworld.env:SciWorldEnv",
        tasks_entry_point="agentgym_rl.envs.sciworld.items:sciworld_tasks",
        # AgentGym-RL evaluated with 30 turns; the expert needs up to 83 on test items (the
        # 1-x state changes), so 100, ScienceWorld's own step limit (`--max-turns 30` for the paper's).
        max_turns=100,
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        max_parallel=8,  # one ~0.5 GB JVM each
        installed_entry_point="agentgym_rl.envs.sciworld.simulator:check_java",
        safe_kwargs={"reward": SafeArg(str, choices=("score", "success", "raw")),
                     "simplification": SafeArg(str, separator=",", choices=(
                         "easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                         "noElectricalAction"))},
    )
)

register(
    EnvSpec(
        env_id="search",
        entry_point="agentgym_rl.envs.search.env:SearchEnv",
        tasks_entry_point="agentgym_rl.envs.search.env:search_tasks",
        max_turns=10,  # the longest questions take 4 searches and an answer
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        # Not pure_python: with `retriever_url` a search waits on a retrieval server.
        # The corpus, questions, encoder folder and world size come from the command line only.
        safe_kwargs={"top_k": SafeArg(int, 1, 20), "retriever": SafeArg(str, choices=("bm25", "dense"))},
    )
)

register(
    EnvSpec(
        env_id="web",
        entry_point="agentgym_rl.envs.web.env:WebEnv",
        tasks_entry_point="agentgym_rl.envs.web.env:web_tasks",
        max_turns=15,  # the longest embedded tasks take 6 actions; WebArena allows 30
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        max_parallel=8,  # a browser context (a renderer process) each
        installed_entry_point="agentgym_rl.envs.web.browser:check_browser",
        # Not the browser, task file, site or judge URLs, nor a browser process of its own.
        safe_kwargs={"screenshot": SafeArg(bool), "timeout": SafeArg(float, 0.5, 60.0)},
    )
)

register(
    EnvSpec(
        env_id="mix",
        entry_point="agentgym_rl.envs.mix:MixEnv",
        tasks_entry_point="agentgym_rl.envs.mix:mix_tasks",
        max_turns=100,  # the engine's cap; each member's own limit ends its episodes (`envs/mix.py`)
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        state_keys=True,  # those of its members that name their states
        requires="env.kwargs.members: the environments it mixes",
        check_entry_point="agentgym_rl.envs.mix:check_members",
        installed_entry_point="agentgym_rl.envs.mix:check_members_installed",
        safe_kwargs={"members": SafeMembers()},
    )
)

register(
    EnvSpec(
        env_id="mcp",
        entry_point="agentgym_rl.envs.mcp.env:MCPEnv",
        tasks_entry_point="agentgym_rl.envs.mcp.env:mcp_tasks",
        max_turns=8,  # the built-in tasks take two calls and an answer
        expert_entry_point="agentgym_rl.envs.base:EnvExpert",
        max_parallel=8,  # an MCP session each, a server process each over stdio
        # Nothing: the server command, its URL and the task file come from the command line only.
        safe_kwargs={},
    )
)

register(
    EnvSpec(
        env_id="appworld",
        entry_point="agentgym_rl.envs.appworld.env:AppWorldEnv",
        tasks_entry_point="agentgym_rl.envs.appworld.env:appworld_tasks",
        max_turns=30,  # our choice; AppWorld's server allows up to 1000 interactions per task
        max_parallel=1,  # AppWorld's server holds one task at a time
        requires="an AppWorld environment server (env.kwargs.url) and the AppWorld data (env.kwargs.data_root)",
        safe_kwargs={"test_set": SafeArg(str, choices=("test_normal", "test_challenge", "dev")),
                     "timeout": SafeArg(float, 1.0, 600.0)},
    )
)
