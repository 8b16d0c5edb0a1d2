"""An OpenAI-compatible server over a model folder: `agentgym-rl serve-model`.

    GET  /v1/models            the one model served (its folder's name)
    POST /v1/completions       prompt: token ids (a list, or a list of lists) or text; with
                               `return_tokens_as_token_ids` each sampled token comes back as
                               "token_id:<id>" with its logprob, so a client's rollouts stay
                               token-exact (`agent.openai_generator.OpenAIGenerator`)
    POST /v1/chat/completions  messages in the model's chat template; the reply ends at its
                               end-of-turn token
    GET  /health               {"status": "ok"}: alive (open without the token)

Sampling is the in-process generator's (`HFGenerator`: plain temperature sampling, 0 greedy;
temperatures below `GREEDY_BELOW` are greedy too, as in vLLM, since dividing logits by them
overflows), one batch at a time. With a token set, every route but /health (the schema and
docs included) needs `Authorization: Bearer <token>`. A malformed request gets 422 with the
reason: a prompt that with `max_tokens` would pass the model's context, a token id outside the
vocabulary, text that is not valid Unicode; a body over `max_body_bytes` gets 413.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Iterable, Literal

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from ..agent.chat import ChatEncoder
from ..agent.generator import Generation, HFGenerator
from ..http_guards import RequestGuard, Text, add_error_handlers, excerpt

MAX_TOKENS = 4096
MAX_PROMPTS = 256
MAX_TEMPERATURE = 100.0
GREEDY_BELOW = 1e-5


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[list[int]] | list[int] | list[Text] | Text
    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)
    logprobs: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = None
    """Token ids that end a completion (default: the model's end-of-turn and end-of-text)."""
    return_tokens_as_token_ids: bool = False


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: Text


class ChatRequest(BaseModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int = Field(default=256, ge=1, le=MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE)


def create_model_app(model: Any, tokenizer: Any, name: str, token: str | None = None,
                     max_body_bytes: int = 8_000_000, max_seconds: float = 300.0,
                     allowed_hosts: Iterable[str] | None = None) -> FastAPI:
    """The server's app over a loaded model and tokenizer, served as `name`.

    Args:
        max_seconds: a request's generation stops after this long (its replies end "length"),
            and every generation stops when the server shuts down, so SIGTERM is not held up.
        allowed_hosts: the names a request's `Host` may carry (`http_guards.host_names`); None: any.
    """
    encoder = ChatEncoder(tokenizer)
    default_stops = sorted({encoder.end_of_turn_id, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
    context = getattr(model.config, "max_position_embeddings", None)
    lock = threading.Lock()  # one batch at a time: the CPU has no room for two
    stopping = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        stopping.set()  # uvicorn gets here once a graceful shutdown's wait is over

    app = FastAPI(title="agentgym-rl model server", description=__doc__, lifespan=lifespan)
    # Called by the CLI's server on SIGTERM or Ctrl-C, before its graceful wait: generations stop
    # at their next decoding step and their requests get a 503 within that wait, not a
    # cancellation (a 500) once it is over.
    app.state.on_exit_signal = stopping.set
    app.add_middleware(RequestGuard, token=token, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    add_error_handlers(app)

    def generate(prompts: list[list[int]], max_tokens: int, temperature: float, stops: list[int]) -> list[Generation]:
        _check_prompts(prompts, stops, max_tokens, len(tokenizer), context)
        if temperature < GREEDY_BELOW:
            temperature = 0.0
        with lock:
            deadline = time.monotonic() + max_seconds
            generator = HFGenerator(model, tokenizer.pad_token_id, stops, temperature, reuse_cache=False,
                                    stop_when=lambda: stopping.is_set() or time.monotonic() > deadline)
            generations = None if stopping.is_set() else generator.generate(prompts, max_tokens)
        if stopping.is_set():  # cut short by the shutdown: not a reply the model finished
            raise HTTPException(503, "the model server is shutting down; send the request again once it is back "
                                     "(or to another server)")
        return generations

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agentgym-rl"}]}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        return await run_in_threadpool(complete, request)  # the event loop stays free for other calls

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest) -> dict[str, Any]:
        return await run_in_threadpool(chat, request)

    def complete(request: CompletionRequest) -> dict[str, Any]:
        _check_model(request.model, name)
        prompts = _completion_prompts(request.prompt, tokenizer)
        if not 1 <= len(prompts) <= MAX_PROMPTS:
            raise HTTPException(422, f"send 1 to {MAX_PROMPTS} prompts, not {len(prompts)}")
        generations = generate(prompts, request.max_tokens, request.temperature, request.stop_token_ids or default_stops)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": _completion_choices(generations, request, tokenizer),
                "usage": usage(prompts, generations)}

    def chat(request: ChatRequest) -> dict[str, Any]:
        _check_model(request.model, name)
        messages = [message.model_dump() for message in request.messages]
        prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        [generation] = generate([prompt], request.max_tokens, request.temperature, default_stops)
        return _chat_response(name, prompt, generation, encoder.decode_reply(generation.ids))

    return app


def _check_prompts(prompts: list[list[int]], stops: list[int], max_tokens: int, vocabulary: int,
                   context: int | None) -> None:
    """A 422 for an empty prompt, a token id outside the vocabulary, or a prompt and reply past
    the model's context."""
    for prompt in prompts:
        if not prompt or any(not 0 <= token_id < vocabulary for token_id in prompt):
            raise HTTPException(422, f"a prompt is empty or holds a token id outside 0..{vocabulary - 1}")
        if context is not None and len(prompt) + max_tokens > context:
            raise HTTPException(422, f"a prompt of {len(prompt)} tokens and max_tokens {max_tokens} pass the "
                                     f"model's context of {context} tokens: shorten the prompt or max_tokens")
    if any(not 0 <= token_id < vocabulary for token_id in stops):
        raise HTTPException(422, f"stop_token_ids hold an id outside 0..{vocabulary - 1}")


def _completion_prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """The token ids of a completion request's `prompt`: a text, texts, ids, or lists of ids."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
        return [tokenizer.encode(text, add_special_tokens=False) for text in ([prompt] if isinstance(prompt, str) else prompt)]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    return [list(ids) for ids in prompt]


def _check_model(requested: str | None, name: str) -> None:
    if requested not in (None, name):
        raise HTTPException(404, f"model {excerpt(requested)!r} is not served here; this server serves {name!r}")


def _chat_response(name: str, prompt: list[int], generation: Generation, text: str) -> dict[str, Any]:
    """OpenAI's chat completion of one reply, `text` its content."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                        "finish_reason": "stop" if generation.finished else "length"}],
            "usage": usage([prompt], [generation])}


def _completion_choices(generations: list[Generation], request: CompletionRequest, tokenizer: Any) -> list[dict]:
    """The `choices` of a completion: each reply's text, and its tokens with their logprobs when
    asked ("token_id:<id>" with `return_tokens_as_token_ids`, vLLM's convention)."""
    choices = []
    for index, generation in enumerate(generations):
        tokens = ([f"token_id:{token_id}" for token_id in generation.ids] if request.return_tokens_as_token_ids
                  else [tokenizer.decode([token_id]) for token_id in generation.ids])
        logprobs = {"tokens": tokens, "token_logprobs": generation.logprobs} if request.logprobs is not None else None
        choices.append({"index": index, "text": tokenizer.decode(generation.ids), "logprobs": logprobs,
                        "finish_reason": "stop" if generation.finished else "length"})
    return choices


def usage(prompts: list[list[int]], generations: list[Generation]) -> dict[str, int]:
    """OpenAI's `usage` of a request: the tokens of its prompts and of its replies."""
    prompt_tokens = sum(map(len, prompts))
    completion_tokens = sum(len(g.ids) for g in generations)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_name(folder: str | Path) -> str:
    return Path(folder).resolve().name
