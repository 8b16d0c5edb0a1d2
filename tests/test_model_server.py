"""`serve-model` (OpenAI's API over a model folder) and the `OpenAIGenerator` that samples
through it: ids and logprobs equal the in-process generator's, an evaluation through the server
equals the in-process one, and errors, timeouts and bad requests are reported, not hung on."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
import torch
from conftest import CORPUS
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from test_server import free_port, serving_app, wait_until_healthy

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.openai_generator import GeneratorError, OpenAIGenerator
from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny
from agentgym_rl.config import RolloutConfig
from agentgym_rl.errors import UserError
from agentgym_rl.eval.evaluate import evaluate, make_policy
from agentgym_rl.server.model_server import create_model_app

TINY = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(CORPUS * 3, tmp_path_factory.mktemp("served") / "model", TINY)


@pytest.fixture(scope="module")
def loaded(model_dir):
    model, tokenizer = load_model_and_tokenizer(model_dir)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def server(loaded):
    model, tokenizer = loaded
    with serving_app(create_model_app(model, tokenizer, "tiny", token="secret")) as url:
        yield url


def prompts(tokenizer) -> list[list[int]]:
    encoder = ChatEncoder(tokenizer)
    return [encoder.start([{"role": "user", "content": text}]) for text in
            ("Your goal: go to the red ball.", "Counter value is 3.", "Available actions: look, count")]


def test_served_ids_and_logprobs_equal_the_in_process_generator(server, loaded):
    model, tokenizer = loaded
    stop = [ChatEncoder(tokenizer).end_of_turn_id]
    batch = prompts(tokenizer)
    torch.manual_seed(0)
    local = HFGenerator(model, tokenizer.pad_token_id, stop, temperature=0.0, reuse_cache=False).generate(batch, 12)
    remote = OpenAIGenerator(f"{server}/v1", "tiny", stop, temperature=0.0, api_key="secret", batch_size=2)
    served = remote.generate(batch, 12)  # two requests: 2 prompts, then 1
    assert [g.ids for g in served] == [g.ids for g in local]
    assert [g.finished for g in served] == [g.finished for g in local]
    for mine, theirs in zip(served, local):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    assert remote.client.prompt_tokens == sum(map(len, batch))
    assert remote.client.completion_tokens == sum(len(g.ids) for g in local)


def test_sampling_through_the_server_keeps_each_tokens_logprob(server, loaded):
    model, tokenizer = loaded
    remote = OpenAIGenerator(f"{server}/v1", "tiny", [ChatEncoder(tokenizer).end_of_turn_id], temperature=1.0,
                             api_key="secret")
    [generation] = remote.generate(prompts(tokenizer)[:1], 10)
    # Rescoring the sampled ids with the model gives back the logprobs the server reported.
    prompt = prompts(tokenizer)[0]
    ids = torch.tensor([prompt + generation.ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
    rescored = logits.gather(-1, torch.tensor(generation.ids)[:, None])[:, 0]
    assert rescored.tolist() == pytest.approx(generation.logprobs, abs=1e-4)


def test_chat_completions_and_the_api_contract(server, loaded):
    model, tokenizer = loaded
    headers = {"Authorization": "Bearer secret"}
    reply = httpx.post(f"{server}/v1/chat/completions", headers=headers, json={
        "messages": [{"role": "user", "content": "Your goal: go to the red ball."}], "max_tokens": 12,
        "temperature": 0}).json()
    [local] = HFGenerator(model, tokenizer.pad_token_id, [ChatEncoder(tokenizer).end_of_turn_id], 0.0,
                          reuse_cache=False).generate(prompts(tokenizer)[:1], 12)
    assert reply["choices"][0]["message"]["content"] == ChatEncoder(tokenizer).decode_reply(local.ids)
    assert reply["usage"]["completion_tokens"] == len(local.ids)
    assert httpx.get(f"{server}/v1/models", headers=headers).json()["data"][0]["id"] == "tiny"
    assert httpx.get(f"{server}/v1/models").status_code == 401  # no token
    bad = httpx.post(f"{server}/v1/completions", headers=headers, json={"prompt": [[1, 2]], "max_tokens": 0})
    assert bad.status_code == 422 and "max_tokens" in bad.text
    outside = httpx.post(f"{server}/v1/completions", headers=headers, json={"prompt": [[10 ** 6]]})
    assert outside.status_code == 422 and "outside" in outside.text
    other = httpx.post(f"{server}/v1/completions", headers=headers, json={"prompt": [[1]], "model": "gpt-9"})
    assert other.status_code == 404 and "serves 'tiny'" in other.text


def test_an_eval_through_the_server_equals_the_in_process_eval(server, model_dir, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "secret")
    settings = dict(split="test", episodes=6, max_turns=3, temperature=0.0, progress=False)
    local, local_runs = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=16), **settings)
    served, served_runs = evaluate("babyai", str(model_dir), **settings,
                                   rollout=RolloutConfig(max_new_tokens=16, generator_url=f"{server}/v1"))
    assert [t.messages for t in served_runs] == [t.messages for t in local_runs]
    assert [t.input_ids for t in served_runs] == [t.input_ids for t in local_runs]
    assert served.summary.success == local.summary.success
    with pytest.raises(UserError, match="generator_url http://127.0.0.1:1/v1: GET /models failed"):
        evaluate("babyai", str(model_dir), **settings, rollout=RolloutConfig(generator_url="http://127.0.0.1:1/v1"))


def test_a_chat_api_policy_replies_as_the_model_does(server, model_dir, monkeypatch):
    """`--policy api:MODEL`: the conversation goes to /chat/completions as messages. On the first
    turn the served prompt is the chat template of those messages, the in-process token prompt
    too, so greedy replies agree."""
    monkeypatch.setenv("OPENAI_API_KEY", "secret")
    settings = dict(split="test", episodes=6, max_turns=1, temperature=0.0, progress=False)
    local, local_runs = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=16), **settings)
    api, api_runs = evaluate("babyai", "api:tiny", rollout=RolloutConfig(max_new_tokens=16, generator_url=f"{server}/v1"),
                             **settings)
    assert [t.messages for t in api_runs] == [t.messages for t in local_runs]
    assert api.policy == "api:tiny" and all(not t.input_ids for t in api_runs)  # text: no token ids


def failing_app(calls: list, status: int = 500, delay: float = 0.0) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions():
        calls.append(1)
        await asyncio.sleep(delay)
        return JSONResponse({"error": {"message": "the GPU caught fire"}}, status_code=status)

    return app


def test_server_errors_are_retried_then_reported():
    calls: list = []
    with serving_app(failing_app(calls, 503)) as url:
        generator = OpenAIGenerator(f"{url}/v1", "m", [0], retries=2)
        with pytest.raises(GeneratorError, match="failed after 3 attempts: HTTP 503.*caught fire"):
            generator.generate([[1, 2]], 4)
    assert len(calls) == 3


def test_a_refused_request_is_not_retried():
    calls: list = []
    with serving_app(failing_app(calls, 400)) as url:
        with pytest.raises(GeneratorError, match="refused the request: HTTP 400"):
            OpenAIGenerator(f"{url}/v1", "m", [0]).generate([[1, 2]], 4)
    assert len(calls) == 1


def test_a_slow_server_times_out():
    calls: list = []
    with serving_app(failing_app(calls, 200, delay=3.0)) as url:
        with pytest.raises(GeneratorError, match="ReadTimeout"):
            OpenAIGenerator(f"{url}/v1", "m", [0], timeout=0.3, retries=1).generate([[1, 2]], 4)
    assert len(calls) == 2


def test_an_api_policy_keeps_to_its_concurrency_and_retries():
    """rollout.generator_concurrency and generator_retries reach the client: of 6 replies, never
    more than 2 requests in flight; the first request meets a 503 and is retried once."""
    app, seen = FastAPI(), {"now": 0, "most": 0, "calls": 0}

    @app.post("/v1/chat/completions")
    async def chat():
        seen["calls"] += 1
        if seen["calls"] == 1:
            return JSONResponse({"error": {"message": "busy"}}, status_code=503)
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        await asyncio.sleep(0.15)
        seen["now"] -= 1
        return {"choices": [{"message": {"content": "Action: look"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2}}

    conversations = [[{"role": "user", "content": "hi"}]] * 6
    with serving_app(app) as url:
        for retries, concurrency in ((1, 2), (0, 4)):
            seen["calls"] = 0
            rollout = RolloutConfig(generator_url=f"{url}/v1", generator_retries=retries,
                                    generator_concurrency=concurrency)
            policy = make_policy("babyai", "api:m", 0.0, 0, rollout=rollout)
            if retries == 0:
                with pytest.raises(GeneratorError, match="HTTP 503"):
                    policy.act([None] * 6, [[]] * 6, 8, conversations=conversations)
                continue
            replies = policy.act([None] * 6, [[]] * 6, 8, conversations=conversations)
            assert [r.text for r in replies] == ["Action: look"] * 6
            assert seen["most"] == 2 and seen["calls"] == 7 and policy.client.completion_tokens == 12


def test_serve_model_command_serves_a_checkpoint(model_dir):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-model", str(model_dir), "--port", str(port)],
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Your goal", "max_tokens": 3,
                                                                            "logprobs": 1}).json()
        assert answer["model"] == "model" and len(answer["choices"][0]["logprobs"]["tokens"]) <= 3
    finally:
        process.terminate()
        process.wait(10)
