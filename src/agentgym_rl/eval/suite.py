"""The benchmark suite (`agentgym-rl bench-agent`): one policy on the test split of every
environment, in one table of the system's layout (per env, per category, Avg@1 greedy, Avg@n
and Pass@n sampled), with its test-time scaling curves (success against the turn budget,
Pass@k against the number of samples).

The output folder holds `config.yaml` (every setting, the seed and each env's turn limit),
`trajectories/ENV.PASS.jsonl` (every episode; a rerun plays only the items not finished
there), `results.json`, `table.md`, `results.csv`, `turns.png` and `pass_at_k.png`.
Metric definitions: docs/METRICS.md.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import dump_yaml, to_dict
from ..config.evaluation import SYSTEM_TURN_LIMITS, SuiteConfig
from ..envs import registry
from ..envs.tasks import choose_items
from ..errors import UserError
from ..rollout.engine import RolloutEngine
from ..rollout.trajectory import Trajectory
from ..rollout.backends import load_model, model_policy, samples_in_process
from .evaluate import _check_listable, make_policy
from .metrics import pass_at_k_curve, success_within_turns, summarize
from .policies import RandomPolicy

CHUNK_ITEMS = 32
"""Items played between two appends to the trajectory file: what a rerun may play again."""


@dataclass(frozen=True)
class Pass:
    """One way of playing every item: `samples` episodes at `temperature`."""

    name: str
    temperature: float
    samples: int


def passes(config: SuiteConfig) -> list[Pass]:
    """The greedy pass (one episode per item at temperature 0), then the sampled one."""
    out = [Pass("greedy", 0.0, 1)] if config.suite.greedy else []
    if config.suite.samples:
        out.append(Pass("sampled", config.suite.temperature, config.suite.samples))
    if not out:
        raise UserError("nothing to play: suite.greedy is false and suite.samples is 0")
    return out


class Policies:
    """Builds the policy of each (env, temperature), loading a model folder only once."""

    def __init__(self, policy: str, config: SuiteConfig):
        from ..agent.models import is_model_reference, model_folder

        # A named model or .gguf file: its prepared folder, loaded once like any model folder.
        self.policy = str(model_folder(policy)) if is_model_reference(policy) else policy
        self.config = config
        self._model: tuple[Any, Any] | None = None

    def _in_process_model(self) -> bool:
        known = self.policy in ("expert", "random") or self.policy.startswith("api:")
        return not known and samples_in_process(self.config.rollout) and Path(self.policy).is_dir()

    def make(self, env_id: str, temperature: float) -> Any:
        config = self.config
        if not self._in_process_model():
            return make_policy(env_id, self.policy, temperature, config.run.seed, config.run.device, config.run.dtype,
                               config.rollout)
        if self._model is None:
            self._model = load_model(self.policy, config.run.dtype, config.run.device)
        return model_policy(*self._model, temperature, config.rollout)


def api_client(policy: Any) -> Any:
    """The `OpenAIClient` a policy sends its requests through (it counts tokens), if any."""
    return getattr(policy, "client", None) or getattr(getattr(policy, "generator", None), "client", None)


# ------------------------------------------------------------------------ the trajectory files
def read_finished(path: Path, samples: int) -> dict[str, list[Trajectory]]:
    """The items of a trajectory file with all their `samples` episodes, by item id.

    A line cut off by an interrupted run, or an item with fewer episodes, is left out (and
    played again)."""
    by_item: dict[str, list[Trajectory]] = {}
    if not path.exists():
        return by_item
    for line in path.read_text().splitlines():
        try:
            trajectory = Trajectory.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue
        by_item.setdefault(trajectory.item_id, []).append(trajectory)
    return {item: ts for item, ts in by_item.items() if len(ts) == samples}


def _rewrite(path: Path, finished: dict[str, list[Trajectory]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for trajectories in finished.values():
            for t in trajectories:
                out.write(json.dumps(t.to_json()) + "\n")


# ------------------------------------------------------------------------------------ playing
def play_pass(env_id: str, run_pass: Pass, policies: Policies, config: SuiteConfig, out: Path,
              progress: Callable[[int], Any]) -> tuple[list[Trajectory], dict]:
    """Play the items of `env_id`'s test split not yet in `out/trajectories/ENV.PASS.jsonl`,
    appending them there every `CHUNK_ITEMS` items; every item's episodes, in split order,
    and the pass's accounting (seconds, tokens)."""
    kwargs = config.suite.env_kwargs.get(env_id) or None
    tasks = registry.tasks(env_id, "test", kwargs)
    if config.suite.episodes:
        tasks = choose_items(tasks, config.suite.episodes, config.suite.items)
    path = out / "trajectories" / f"{env_id}.{run_pass.name}.jsonl"
    finished = read_finished(path, run_pass.samples)
    _rewrite(path, finished)  # drops cut-off lines and unfinished items before appending
    wanted = {task.item_id for task in tasks}
    progress(sum(len(ts) for item, ts in finished.items() if item in wanted))
    todo = [task for task in tasks if task.item_id not in finished]
    # Time and tokens add up over the invocations that played this pass; the peak is the largest.
    account_path = path.with_suffix(".account.json")
    account = {"seconds": 0.0, "api_prompt_tokens": 0, "api_completion_tokens": 0, "peak_rss_gb": None}
    if account_path.is_file():
        account.update(json.loads(account_path.read_text()))
    if todo:
        import torch

        torch.manual_seed(config.run.seed)  # a model's sampling: the same episodes from the same state
        _reset_peak_rss()
        started = time.perf_counter()
        policy = policies.make(env_id, run_pass.temperature)
        client = api_client(policy)
        before = (client.prompt_tokens, client.completion_tokens) if client is not None else (0, 0)
        make_env = registry.env_factory(env_id, kwargs)
        if isinstance(policy, RandomPolicy):
            _check_listable(make_env, todo[0], config.run.seed,
                                "it has no random policy; use --policy expert or a model folder")
        horizon = max_turns(env_id, config)
        with RolloutEngine(make_env, config.rollout) as engine:
            for start in range(0, len(todo), CHUNK_ITEMS):
                played = engine.run(todo[start:start + CHUNK_ITEMS], policy, horizon, samples=run_pass.samples,
                                    seed=config.run.seed, progress=progress)
                with path.open("a") as file:
                    for t in played:
                        file.write(json.dumps(t.to_json()) + "\n")
                for t in played:
                    finished.setdefault(t.item_id, []).append(t)
        account["seconds"] += time.perf_counter() - started
        peak = _peak_rss_gb()
        if peak is not None:
            account["peak_rss_gb"] = max(peak, account["peak_rss_gb"] or 0.0)
        if client is not None:
            account["api_prompt_tokens"] += client.prompt_tokens - before[0]
            account["api_completion_tokens"] += client.completion_tokens - before[1]
        account_path.write_text(json.dumps(account))
    return [t for task in tasks for t in finished[task.item_id]], account


