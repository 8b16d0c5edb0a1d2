"""An LLM judge as the reward (`env.judge`, `rollout/judge.py`), against a stand-in judge served
on loopback: its score is the reward, in eval and in a GRPO step (which equals the step with the
same scores from a Python function), cached by transcript, and a failing judge fails the
episodes it judged, as data."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from reward_fns import judge_score
from test_cli import run
from test_server import serving_app
from test_train_e2e import toy_config

from agentgym_rl.rollout.judge import parse_score


def judge_app(mode: str = "score") -> tuple[FastAPI, list]:
    """A chat endpoint that grades by the transcript's length (`reward_fns.judge_score`), or
    fails (`mode` "down": HTTP 500, "vague": no score)."""
    app, asked = FastAPI(), []

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        asked.append(body)
        if mode == "down":
            return JSONResponse({"error": "overloaded"}, status_code=500)
        text = body["messages"][-1]["content"]
        reply = "It went fine." if mode == "vague" else f"Reasons...\nScore: {judge_score(text):g}"
        return {"choices": [{"message": {"role": "assistant", "content": reply}}]}

    return app, asked


def test_the_score_is_the_last_score_line_between_0_and_1():
    assert parse_score("Score: 0.2 at first... then\nscore = .75") == 0.75
    assert parse_score("SCORE: 1") == 1.0
    for reply, said in (("no number here", "no 'Score: X'"), ("Score: 7", "not between 0 and 1")):
        with pytest.raises(ValueError, match=said):
            parse_score(reply)


def test_eval_takes_the_judges_score_and_asks_only_once_per_episode(tmp_path):
    app, asked = judge_app()
    out, cache, episodes = tmp_path / "eval.json", tmp_path / "judge.jsonl", tmp_path / "episodes.jsonl"
    with serving_app(app) as url:
        command = ["eval", "--env", "babyai", "--policy", "expert", "--episodes", "3", "--json", str(out),
                   "--trajectories", str(episodes), f"env.judge.url={url}/v1", f"env.judge.cache={cache}"]
        assert run(*command).returncode == 0
        assert len(asked) == 3 and asked[0]["temperature"] == 0.0
        assert "A good episode" in asked[0]["messages"][0]["content"]
        judged = [judge_score(body["messages"][-1]["content"]) for body in asked]
        played = [json.loads(line) for line in episodes.read_text().splitlines()]
        assert sorted(sum(e["turn_rewards"]) for e in played) == pytest.approx(sorted(judged))
        assert json.loads(out.read_text())["avg_reward"] == pytest.approx(sum(judged) / 3)
        assert run(*command).returncode == 0 and len(asked) == 3  # every answer came from the cache
        assert run(*command, "env.judge.rubric=Be strict.").returncode == 0 and len(asked) == 6  # same cache file


@pytest.mark.parametrize("mode, said", [("down", "attempts: HTTP 500"), ("vague", "no 'Score: X'")])
def test_a_failing_judge_fails_the_episodes_it_judged(tmp_path, mode, said):
    app, _ = judge_app(mode)
    out, episodes = tmp_path / "eval.json", tmp_path / "episodes.jsonl"
    with serving_app(app) as url:
        result = run("eval", "--env", "babyai", "--policy", "expert", "--episodes", "2", "--json", str(out),
                     "--trajectories", str(episodes), f"env.judge.url={url}/v1")
    assert result.returncode == 0 and json.loads(out.read_text())["errors"] == 2
    assert all(said in json.loads(line)["error"] for line in episodes.read_text().splitlines())


def test_a_grpo_step_with_the_judge_is_the_step_with_its_scores_from_a_function(tmp_path, counter_env_registered):
    """The judge's scores and a Python function giving the same scores make the same step: its
    reward, advantages, loss and gradient."""
    from agentgym_rl.train.rl import RLTrainer

    def step(name, *extra):
        config = toy_config(tmp_path, "train.steps=1", "train.validate_every=0", "algo.kl_coef=0", *extra,
                            name=name)
        RLTrainer(config, log=lambda _: None).fit()
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return next(row for row in rows if "train/reward" in row)

    app, asked = judge_app()
    with serving_app(app) as url:
        judged = step("judged", f"env.judge.url={url}/v1")
    by_function = step("function", "env.reward=reward_fns:transcript_score")
    assert len(asked) == 6 and judged["update/trajectories"] > 0  # 2 tasks x 3 samples
    for key in ("train/reward", "adv/adv_abs_mean", "update/loss", "update/grad_norm"):
        assert judged[key] == pytest.approx(by_function[key], abs=1e-6), key
