"""The web viewer (`agentgym-rl view`) and the run report, over a real run folder made by a short
BabyAI training run through the CLI: the API by hand, then the pages in headless Chromium."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from test_env_e2e import TINY_RUN
from test_cli import cli
from test_server import serving, serving_app

from agentgym_rl.agent.loading import load_tokenizer
from agentgym_rl.config import RLConfig, load_config, load_yaml
from agentgym_rl.train.rl import RLTrainer
from agentgym_rl.ui.app import create_app
from agentgym_rl.ui.index import SUMMARY_FIELDS, TrajectoryIndex, _summary_parts, summarize_line
from agentgym_rl.ui.tokens import TokenViews

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts" / "ui"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """runs/run: 2 GRPO steps on BabyAI with a validation before and after (the trainer
    `agentgym-rl train` runs, in this process), then a broken line in the middle of a
    trajectory file and a cut-off one at the end of another."""
    runs = tmp_path_factory.mktemp("runs")
    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        *[o for o in TINY_RUN if not o.startswith(("train.steps", "eval.", "env.kwargs"))],
        "env.kwargs={list_actions: true}", "train.steps=2", "train.validate_every=2", "eval.episodes=3",
        "eval.max_turns=3", f"run.output_dir={runs}", "run.name=run"])
    RLTrainer(config, log=lambda message: None).fit()  # what `agentgym-rl train` runs
    first = runs / "run" / "trajectories" / "step_000001.jsonl"
    lines = first.read_text().splitlines()
    first.write_text("\n".join([*lines[:2], "{not json", *lines[2:]]) + "\n")
    second = runs / "run" / "trajectories" / "step_000002.jsonl"
    second.write_text(second.read_text() + '{"env_id": "babyai", "item_id": "babyai_9", "mess')
    return runs


@pytest.fixture(scope="module")
def client(runs_dir):
    return TestClient(create_app(runs_dir, allowed_hosts=["testserver"]))


# ------------------------------------------------------------------ the index, by hand


def test_index_reads_a_growing_file_and_marks_broken_lines(tmp_path):
    path = tmp_path / "step_000001.jsonl"
    good = json.dumps({"env_id": "e", "item_id": "e_1", "category": "c", "success": True, "turn_rewards": [0, 1]})
    path.write_text(good + "\n[1, 2]\n\n" + good[:20])
    index = TrajectoryIndex()
    rows = index.summaries(path)
    assert rows[0] == {"env_id": "e", "item_id": "e_1", "category": "c", "success": True, "reward": None,
                       "turns": 2, "invalid_actions": None, "error": None}
    assert rows[1] == {"malformed": "a JSON list, not an object"}
    assert rows[2] == {"malformed": "an empty line"}
    assert rows[3]["malformed"].startswith("an unfinished last line")
    # The writer finishes its line and adds one: the new lines are read, the old ones kept.
    path.write_text(path.read_text() + good[20:] + "\n" + good + "\n")
    rows = index.summaries(path)
    assert len(rows) == 5 and rows[3]["item_id"] == "e_1" and rows[4]["success"] is True
    assert json.loads(index.line(path, 3)) == json.loads(good)
    # A file rewritten shorter (a resumed run truncates) is read afresh.
    path.write_text(good + "\n")
    assert len(index.summaries(path)) == 1


def test_the_fast_summary_of_a_trajectory_line_equals_parsing_it_whole(runs_dir):
    """Summaries read from a line's two ends (`_summary_parts`) are those of the whole record,
    on every line a real run wrote; a line laid out otherwise is parsed whole."""
    lines = [line for path in sorted((runs_dir / "run").glob("*/step_*.jsonl"))
             for line in path.read_bytes().splitlines()]
    records = [line for line in lines if line.startswith(b'{"env_id"') and line.endswith(b"}")]
    assert len(records) == 4 + 4 + 3 + 3
    for line in records:
        whole = {key: json.loads(line).get(key) for key in SUMMARY_FIELDS}
        assert _summary_parts(line) is not None and summarize_line(line) == whole
    reordered = json.dumps({"success": True, **{k: v for k, v in json.loads(records[0]).items() if k != "success"}})
    assert _summary_parts(reordered.encode()) is None and summarize_line(reordered.encode())["success"] is True


# ------------------------------------------------------------------ the API


def test_runs_and_their_metrics(client):
    runs = client.get("/api/runs").json()["runs"]
    assert [(r["name"], r["env"], r["kind"], r["steps"]) for r in runs] == [("run", "babyai", "grpo", 2)]
    run = client.get("/api/runs/run").json()
    assert sorted({row["step"] for row in run["metrics"]}) == [0, 1, 2] and run["problems"] == []
    assert run["config"]["train"]["steps"] == 2
    assert {(f["split"], f["step"]) for f in run["files"]} == {
        ("trajectories", 1), ("trajectories", 2), ("validation", 0), ("validation", 2)}


def test_filters_narrow_and_pages_partition_the_list(client, runs_dir):
    def get(**query):
        response = client.get("/api/runs/run/trajectories", params=query)
        assert response.status_code == 200, response.text
        return response.json()

    everything = get(limit=500)
    # 2 steps x 2 tasks x 2 samples, 3 validation episodes twice, one broken and one cut-off line.
    assert everything["total"] == 4 + 1 + 4 + 1 + 3 + 3
    assert get(split="validation")["total"] == 6
    assert get(split="trajectories", step=2)["total"] == 5
    malformed = get(success="malformed")["rows"]
    assert [(r["step"], r["line"]) for r in malformed] == [(1, 2), (2, 4)]
    assert "not JSON" in malformed[0]["malformed"] and "unfinished" in malformed[1]["malformed"]
    item = next(r["item_id"] for r in everything["rows"] if "item_id" in r)
    by_item = get(item=item)["rows"]
    assert by_item and all(r["item_id"] == item for r in by_item)
    assert get(item=item.rsplit("_", 1)[1])["rows"] == by_item
    wins, losses = get(success="true")["total"], get(success="false")["total"]
    assert wins + losses + 2 == everything["total"]
    pages = [get(offset=offset, limit=4)["rows"] for offset in range(0, everything["total"], 4)]
    assert [(r["split"], r["step"], r["line"]) for page in pages for r in page] == [
        (r["split"], r["step"], r["line"]) for r in everything["rows"]]
    assert client.get("/api/runs/run/trajectories", params={"success": "maybe"}).status_code == 422


def test_a_trajectory_comes_with_its_tokens_masks_and_logprobs(client, runs_dir):
    t = client.get("/api/runs/run/trajectory", params={"split": "trajectories", "step": 1, "line": 0}).json()
    tokens = t["tokens"]
    assert len(tokens["text"]) == len(t["input_ids"]) and tokens["mask"] == t["loss_mask"]
    tokenizer = load_tokenizer(runs_dir / "run" / "base_model")
    assert "".join(tokens["text"]) == tokenizer.decode(t["input_ids"])
    assert all((lp is not None) == bool(m) for lp, m in zip(tokens["logprob"], tokens["mask"]))
    assert all(lp <= 0 for lp in tokens["logprob"] if lp is not None)
    assert tokens["window_starts"] == []  # one context window (rollout.keep_turns not set)
    record = {**t, "window_starts": [3, "x", 5]}  # a cut episode's windows, one start not a number
    assert TokenViews().view(runs_dir / "run", record)["window_starts"] == [3, 5]
    broken = client.get("/api/runs/run/trajectory", params={"split": "trajectories", "step": 1, "line": 2}).json()
    assert broken == {"malformed": broken["malformed"], "raw": "{not json"}
    missing = client.get("/api/runs/run/trajectory", params={"split": "trajectories", "step": 1, "line": 99})
    assert missing.status_code == 404


def test_only_files_under_the_runs_folder_are_served(client, runs_dir, tmp_path):
    outside = tmp_path / "outside"
    (outside / "trajectories").mkdir(parents=True)
    (outside / "config.yaml").write_text("secret: 1\n")
    (outside / "trajectories" / "step_000001.jsonl").write_text('{"env_id": "secret"}\n')
    os.symlink(outside, runs_dir / "linked")
    try:
        for path in ["/api/runs/..", "/api/runs/%2e%2e", "/api/runs/..%2Foutside", "/api/runs/linked",
                     f"/api/runs/{outside}", "/api/runs/run%2F..%2F..", "/api/runs/linked/trajectories"]:
            response = client.get(path)
            assert response.status_code == 404, path
            assert "secret" not in response.text
        for split in ["../../outside/trajectories", "/etc", "config.yaml"]:
            response = client.get("/api/runs/run/trajectory", params={"split": split, "step": 1, "line": 0})
            assert response.status_code == 422 and "secret" not in response.text
        for path in ["/static/../index.py", "/static/%2e%2e/index.py", "/static/..%2Findex.py"]:
            assert client.get(path).status_code == 404, path
        assert [r["name"] for r in client.get("/api/runs").json()["runs"]] == ["run"]
    finally:
        (runs_dir / "linked").unlink()


def test_runs_in_sub_folders_are_listed_and_served(runs_dir, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(runs_dir / "run", runs / "compare" / "a")
    shutil.copytree(runs_dir / "run", runs / "compare" / "a" / "bench")  # inside a run: not a run of its own
    shutil.copytree(runs_dir / "run", runs / "d1" / "d2" / "d3" / "deep")  # deeper than the viewer looks
    os.symlink(runs_dir, runs / "linked")  # a folder of runs reached through a link: not followed
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"env_id": "SECRET", "item_id": "x"}\n')
    (runs / "compare" / "a" / "validation" / "step_000009.jsonl").symlink_to(secret)  # a file linking out
    client = TestClient(create_app(runs, allowed_hosts=["testserver"]))
    assert [r["name"] for r in client.get("/api/runs").json()["runs"]] == ["compare/a"]
    assert client.get("/api/runs/compare%2Fa").json()["config"]["train"]["steps"] == 2
    assert client.get("/api/runs/compare/a").json()["name"] == "compare/a"
    assert client.get("/api/runs/compare/a/trajectories", params={"split": "validation"}).json()["total"] == 6
    replayed = client.get("/api/runs/compare/a/trajectory", params={"split": "trajectories", "step": 1, "line": 0})
    assert replayed.status_code == 200 and replayed.json()["env_id"] == "babyai"
    # (".." and "." written as %2F-joined names: a client would resolve them in a plain path.)
    for name in ["compare", "compare/a/bench", "linked/run", "compare%2F..%2Fcompare%2Fa", "compare%2F%2Fa",
                 ".%2Fcompare%2Fa", "d1/d2/d3/deep"]:
        assert client.get(f"/api/runs/{name}").status_code == 404, name
    # The link rules hold inside a run in a sub-folder as in one at the top.
    assert 9 not in [f["step"] for f in client.get("/api/runs/compare/a").json()["files"]]
    linked = client.get("/api/runs/compare/a/trajectory", params={"split": "validation", "step": 9, "line": 0})
    assert linked.status_code == 404 and "SECRET" not in linked.text
    assert "SECRET" not in client.get("/api/runs/compare/a/trajectories", params={"limit": 500}).text


def test_playground_by_hand_and_by_the_runs_model(client):
    started = client.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_3"})
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["messages"][0]["content"].startswith("Your goal:") and body["image"]
    assert "turn left" in body["available_actions"]
    session = body["session"]
    stepped = client.post(f"/api/play/{session}/step", json={"action": "turn left"}).json()
    assert [m["role"] for m in stepped["messages"]] == ["user", "assistant", "user"]
    assert stepped["messages"][1]["content"] == "turn left" and stepped["image"] != body["image"]
    acted = client.post(f"/api/play/{session}/model", json={"run": "run"})
    assert acted.status_code == 200, acted.text
    assert len(acted.json()["messages"]) == 5
    assert client.post("/api/play", json={"env_id": "nope"}).status_code == 422
    assert client.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_x"}).status_code == 422
    assert client.post("/api/play/999/step", json={"action": "x"}).status_code == 404
    assert client.post(f"/api/play/{session}/model", json={"run": ".."}).status_code == 404
    assert len(client.get("/api/envs/babyai/tasks", params={"split": "test"}).json()["tasks"]) == 90


def test_the_runs_model_replies_from_the_runs_reply_prefix(runs_dir, tmp_path):
    """A run trained with `rollout.reply_prefix` plays in the playground as in its rollouts: the
    model continues from the prefix, and the reply the environment reads starts with it."""
    copied = tmp_path / "runs"
    shutil.copytree(runs_dir / "run", copied / "prefixed", symlinks=True)
    config = load_yaml(copied / "prefixed" / "config.yaml")
    config["rollout"]["reply_prefix"] = "Action:"
    (copied / "prefixed" / "config.yaml").write_text(yaml.safe_dump(config))
    with TestClient(create_app(copied, allowed_hosts=["testserver"])) as prefixed:
        session = prefixed.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_3"}).json()["session"]
        acted = prefixed.post(f"/api/play/{session}/model", json={"run": "prefixed"})
    assert acted.status_code == 200, acted.text
    assert acted.json()["messages"][1]["content"].startswith("Action:")


def test_the_runs_model_replies_end_at_the_runs_stop_strings(runs_dir, tmp_path):
    """The playground builds the run's model with its `rollout.stop_strings`: one that no token
    holds is refused by name, not played without."""
    copied = tmp_path / "runs"
    shutil.copytree(runs_dir / "run", copied / "stopping", symlinks=True)
    config = load_yaml(copied / "stopping" / "config.yaml")
    config["rollout"]["stop_strings"] = ["§"]
    (copied / "stopping" / "config.yaml").write_text(yaml.safe_dump(config))
    with TestClient(create_app(copied, allowed_hosts=["testserver"])) as stopping:
        session = stopping.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_3"}).json()["session"]
        acted = stopping.post(f"/api/play/{session}/model", json={"run": "stopping"})
    assert acted.status_code == 422, acted.text
    assert "no token of the tokenizer holds '§'" in acted.text


def test_the_playground_opens_on_an_environment_that_runs_as_installed(client):
    """The page selects the first listed environment: it must list its items; AppWorld, which
    needs the user's server and data, comes after every environment that does not."""
    envs = client.get("/api/envs").json()["envs"]
    needs = [bool(e["requires"]) for e in envs]
    assert needs == sorted(needs) and needs[-1] and not needs[0]
    first = client.get(f"/api/envs/{envs[0]['id']}/tasks", params={"split": "test"})
    assert first.status_code == 200 and first.json()["tasks"]


