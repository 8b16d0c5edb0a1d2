"""`agentgym-rl bench-agent`: the test-time scaling estimators by hand, the table against the
episodes it was made from, resuming, a served model equal to the in-process one, and the whole
command on the tiny model over every registered environment."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest
import yaml
from conftest import CORPUS
from test_cli import run, run_process
from test_env_e2e import TINY_RUN
from test_model_server import TINY
from test_server import serving_app

from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import build_tiny
from agentgym_rl.config import from_dict
from agentgym_rl.config.evaluation import SuiteConfig
from agentgym_rl.eval.evaluate import evaluate
from agentgym_rl.eval.metrics import pass_at_k_curve, success_within_turns
from agentgym_rl.eval.suite import read_finished, run_suite
from agentgym_rl.rollout.trajectory import Trajectory, load_trajectories
from agentgym_rl.server.model_server import create_model_app


def episode(item: str, success: bool, turns: int = 1, category: str = "c") -> Trajectory:
    return Trajectory(env_id="e", item_id=item, category=category, success=success, turn_rewards=[0.0] * turns)


def test_pass_at_k_curve_by_hand():
    # a: 1 of 3 solved, b: 2 of 3. Pass@1 = (1/3 + 2/3) / 2; Pass@2: a 1 - C(2,2)/C(3,2) = 2/3,
    # b 1 - C(1,2)/C(3,2) = 1; Pass@3: both solved once.
    runs = [episode("a", s) for s in (True, False, False)] + [episode("b", s) for s in (True, True, False)]
    assert pass_at_k_curve(runs) == pytest.approx([0.5, (2 / 3 + 1) / 2, 1.0])
    # n is the fewest samples of any item: a third sample of `b` alone does not give Pass@3
    assert len(pass_at_k_curve([episode("a", True), episode("a", False), episode("b", True)])) == 1


def test_success_within_turns_by_hand():
    runs = [episode("a", True, 2), episode("b", True, 5), episode("c", False, 3), episode("d", True, 1)]
    assert success_within_turns(runs, 6) == [0.25, 0.5, 0.5, 0.5, 0.75, 0.75]
    with pytest.raises(ValueError):
        success_within_turns([], 3)


def test_the_turn_curve_equals_playing_with_each_smaller_budget():
    """The expert (deterministic) on 12 BabyAI items: cutting its 20-turn episodes at b turns
    scores what playing with a limit of b turns scores."""
    _, long = evaluate("babyai", "expert", episodes=12, max_turns=20, progress=False)
    curve = success_within_turns(long, 20)
    for budget in (2, 4, 7):
        short, _ = evaluate("babyai", "expert", episodes=12, max_turns=budget, progress=False)
        assert short.summary.success == pytest.approx(curve[budget - 1])
    assert curve[1] < curve[-1]  # the budgets tried do cut some episodes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(CORPUS * 3, tmp_path_factory.mktemp("bench") / "model", TINY)


def suite_config(**suite) -> SuiteConfig:
    return from_dict(SuiteConfig, {"rollout": {"max_new_tokens": 8}, "suite": suite})


def test_the_table_is_what_the_trajectories_say(tmp_path):
    """Random play (seeded) on BabyAI and TextCraft: every percentage of table.md and every
    value of results.csv recounted from the trajectory files by hand."""
    config = suite_config(envs=["babyai", "textcraft"], episodes=12, samples=3, max_turns={"babyai": 6, "textcraft": 8})
    assert run_suite("random", config, tmp_path, show_progress=False) == {}
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["env"], r["category"]): r for r in csv.DictReader((tmp_path / "results.csv").open())}
    table = (tmp_path / "table.md").read_text()
    for env_id in ("babyai", "textcraft"):
        per_pass = {}
        for name in ("greedy", "sampled"):
            episodes = load_trajectories(tmp_path / "trajectories" / f"{env_id}.{name}.jsonl")
            assert len(episodes) == 12 * (1 if name == "greedy" else 3)
            by_category, by_item = defaultdict(list), defaultdict(list)
            for t in episodes:
                by_category[t.category].append(t.success)
                by_item[(t.category, t.item_id)].append(t.success)
            per_pass[name] = (by_category, by_item, [t.success for t in episodes])
        greedy_cats, _, greedy_all = per_pass["greedy"]
        sampled_cats, sampled_items, sampled_all = per_pass["sampled"]
        overall = rows[(env_id, "overall")]
        assert float(overall["greedy_avg_at_1"]) == pytest.approx(sum(greedy_all) / 12)
        assert float(overall["avg_at_n"]) == pytest.approx(sum(sampled_all) / 36)
        # Pass@3 from 3 samples: the share of items solved at least once
        assert float(overall["pass_at_n"]) == pytest.approx(sum(any(s) for s in sampled_items.values()) / 12)
        for category, successes in greedy_cats.items():
            row = rows[(env_id, category)]
            assert float(row["greedy_avg_at_1"]) == pytest.approx(sum(successes) / len(successes))
            assert float(row["avg_at_n"]) == pytest.approx(sum(sampled_cats[category]) / len(sampled_cats[category]))
            assert int(row["items"]) == len(successes)
        summary_row = next(line for line in table.splitlines() if line.startswith(f"| {env_id} |"))
        cells = [c.strip() for c in summary_row.strip("|").split("|")]
        assert cells[1:4] == ["12", str(results["max_turns"][env_id]), f"{100 * sum(greedy_all) / 12:.1f}"]
        assert cells[4] == f"{100 * sum(sampled_all) / 36:.1f}"
        accounts = [json.loads((tmp_path / "trajectories" / f"{env_id}.{name}.account.json").read_text())
                    for name in ("greedy", "sampled")]
        assert cells[-2] == f"{sum(a['seconds'] for a in accounts) / 60:.1f}"
        assert cells[-1] == f"{max(a['peak_rss_gb'] for a in accounts):.2f}" and float(cells[-1]) > 0.05
    assert results["max_turns"] == {"babyai": 6, "textcraft": 8}
    assert (tmp_path / "turns.png").stat().st_size > 1000 and (tmp_path / "pass_at_k.png").stat().st_size > 1000


def test_the_peak_memory_of_a_pass_counts_from_its_start():
    """VmHWM set back at a pass's start: 300 MB held and freed before it do not count, 300 MB
    touched during it do."""
    from agentgym_rl.eval.suite import _peak_rss_gb, _reset_peak_rss

    before = bytearray(300_000_000)
    del before
    _reset_peak_rss()
    quiet = _peak_rss_gb()
    during = bytearray(300_000_000)
    busy = _peak_rss_gb()
    del during
    assert quiet is not None and busy - quiet > 0.29


def test_each_pass_says_how_it_went_as_it_ends(tmp_path):
    result = run("bench-agent", "random", "--envs", "babyai,web_nowhere", "--episodes", "2", "--samples", "0",
                 "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown environment 'web_nowhere'" in result.stderr  # refused before any work
    result = run("bench-agent", "random", "--envs", "babyai", "--episodes", "2", "--samples", "0",
                 "suite.max_turns.babyai=3", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("babyai greedy: success "))
    assert line.endswith(" s)") and "over 2 episodes" in line
    assert "# bench-agent: random" in result.stdout  # then the table


def test_a_rerun_plays_only_what_is_missing(tmp_path):
    config = suite_config(envs=["babyai"], episodes=6, samples=2, max_turns={"babyai": 5})
    run_suite("random", config, tmp_path, show_progress=False)
    path = tmp_path / "trajectories" / "babyai.sampled.jsonl"
    lines = path.read_text().splitlines()
    kept = lines[:-3]  # the last item loses both episodes, the one before it one
    path.write_text("\n".join(kept) + "\n" + lines[-3][: len(lines[-3]) // 2])  # and a line cut off
    assert len(read_finished(path, 2)) == 4
    assert run_suite("random", config, tmp_path, show_progress=False) == {}
    results = json.loads((tmp_path / "results.json").read_text())
    played = path.read_text().splitlines()
    assert played[:len(kept) - 1] == kept[:-1]  # the 4 finished items were kept as they were
    assert len(played) == 12 and results["envs"]["babyai"]["sampled"]["episodes"] == 6
    greedy = (tmp_path / "trajectories" / "babyai.greedy.jsonl").read_text()
    run_suite("random", config, tmp_path, show_progress=False)
    assert (tmp_path / "trajectories" / "babyai.greedy.jsonl").read_text() == greedy
    other = run("bench-agent", "random", "--envs", "babyai", "--episodes", "3", "--out", str(tmp_path))
    assert other.returncode == 2 and "holds a benchmark of other settings" in other.stderr


def test_a_served_model_scores_what_the_in_process_model_scores(model_dir, tmp_path, monkeypatch):
    model, tokenizer = load_model_and_tokenizer(model_dir)
    monkeypatch.setenv("OPENAI_API_KEY", "secret")
    settings = ["--envs", "babyai,textcraft", "--episodes", "4", "--samples", "0", "suite.max_turns.babyai=3",
                "suite.max_turns.textcraft=3", "rollout.max_new_tokens=8"]
    local = run("bench-agent", str(model_dir), *settings, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    with serving_app(create_model_app(model.eval(), tokenizer, "tiny", token="secret")) as url:
        served = run("bench-agent", str(model_dir), *settings, "--url", f"{url}/v1", "--out", str(tmp_path / "served"))
    assert served.returncode == 0, served.stderr
    for env_id in ("babyai", "textcraft"):
        mine = load_trajectories(tmp_path / "local" / "trajectories" / f"{env_id}.greedy.jsonl")
        theirs = load_trajectories(tmp_path / "served" / "trajectories" / f"{env_id}.greedy.jsonl")
        assert [t.input_ids for t in theirs] == [t.input_ids for t in mine] and len(mine) == 4
    numbers = [json.loads((tmp_path / name / "results.json").read_text())["envs"] for name in ("local", "served")]
    for env_id in ("babyai", "textcraft"):
        assert numbers[0][env_id]["greedy"]["success"] == numbers[1][env_id]["greedy"]["success"]
        assert numbers[1][env_id]["greedy"]["api_completion_tokens"] == numbers[0][env_id]["greedy"]["generated_tokens"]
    assert "API tokens (as the server reported them): babyai" in (tmp_path / "served" / "table.md").read_text()


def test_episodes_whose_prompt_leaves_no_room_for_a_reply_are_named_not_just_scored_zero(model_dir):
    from agentgym_rl.config import RolloutConfig

    said: list[str] = []
    summary, episodes = evaluate("babyai", str(model_dir), episodes=2, max_turns=3, progress=False, log=said.append,
                                 rollout=RolloutConfig(max_new_tokens=8, max_context=40))
    assert summary.summary.success == 0 and all(t.turns == 0 for t in episodes)
    longest = max(len(t.input_ids) for t in episodes)
    assert longest + 8 > 40  # the prompt alone is longer than the context leaves for it
    assert said == [f"warning: 2 of 2 episodes ended before their first reply: the opening prompt (up to {longest} "
                    "tokens) and a 8-token reply do not fit rollout.max_context=40"]
    evaluate("babyai", str(model_dir), episodes=2, max_turns=3, progress=False, log=said.append,
             rollout=RolloutConfig(max_new_tokens=8))
    assert len(said) == 1  # nothing to say when the episodes were played


def test_sampled_episodes_repeat_with_the_same_seed(model_dir, tmp_path):
    config = suite_config(envs=["babyai"], episodes=3, samples=2, greedy=False, max_turns={"babyai": 3})
    played = []
    for name in ("a", "b"):
        run_suite(str(model_dir), config, tmp_path / name, show_progress=False)
        played.append([t.input_ids for t in load_trajectories(tmp_path / name / "trajectories" /
                                                               "babyai.sampled.jsonl")])
    assert played[0] == played[1] and len({tuple(ids) for ids in played[0]}) > 1


def test_an_environment_that_cannot_be_played_is_reported_and_the_others_run(tmp_path):
    result = run("bench-agent", "random", "--envs", "search,babyai", "--episodes", "2", "--samples", "0",
                 "--out", str(tmp_path))
    assert result.returncode == 1
    assert "| search | not run: environment 'search' cannot list its actions" in result.stdout
    assert "| babyai | 2 |" in result.stdout and "not run: search" in result.stderr


def test_user_mistakes_are_one_line_errors(tmp_path):
    for args, message in [(["--envs", "nope"], "unknown environment 'nope'"),
                          (["--samples", "-1"], "suite.samples"),
                          (["--samples", "0", "--no-greedy"], "nothing to play"),
                          (["suite.max_turns.babyia=5"], "suite.max_turns names unknown environment 'babyia'")]:
        result = run("bench-agent", "random", *args, "--out", str(tmp_path / "x"))
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_benchmarked_run_shows_its_table_and_plots_in_its_report(tmp_path):
    train = run("train", "configs/babyai_grpo.yaml", *TINY_RUN, "env.kwargs={list_actions: true}",
                f"run.output_dir={tmp_path}", "run.name=r")
    assert train.returncode == 0, train.stderr[-2000:]
    bench = run("bench-agent", str(tmp_path / "r"), "--episodes", "2", "--samples", "2", "suite.max_turns.babyai=3")
    assert bench.returncode == 0, bench.stderr
    assert set(json.loads((tmp_path / "r" / "bench" / "results.json").read_text())["envs"]) == {"babyai"}  # its own
    assert (tmp_path / "r" / "bench" / "pass_at_k.png").is_file()
    page = (tmp_path / "r" / "report" / "index.html").read_text()
    assert "Benchmark (test splits)" in page and page.count("data:image/png;base64") == 3
    assert "href='../bench/turns.png'" in page
    # the run's own settings were used: its env kwargs and its reply length
    config = json.loads((tmp_path / "r" / "bench" / "results.json").read_text())["config"]
    assert config["rollout"]["max_new_tokens"] == 8
    trained = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["env"]["kwargs"]
    assert trained and config["suite"]["env_kwargs"] == {"babyai": trained}


ENVS = ("babyai", "mcp", "sciworld", "search", "textcraft", "web")
"""Every registered environment (a test's own, registered in this process, are not in a new one)."""


@pytest.mark.slow
def test_the_tiny_model_over_every_registered_environment(model_dir, tmp_path):
    """The whole command as a user runs it, every environment (the browser and the JVM included)."""
    result = run_process("bench-agent", str(model_dir), "--envs", "all", "--episodes", "1", "--samples", "2",
                         "--out", str(tmp_path), "rollout.max_new_tokens=8",
                         *(f"suite.max_turns.{env_id}=4" for env_id in ENVS))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["envs"]) == set(ENVS)
    for env_id, result_ in results["envs"].items():
        assert "error" not in result_, (env_id, result_)
        assert result_["greedy"]["episodes"] == 1 and result_["sampled"]["samples"] == 2
        assert len(result_["sampled"]["pass_at_k_curve"]) == 2
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert {r["env"] for r in rows} == set(results["envs"])
    assert all((tmp_path / name).stat().st_size > 1000 for name in ("turns.png", "pass_at_k.png"))


def test_the_zero_shot_script_plays_every_reply_mode(model_dir, tmp_path):
    """scripts/zero-shot.sh on one BabyAI item with the tiny model: bench-agent's table for free
    and prefixed replies, eval's summary for replies restricted to listed actions, each in its
    documented place; the prefixed pass did continue every reply from "Action:"."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "zero-shot.sh"
    env = {**os.environ, "PYTHON": sys.executable, "SITE": str(tmp_path / "no-site"), "MODEL": str(model_dir),
           "ENVS": "babyai", "EPISODES": "1", "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(script), "rollout.max_new_tokens=6"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for mode in ("free", "prefixed"):
        table = (tmp_path / "out" / mode / "babyai" / "table.md").read_text()
        assert "| babyai | 1 | 20 |" in table, table
        assert f"== {mode}: " in done.stdout
    [prefixed] = load_trajectories(tmp_path / "out" / "prefixed" / "babyai" / "trajectories" / "babyai.greedy.jsonl")
    assert all(m["content"].startswith("Action:") for m in prefixed.messages if m["role"] == "assistant")
    listed = json.loads((tmp_path / "out" / "listed" / "babyai.json").read_text())
    assert listed["episodes"] == 1 and "== listed: " in done.stdout
