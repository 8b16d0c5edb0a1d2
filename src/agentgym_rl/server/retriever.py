"""A retrieval server speaking Search-R1's API: `agentgym-rl serve-retriever`.

    POST /retrieve  {"queries": [...], "topk": 3, "return_scores": false}
        -> {"result": [[{"id", "contents"}, ...] per query]}
           (with return_scores: [[{"document": {"id", "contents"}, "score"}, ...], ...])
    GET  /status    {"documents": N}
    GET  /health    {"status": "ok"}: alive (open without the token)

so that Search-R1's trainers, our `RemoteRetriever` and the `search` environment (its
`retriever_url`) can share one index. A malformed request gets 422 with the reason; more than
`MAX_QUERIES` queries, a query over `MAX_QUERY_CHARS` or a `topk` past `MAX_TOPK` too; a body
over `max_body_bytes` 413; with a token set, every route but /health needs `Authorization:
Bearer <token>` (the search env's client sends $AGENTGYM_RL_ENV_TOKEN).
"""

from __future__ import annotations

from typing import Any, Iterable

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ..envs.search.retrieval import Retriever, row_of
from ..http_guards import RequestGuard, Text, add_error_handlers
from .offload import env_endpoint

MAX_QUERIES = 512
MAX_QUERY_CHARS = 2000
MAX_TOPK = 100


class RetrieveRequest(BaseModel):
    queries: list[Text] = Field(min_length=1, max_length=MAX_QUERIES)
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    """Documents per query (null: the server's default)."""
    return_scores: bool = False


class RetrieverHealth(BaseModel):
    status: str


class RetrieverStatus(BaseModel):
    documents: int


def create_retriever_app(retriever: Retriever, documents: int, default_topk: int = 3, token: str | None = None,
                         max_body_bytes: int = 2_000_000, allowed_hosts: Iterable[str] | None = None) -> FastAPI:
    """The app serving `retriever` (over `documents` documents); larger bodies get 413; a `Host`
    not in `allowed_hosts` (None: any) gets 400."""
    app = FastAPI(title="agentgym-rl retrieval server (Search-R1's API)")
    app.add_middleware(RequestGuard, token=token, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    add_error_handlers(app)

    @app.get("/health")
    async def health() -> RetrieverHealth:
        return RetrieverHealth(status="ok")

    @app.get("/status")
    async def status() -> RetrieverStatus:
        return RetrieverStatus(documents=documents)

    @app.post("/retrieve")
    @env_endpoint(pure_python=False)  # a large index takes a while: other requests go on meanwhile
    def retrieve(body: RetrieveRequest) -> dict[str, Any]:
        too_long = [i for i, query in enumerate(body.queries) if len(query) > MAX_QUERY_CHARS]
        if too_long:
            raise HTTPException(422, f"query {too_long[0]} is over {MAX_QUERY_CHARS} characters")
        found = retriever.search(body.queries, body.topk or default_topk)
        if body.return_scores:
            return {"result": [[{"document": row_of(doc), "score": doc.score} for doc in docs] for docs in found]}
        return {"result": [[row_of(doc) for doc in docs] for docs in found]}

    return app
