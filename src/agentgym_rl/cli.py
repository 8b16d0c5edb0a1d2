"""The `agentgym-rl` command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train LLM agents on multi-turn environments with reinforcement learning.")


@app.command()
def envs() -> None:
    """List registered environment ids, one per line."""
    from .envs import env_ids

    for env_id in env_ids():
        typer.echo(env_id)


@app.command()
def algos() -> None:
    """List RL algorithm names, one per line."""
    from .algos import algorithm_names

    for name in algorithm_names():
        typer.echo(name)


@app.command("eval")
def eval_command(
    env: str = typer.Option(..., help="Environment id (see `agentgym-rl envs`)."),
    policy: str = typer.Option(..., help="'expert', 'random', or a local model folder."),
    split: str = typer.Option("test", help="train or test."),
    episodes: Optional[int] = typer.Option(None, help="First N items of the split (default: all)."),
    samples: int = typer.Option(1, help="Samples per item (Avg@n over them, Pass@k with k = samples)."),
    max_turns: Optional[int] = typer.Option(None, help="Turn limit (default: the environment's)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature of a model policy (0 = greedy)."),
    max_new_tokens: int = typer.Option(48, min=1, help="Token limit of one reply of a model policy (the quickstart "
                                       "trains and validates with 12)."),
    seed: int = typer.Option(0, help="Seed of resets and the random policy."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the summary as JSON here."),
    trajectories: Optional[Path] = typer.Option(None, help="Write the episodes as JSONL here."),
    env_arg: Optional[List[str]] = typer.Option(None, help="Environment argument key=value (repeatable), "
                                                "e.g. list_actions=false for a quickstart model."),
    system_prompt: bool = typer.Option(False, help="Open conversations with the environment's instruction "
                                       "(as the model was trained: the quickstart does not)."),
    reuse_kv_cache: bool = typer.Option(True, help="Keep each turn's KV cache for the next turn "
                                        "(prefix caching; off only to compare speed or save memory)."),
) -> None:
    """Evaluate a policy: Avg@n and Pass@k, overall and per category."""
    from .config import apply_override
    from .eval.evaluate import evaluate, format_table
    from .config import RolloutConfig
    from .rollout.trajectory import save_trajectories

    env_kwargs: dict = {}
    for item in env_arg or []:
        apply_override(env_kwargs, item)
    summary, episodes_run = evaluate(env, policy, split, episodes, samples, max_turns, temperature, seed,
                                     RolloutConfig(max_new_tokens=max_new_tokens, system_prompt=system_prompt,
                                                   reuse_kv_cache=reuse_kv_cache),
                                     env_kwargs=env_kwargs)
    typer.echo(format_table(summary))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    if trajectories is not None:
        save_trajectories(episodes_run, trajectories)


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config (see configs/)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides."),
    resume: bool = typer.Option(False, help="Continue from the run folder's latest checkpoint."),
) -> None:
    """Train with online RL (GRPO + ScalingInter-RL by default)."""
    from .config import RLConfig, load_config
    from .eval.plots import plot_run
    from .train.rl import RLTrainer

    train_config = load_config(RLConfig, config, overrides or [])
    trainer = RLTrainer(train_config)
    trainer.fit(resume=resume)
    typer.echo(f"run folder: {trainer.run_dir}  plot: {plot_run(trainer.run_dir)}")


@app.command()
def quickstart(
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides of the quickstart config."),
) -> None:
    """Build a tiny model, warm it up, train it with GRPO on BabyAI, and compare before/after."""
    from .quickstart import run_quickstart

    run_quickstart(overrides or [])


@app.command()
def compare(
    configs: List[Path] = typer.Argument(..., help="Train configs to compare (their file names label the runs)."),
    seeds: str = typer.Option("0", help="Comma-separated seeds; every config runs with each."),
    out: Path = typer.Option(Path("runs/compare"), help="Folder of the runs, the table and the plot."),
    override: Optional[List[str]] = typer.Option(None, "--set", help="key=value applied to every config "
                                                 "(repeatable), e.g. --set train.steps=40."),
) -> None:
    """Train each config under the same seeds and budget; write a success-vs-step table and plot."""
    from .train.compare import run_comparison

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    for path in configs:
        if not path.is_file():
            raise UserError(f"config file {str(path)!r} does not exist")
    run_comparison(list(configs), seed_list, list(override or []), out)


# ------------------------------------------------------------------------ imitation learning


@app.command()
def collect(
    env: str = typer.Option(..., help="Environment id (see `agentgym-rl envs`)."),
    policy: str = typer.Option(..., help="'expert', 'random', or a local model folder."),
    out: Path = typer.Option(..., help="JSONL file to write."),
    split: str = typer.Option("train", help="train or test."),
    episodes: Optional[int] = typer.Option(None, help="First N items of the split (default: all)."),
    samples: int = typer.Option(1, help="Episodes per item (several give DPO pairs)."),
    fmt: str = typer.Option("agenttraj", "--format", help="agenttraj (AgentGym's SFT records), chat "
                            "({\"messages\": ...}) or trajectory (our records with token ids)."),
    successes_only: bool = typer.Option(False, help="Write only the episodes that succeeded."),
    max_turns: Optional[int] = typer.Option(None, help="Turn limit (default: the environment's)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature of a model policy (0 = greedy)."),
    max_new_tokens: int = typer.Option(48, min=1, help="Token limit of one reply of a model policy (the quickstart "
                                       "trains and validates with 12)."),
    seed: int = typer.Option(0, help="Seed of resets and the random policy."),
    env_arg: Optional[List[str]] = typer.Option(None, help="Environment argument key=value (repeatable), "
                                                "e.g. list_actions=false."),
    system_prompt: bool = typer.Option(False, help="Open conversations with the environment's instruction "
                                       "(train and evaluate with the same choice)."),
) -> None:
    """Play a policy through the rollout engine and write its episodes (e.g. expert demonstrations)."""
    from .config import RolloutConfig, apply_override
    from .train.collect import collect as collect_episodes

    env_kwargs: dict = {}
    for item in env_arg or []:
        apply_override(env_kwargs, item)
    result = collect_episodes(env, policy, out, split, episodes, samples, max_turns, temperature, seed, fmt,
                              successes_only, RolloutConfig(max_new_tokens=max_new_tokens, system_prompt=system_prompt),
                              env_kwargs)
    summary = result.summary
    dropped = []
    if result.dropped_failures:
        dropped.append(f"{result.dropped_failures} failures left out")
    if result.dropped_unwritable:
        dropped.append(f"{result.dropped_unwritable} episodes without a reply left out")
    typer.echo(f"collected {summary['episodes'] * summary['samples']} episodes ({summary['episodes']} items × "
               f"{summary['samples']}), success {100 * summary['success']:.1f}%, wrote {result.written} {fmt} "
               f"records to {out}" + (f" ({', '.join(dropped)})" if dropped else ""))


@app.command()
def sft(
    config: Path = typer.Argument(..., help="YAML config (e.g. configs/babyai_sft.yaml)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides."),
) -> None:
    """Supervised fine-tuning on multi-turn conversations (loss on assistant turns only)."""
    from .config import SFTConfig, load_config
    from .train.sft_trainer import SFTTrainer

    result = SFTTrainer(load_config(SFTConfig, config, overrides or [])).fit()
    typer.echo(f"run folder: {result['run_dir']}  model: {result['model']}")


@app.command()
def dpo(
    config: Path = typer.Argument(..., help="YAML config (e.g. configs/babyai_dpo.yaml)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides."),
) -> None:
    """Direct Preference Optimization on pairs of trajectories of the same item."""
    from .config import DPOConfig, load_config
    from .train.dpo import DPOTrainer

    result = DPOTrainer(load_config(DPOConfig, config, overrides or [])).fit()
    if result["before"] is not None:
        typer.echo(f"test success {100 * result['before']['success']:.1f}% -> {100 * result['after']['success']:.1f}%")
    typer.echo(f"run folder: {result['run_dir']}  model: {result['model']}")


@app.command()
def rft(
    config: Path = typer.Argument(..., help="YAML config (e.g. configs/babyai_rft.yaml)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides."),
) -> None:
    """Rejection-sampling fine-tuning: rounds of sample, keep successes, fine-tune, evaluate."""
    from .config import RFTConfig, load_config
    from .train.rft import RFTTrainer

    trainer = RFTTrainer(load_config(RFTConfig, config, overrides or []))
    records = trainer.fit()
    typer.echo(f"{'round':>5}{'sampled success':>17}{'kept':>6}{'test success':>14}")
    for r in records:
        sampled = f"{100 * r['sample/success']:.1f}%" if "sample/success" in r else "-"
        kept = str(r.get("sft/conversations", "-"))
        tested = f"{100 * r['eval']['success']:.1f}%" if r["eval"] else "-"
        typer.echo(f"{r['round']:>5}{sampled:>17}{kept:>6}{tested:>14}")
    typer.echo(f"run folder: {trainer.run_dir}  checkpoints: {trainer.run_dir / 'checkpoints'}")


def main() -> None:
    """Entry point: a `UserError` becomes a one-line message and exit code 2."""
    try:
        app()
    except UserError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