def test_playground_on_an_env_server_with_a_served_model(client, runs_dir):
    """The env runs behind `serve-env`, the model behind `serve-model` (OpenAI's chat API)."""
    from agentgym_rl.agent.loading import load_model_and_tokenizer
    from agentgym_rl.runs import latest_model
    from agentgym_rl.server.model_server import create_model_app

    model, tokenizer = load_model_and_tokenizer(latest_model(runs_dir / "run"))
    model_app = create_model_app(model.eval(), tokenizer, "tiny", None)
    with serving("babyai") as env_url, serving_app(model_app) as model_url:
        refused = client.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_3", "url": env_url})
        assert refused.status_code == 403 and "--allow-url" in refused.text  # this machine's servers too
        client = TestClient(create_app(runs_dir, allowed_hosts=["testserver"], allowed_urls=[env_url, model_url]))
        started = client.post("/api/play", json={"env_id": "babyai", "item_id": "babyai_3", "url": env_url})
        assert started.status_code == 200, started.text
        body = started.json()
        assert body["messages"][0]["content"].startswith("Your goal:") and "turn left" in body["available_actions"]
        session = body["session"]
        stepped = client.post(f"/api/play/{session}/step", json={"action": "turn left"}).json()
        assert stepped["messages"][-1]["content"].startswith(("Your goal:", "You"))
        acted = client.post(f"/api/play/{session}/model", json={"endpoint": f"{model_url}/v1", "model": "tiny"})
        assert acted.status_code == 200, acted.text
        assert len(acted.json()["messages"]) == 5
    down = client.post("/api/play", json={"env_id": "babyai", "url": env_url})
    assert down.status_code == 422 and env_url in down.json()["detail"]
    assert client.post(f"/api/play/{session}/model", json={"endpoint": "ftp://x"}).status_code == 422
    assert client.post(f"/api/play/{session}/model", json={}).status_code == 422


