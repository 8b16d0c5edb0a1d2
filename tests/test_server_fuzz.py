"""Fuzzing the environment server's HTTP API over its own OpenAPI schema (schemathesis, on top of
hypothesis): schema-valid and schema-violating requests to every endpoint, half of those that
name an instance aimed at live ones (two of them reset), must never get a 5xx answer."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from starlette.testclient import TestClient

from agentgym_rl.server.app import create_app

APP = create_app("babyai", max_instances=64)
LIVE = [TestClient(APP).post("/v1/envs").json()["id"] for _ in range(4)]
for _instance in LIVE[:2]:
    TestClient(APP).post(f"/v1/envs/{_instance}/reset", json={"item_id": _instance})
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=200)
SENT = {"requests": 0, "server_errors": []}


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case):
    if "instance_id" in (case.path_parameters or {}) and SENT["requests"] % 2 == 0:
        case.path_parameters["instance_id"] = LIVE[SENT["requests"] % len(LIVE)]
    response = case.call()
    SENT["requests"] += 1
    if response.status_code >= 500:
        SENT["server_errors"].append((case.method, case.formatted_path, case.body, response.text[:200]))
    assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:300])


@pytest.mark.slow
def test_the_fuzzing_sent_enough_requests():
    """Runs after the fuzzing above (pytest keeps the file's order): it really sent >= 1,500."""
    if not SENT["requests"]:
        pytest.skip("counts the requests of test_no_request_gets_a_server_error: run it with them")
    assert SENT["requests"] >= 1500 and not SENT["server_errors"], SENT["requests"]