def _reset_peak_rss() -> None:
    """Count this process' peak resident memory afresh from now (Linux: VmHWM set back to the
    current RSS by writing 5 to /proc/self/clear_refs); elsewhere nothing."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_gb() -> float | None:
    """This process' peak resident memory since `_reset_peak_rss` (VmHWM), in GB (10^9 bytes);
    None where /proc does not tell it. Child processes (a JVM, a browser) are not in it."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return None if kib is None else kib * 1024 / 1e9


def max_turns(env_id: str, config: SuiteConfig) -> int:
    return (config.suite.max_turns.get(env_id) or SYSTEM_TURN_LIMITS.get(env_id)
            or registry.spec(env_id).max_turns)


def env_result(env_id: str, played: dict[str, tuple[list[Trajectory], dict]], config: SuiteConfig) -> dict:
    """One environment's results: per pass its `summarize` fields, items per category,
    generated tokens, the turn-budget curve, and (sampled) the Pass@k curve."""
    result: dict[str, Any] = {"max_turns": max_turns(env_id, config)}
    for name, (trajectories, account) in played.items():
        summary = summarize(trajectories).as_dict()  # results.json's record of the pass
        items: dict[str, set] = {}
        for t in trajectories:
            items.setdefault(t.category, set()).add(t.item_id)
        summary["items_by_category"] = {c: len(ids) for c, ids in sorted(items.items())}
        summary["generated_tokens"] = sum(sum(t.loss_mask) for t in trajectories)
        summary.update(account)
        summary["success_within_turns"] = success_within_turns(trajectories, result["max_turns"])
        if name == "sampled":
            summary["pass_at_k_curve"] = pass_at_k_curve(trajectories)
        result[name] = summary
    return result