def test_playground_shows_the_web_envs_screenshot(client):
    item = client.get("/api/envs/web/tasks", params={"split": "test"}).json()["tasks"][0]["item_id"]
    started = client.post("/api/play", json={"env_id": "web", "item_id": item, "kwargs": {"screenshot": True}})
    assert started.status_code == 200, started.text
    session = started.json()["session"]
    try:
        stepped = client.post(f"/api/play/{session}/step", json={"action": "scroll [down]"}).json()
        assert stepped["image"] is None
        assert base64.b64decode(stepped["screenshot"]).startswith(b"\x89PNG")
    finally:
        client.delete(f"/api/play/{session}")


def test_report_is_one_page_with_the_plot_and_the_category_table(runs_dir, capsys, monkeypatch):
    code, out, err = cli("report", str(runs_dir / "run"))
    assert code == 0, err
    page = (runs_dir / "run" / "report" / "index.html").read_text()
    assert "data:image/png;base64," in page and "<th>step 0</th><th>step 2</th>" in page
    assert re.search(r"<td>all</td><td>[\d.]+% of 3</td>", page)
    code, _, err = cli("report", str(runs_dir / "nothing"))
    assert code == 2 and "not a run folder" in err
    code, _, err = cli("view", str(runs_dir / "nothing"))
    assert code == 2 and "no runs folder" in err


