"""A generator that samples from a model served over HTTP with OpenAI's completions API.

Token ids go in and come out (`POST {base_url}/completions` with `prompt` a list of token-id
lists; the server returns each token as "token_id:<id>" with its logprob, the
`return_tokens_as_token_ids` convention of vLLM, which `agentgym-rl serve-model` follows), so
rollouts stay token-exact: the engine keeps the ids and logprobs the server sampled, exactly as
with the in-process `HFGenerator`. Any server with that API works: `agentgym-rl serve-model`,
vLLM's OpenAI server.

The served weights are the server's: this generator evaluates a model or plays rollouts with it,
but cannot take a learner's weights after an update (`sync_weights` refuses).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from ..errors import UserError
from .generator import Generation


class GeneratorError(UserError):
    """The model server failed: unreachable or too slow after the retries, or it refused the
    request (the message holds the server's reason). The CLI reports it in one line."""


class OpenAIClient:
    """Calls to an OpenAI-compatible API root, with retries, a concurrency limit and token
    accounting.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        timeout: seconds one request may take.
        retries: further attempts after a connection failure, a timeout or a 5xx answer (not after
            a 4xx: the request itself is wrong).
        max_concurrency: requests in flight at once.
        api_key: sent as a bearer token.
    Attributes:
        prompt_tokens, completion_tokens: tokens the server reported (`usage`) so far.
    """

    def __init__(self, base_url: str, timeout: float = 60.0, retries: int = 2, max_concurrency: int = 4,
                 api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                    limits=httpx.Limits(max_connections=max_concurrency))
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="openai-client")
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def post(self, path: str, body: dict) -> dict:
        """The JSON answer of `POST path`, its `usage` counted.

        Raises:
            GeneratorError: refused (4xx), or failed after the retries.
        """
        for attempt in range(self.retries + 1):
            try:
                response = self._client.post(path, json=body)
            except httpx.HTTPError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code < 400:
                    try:
                        answer = response.json()
                    except ValueError:
                        answer = None
                    if not isinstance(answer, dict):
                        raise GeneratorError(f"{self.base_url}{path} answered {response.status_code} without a "
                                             "JSON object: not an OpenAI-compatible API")
                    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
                    counts = [usage.get(key) for key in ("prompt_tokens", "completion_tokens")]
                    prompt, completion = (int(n) if isinstance(n, int) else 0 for n in counts)
                    with self._lock:
                        self.prompt_tokens += prompt
                        self.completion_tokens += completion
                    return answer
                problem = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code < 500:
                    raise GeneratorError(f"{self.base_url}{path} refused the request: {problem}")
            if attempt < self.retries:
                time.sleep(0.5 * 2 ** attempt)
        raise GeneratorError(f"{self.base_url}{path} failed after {self.retries + 1} attempts: {problem}")

    def models(self) -> list[str]:
        """The names `GET /models` lists (one attempt: a check that the server answers).

        Raises:
            GeneratorError: no answer, or not a model list.
        """
        try:
            response = self._client.get("/models")
            response.raise_for_status()
            return [entry["id"] for entry in response.json()["data"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            raise GeneratorError(f"GET /models failed ({error or type(error).__name__})") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self._client.close()


class OpenAIGenerator:
    """Samples through `POST {base_url}/completions`.

    Args:
        base_url, timeout, retries, max_concurrency, api_key: the server (`OpenAIClient`).
        model: the served model's name (`GET {base_url}/models` lists them).
        stop_ids: token ids that end a turn (sent as `stop_token_ids`).
        temperature: 0 means greedy decoding.
        batch_size: prompts per request; requests run concurrently.
    Attributes:
        client: its `OpenAIClient` (`client.prompt_tokens`, `client.completion_tokens`).
    """

    def __init__(self, base_url: str, model: str, stop_ids: list[int], temperature: float = 1.0,
                 timeout: float = 60.0, retries: int = 2, batch_size: int = 16, max_concurrency: int = 4,
                 api_key: str | None = None):
        self.client = OpenAIClient(base_url, timeout, retries, max_concurrency, api_key)
        self.model = model
        self.stop_ids = list(stop_ids)
        self.temperature = temperature
        self.batch_size = batch_size

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 streams: list[int] | None = None) -> list[Generation]:
        """`streams` are not sent: a served model samples from its own random state."""
        chunks = [prompts[i:i + self.batch_size] for i in range(0, len(prompts), self.batch_size)]
        results = self.client.pool.map(lambda chunk: self._complete(chunk, max_new_tokens), chunks)
        return [generation for chunk in results for generation in chunk]

    def sync_weights(self, model: Any) -> None:
        raise GeneratorError("a served model keeps its own weights: an OpenAI-compatible generator evaluates "
                             "or plays a fixed model and cannot follow a learner's updates")

    def close(self) -> None:
        self.client.close()

    def _complete(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        body = {"model": self.model, "prompt": prompts, "max_tokens": max_new_tokens, "temperature": self.temperature,
                "logprobs": 1, "stop_token_ids": self.stop_ids, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False, "include_stop_str_in_output": True}
        answer = self.client.post("/completions", body)
        try:
            choices = sorted(answer["choices"], key=lambda choice: choice["index"])
            if len(choices) != len(prompts):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
            return [_generation(choice) for choice in choices]
        except (KeyError, TypeError, ValueError) as error:
            raise GeneratorError(f"{self.client.base_url}/completions answered in an unexpected form: {error}") from None


def _generation(choice: dict) -> Generation:
    """A `Generation` from one completion choice whose logprobs name token ids."""
    logprobs = choice["logprobs"]
    ids = [int(token.removeprefix("token_id:")) for token in logprobs["tokens"]]
    return Generation(ids, [float(value) for value in logprobs["token_logprobs"]], choice.get("finish_reason") == "stop")