def run_suite(policy: str, config: SuiteConfig, out: Path, show_progress: bool = True) -> dict[str, str]:
    """Play every environment's passes (resuming from `out`) and write every output file
    (`results.json`, `results.csv`, `table.md`, the plots). An environment that cannot be played
    (say its JVM or browser is missing) is recorded with its reason, and the others still run.

    Returns:
        The environments that were not played, each with its reason ({} when all were).
    """
    env_ids = config.suite.envs or [e for e in registry.env_ids() if registry.spec(e).requires is None]
    known = registry.env_ids()
    for where, names in (("", env_ids), ("suite.max_turns names ", config.suite.max_turns),
                         ("suite.env_kwargs names ", config.suite.env_kwargs)):
        unknown = [e for e in names if e not in known]
        if unknown:
            raise UserError(f"{where}unknown environment {unknown[0]!r}; known: {', '.join(known)}")
    settings = {"policy": policy, "config": to_dict(config),
                "max_turns": {env_id: max_turns(env_id, config) for env_id in env_ids}}
    _claim(out, settings)
    run_passes = passes(config)
    from ..progress import progress_bar

    results: dict[str, Any] = {**settings, "envs": {}}
    total = sum(_item_count(env_id, config) * p.samples for env_id in env_ids for p in run_passes)
    policies = Policies(policy, config)
    with progress_bar(total=total, unit="ep", desc="bench-agent", disable=not show_progress) as bar:
        for env_id in env_ids:
            played: dict[str, tuple[list[Trajectory], dict]] = {}
            try:
                for run_pass in run_passes:
                    bar.set_description(f"{env_id} {run_pass.name}")
                    began = time.monotonic()
                    played[run_pass.name] = play_pass(env_id, run_pass, policies, config, out, bar.update)
                    episodes = played[run_pass.name][0]
                    if show_progress and episodes:
                        success = sum(t.success for t in episodes) / len(episodes)
                        _say(f"{env_id} {run_pass.name}: success {100 * success:.1f}% over {len(episodes)} episodes "
                             f"({time.monotonic() - began:.0f} s)")
                results["envs"][env_id] = env_result(env_id, played, config)
            except UserError as error:
                results["envs"][env_id] = {"max_turns": max_turns(env_id, config), "error": str(error)}
                if show_progress:
                    _say(f"{env_id}: not played: {error}")
    from .suite_report import write_outputs

    write_outputs(results, out)
    return {env_id: result["error"] for env_id, result in results["envs"].items() if "error" in result}


def _say(line: str) -> None:
    """A line on stderr as each pass ends: above the bar on a terminal, plain in a log (whose
    progress lines come at most once a minute)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def _item_count(env_id: str, config: SuiteConfig) -> int:
    try:
        count = len(registry.tasks(env_id, "test", config.suite.env_kwargs.get(env_id) or None))
    except UserError:
        return 0
    return min(count, config.suite.episodes) if config.suite.episodes else count


def _claim(out: Path, settings: dict) -> None:
    """Write `out/config.yaml`, or check that the folder holds a run of the same settings (a
    rerun resumes it; mixing episodes of other settings would make a wrong table)."""
    import yaml

    path = out / "config.yaml"
    if path.exists():
        before = yaml.safe_load(path.read_text())
        if before != json.loads(json.dumps(settings)):
            raise UserError(f"{out} holds a benchmark of other settings (see its config.yaml); use another --out "
                            "or delete the folder")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(json.loads(json.dumps(settings))))