# ------------------------------------------------------------------ in a real browser


@pytest.fixture(scope="module")
def page(runs_dir):
    """A headless Chromium page on the viewer of `runs_dir`; screenshots go to test-artifacts/ui/."""
    from playwright.sync_api import sync_playwright

    from agentgym_rl.envs.web.browser import LAUNCH_ARGS, find_chromium

    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    app = create_app(runs_dir)
    slow_reply_sent = threading.Event()

    @app.middleware("http")
    async def answer_the_unfiltered_split_late(request, call_next):
        # Choosing a split and then a step sends two requests; the first is held back so
        # that its reply arrives last, as it can on a busy server.
        query = request.query_params
        held = request.url.path.endswith("/trajectories") and query.get("split") == "trajectories" \
            and "step" not in query
        if held:
            await asyncio.sleep(1.0)
        response = await call_next(request)
        if held:
            slow_reply_sent.set()
        return response

    with serving_app(app) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.base_url = url
        page.slow_reply_sent = slow_reply_sent
        yield page
        browser.close()


def test_pages_load_filter_replay_and_play_in_chromium(page, runs_dir):
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(page.base_url + "/")
    rows = page.locator("[data-testid=run-table] tbody tr")
    rows.first.wait_for()
    assert rows.count() == 1 and "babyai" in rows.first.inner_text()
    page.locator("[data-testid=plot] path").first.wait_for(state="attached")  # a flat line has no height
    page.screenshot(path=ARTIFACTS / "runs.png")

    page.click("nav button[data-tab=trajectories]")
    count = page.locator("[data-testid=t-count]")
    page.wait_for_function("document.querySelector('[data-testid=t-count]').textContent.startsWith('16 ')")
    page.select_option("[data-testid=t-success]", "malformed")
    page.wait_for_function("document.querySelector('[data-testid=t-count]').textContent.startsWith('2 ')")
    assert "malformed line" in page.locator("[data-testid=t-table] tbody").inner_text()
    page.select_option("[data-testid=t-success]", "")
    page.select_option("#t-split", "trajectories")
    page.select_option("#t-step", "1")
    page.wait_for_function("document.querySelector('[data-testid=t-count]').textContent.startsWith('5 ')")
    assert page.slow_reply_sent.wait(timeout=30)
    page.wait_for_timeout(300)  # time for the late reply to reach the page
    assert count.inner_text().startswith("5 ")  # the late reply to the earlier filter was dropped

    page.locator("[data-testid=t-table] tbody tr").first.click()
    turns = page.locator("[data-testid=pane-a] [data-testid=turns] > li")
    turns.first.wait_for()
    record = json.loads((runs_dir / "run" / "trajectories" / "step_000001.jsonl").read_text().splitlines()[0])
    observations = [m["content"] for m in record["messages"] if m["role"] == "user"]
    assert turns.count() == len(observations) == record["turns"] + 1
    assert turns.nth(1).locator("pre").inner_text() == observations[1]
    masked = page.locator("[data-testid=pane-a] .tok.masked")
    assert masked.count() > 0 and page.locator("[data-testid=pane-a] .tok").count() > masked.count()
    assert "logprob=" in masked.first.get_attribute("title")
    assert "Action:" in page.locator("[data-testid=pane-a] .action").first.inner_text()
    page.locator("[data-testid=t-table] tbody tr").nth(1).click(modifiers=["Shift"])
    page.locator("[data-testid=pane-b] [data-testid=turns] > li").first.wait_for()
    page.screenshot(path=ARTIFACTS / "trajectories.png", full_page=True)

    page.click("nav button[data-tab=playground]")
    page.locator("[data-testid=p-item] option").first.wait_for(state="attached")
    page.click("[data-testid=p-start]")
    page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent.includes('turn 0')")
    assert page.locator("[data-testid=p-image]").get_attribute("src").startswith("data:image/png;base64,")
    page.locator("[data-testid=p-actions] button", has_text="turn left").click()
    page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent.includes('turn 1')")
    page.click("[data-testid=p-model]")
    page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent.includes('turn 2')")
    assert page.locator("[data-testid=p-log] .msg.assistant").count() == 2
    page.screenshot(path=ARTIFACTS / "playground.png", full_page=True)
    assert errors == []


def test_the_plot_fills_the_page_with_labelled_axes_and_the_ticked_runs_curves(page, runs_dir, tmp_path):
    """Two runs: `a` (the module's run) and `group/b`, newer, with a metric only it logs, 40
    points long (so that smoothing draws a trend over them)."""
    runs = tmp_path / "runs"
    shutil.copytree(runs_dir / "run", runs / "a")
    b = runs / "group" / "b"
    shutil.copytree(runs_dir / "run", b)
    with (b / "metrics.jsonl").open("a") as metrics:
        for step in range(3, 43):
            metrics.write(json.dumps({"step": step, "custom/only_in_b": step % 7}) + "\n")
    os.utime(b / "config.yaml", (os.path.getmtime(runs / "a" / "config.yaml") + 10,) * 2)  # b is the newest
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    with serving_app(create_app(runs)) as url:
        page.goto(url + "/")
        rows = page.locator("[data-testid=run-table] tbody tr")
        rows.nth(1).wait_for()
        assert [rows.nth(i).locator("td").nth(1).inner_text() for i in range(2)] == ["group/b", "a"]
        page.locator("[data-testid=plot] path").first.wait_for(state="attached")
        plot = page.locator("[data-testid=plot] svg")
        assert plot.bounding_box()["width"] > 0.9 * page.viewport_size["width"] - 40  # the page's width
        assert page.locator("[data-testid=plot] svg text.label").all_text_contents() == ["step", "train/success"]
        assert page.locator("[data-testid=plot] svg line.grid").count() >= 4
        y_ticks = page.locator("[data-testid=plot] svg text.tick.y").all_text_contents()
        assert (y_ticks[0], y_ticks[-1]) == ("0", "1")  # a rate spans 0-1
        assert page.locator("[data-testid=plot] svg text.tick.x").all_text_contents() == ["1", "2"]  # whole steps

        def curves() -> list[str]:
            return page.locator("[data-testid=metric] option").all_inner_texts()

        assert "custom/only_in_b" in curves()  # b, the newest, is ticked
        page.locator("input[data-run='group/b']").uncheck()
        page.locator("input[data-run='a']").check()
        page.wait_for_function("![...document.querySelectorAll('#metric option')].some(o => o.value === 'custom/only_in_b')")
        page.locator("input[data-run='group/b']").check()  # the list is the union of the ticked runs'
        page.wait_for_function("[...document.querySelectorAll('#metric option')].some(o => o.value === 'custom/only_in_b')")
        assert page.locator("[data-testid=legend]").inner_text().count("points") == 2

        page.select_option("[data-testid=metric]", "custom/only_in_b")
        page.wait_for_function("document.querySelectorAll('#plot path[data-series^=\"group/b\"]').length === 2")
        assert page.locator("#plot path[data-series='group/b (mean of 4)']").count() == 1  # the trend
        page.locator("[data-testid=smooth]").uncheck()
        page.wait_for_function("document.querySelectorAll('#plot path[data-series^=\"group/b\"]').length === 1")
        page.screenshot(path=ARTIFACTS / "two_runs.png")

        # The playground says when a run's model would act in an environment it was not trained on.
        page.click("nav button[data-tab=playground]")
        page.locator("[data-testid=p-env] option").first.wait_for(state="attached")
        page.select_option("[data-testid=p-run]", "a")
        page.select_option("[data-testid=p-env]", "textcraft")
        assert "trained on babyai, not textcraft" in page.locator("[data-testid=p-warning]").inner_text()
        page.select_option("[data-testid=p-env]", "babyai")
        assert page.locator("[data-testid=p-warning]").inner_text() == ""

        # SciWorld lists thousands of actions: the action box suggests them; no button each.
        page.select_option("[data-testid=p-env]", "sciworld")
        page.wait_for_function("document.querySelector('#p-item option')?.value.startsWith('sciworld_')")
        page.click("[data-testid=p-start]")
        page.wait_for_function("document.querySelector('[data-testid=p-status]').textContent.includes('turn 0')")
        assert "actions available: type in the box" in page.locator("[data-testid=p-actions]").inner_text()
        assert page.locator("[data-testid=p-actions] button").count() == 0
        suggestions = "[data-testid=p-suggestions] option"
        assert page.locator(suggestions).count() > 40
        assert page.locator(f"{suggestions}[value='look around']").count() == 1
    assert errors == []
