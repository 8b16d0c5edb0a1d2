"""Serving the embedded websites on loopback, with a database per env instance.

Every env instance is a *tenant*: its browser sends `TENANT_HEADER` with each request, and
the site answers from that tenant's own copy of the database, so concurrent episodes never see
each other's carts or posts. `reset` restores a tenant's copy from the pristine database
(SQLite's backup API, a few milliseconds), so every episode, state-changing ones included,
starts from identical state. Requests without the header (a person browsing the site) use
tenant "0".
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Callable
from urllib.parse import parse_qs

import uvicorn
from starlette.requests import Request

from ...http_guards import listening_socket

TENANT_HEADER = "x-agentgym-tenant"


class TenantDatabases:
    """In-memory SQLite databases, one per tenant, each a copy of one pristine database.

    A tenant's connection is used from the site's event loop and from env threads (reset,
    evaluation): take `lock(tenant)` around every use.
    """

    def __init__(self, build: Callable[[], sqlite3.Connection]):
        self.pristine = build()
        self._databases: dict[str, sqlite3.Connection] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _ensure(self, tenant: str) -> None:
        with self._guard:
            if tenant not in self._databases:
                database = sqlite3.connect(":memory:", check_same_thread=False)
                self.pristine.backup(database)
                self._databases[tenant] = database
                self._locks[tenant] = threading.Lock()

    def lock(self, tenant: str) -> threading.Lock:
        self._ensure(tenant)
        return self._locks[tenant]

    def database(self, tenant: str) -> sqlite3.Connection:
        """The tenant's connection (hold `lock(tenant)` while using it)."""
        self._ensure(tenant)
        return self._databases[tenant]

    def reset(self, tenant: str) -> None:
        """Make the tenant's database equal to the pristine one."""
        with self.lock(tenant):
            self.pristine.backup(self._databases[tenant])

    def dump(self, tenant: str) -> bytes:
        """The tenant's database as bytes (SQLite's serialization), for `load`."""
        with self.lock(tenant):
            return self._databases[tenant].serialize()

    def load(self, tenant: str, data: bytes) -> None:
        """Make the tenant's database the one `dump` gave."""
        with self.lock(tenant):
            self._databases[tenant].deserialize(data)

    def query(self, tenant: str, sql: str, parameters: tuple = ()) -> list[tuple]:
        """Rows of a read-only query on the tenant's database."""
        with self.lock(tenant):
            return self._databases[tenant].execute(sql, parameters).fetchall()

    def write(self, tenant: str, statements: list[tuple[str, tuple]]) -> None:
        """Run `(sql, parameters)` statements on the tenant's database and commit them together."""
        with self.lock(tenant):
            database = self._databases[tenant]
            for sql, parameters in statements:
                database.execute(sql, parameters)
            database.commit()

    def drop(self, tenant: str) -> None:
        with self._guard:
            database = self._databases.pop(tenant, None)
            self._locks.pop(tenant, None)
        if database is not None:
            database.close()


class SiteServer:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app, name: str):
        self.name = name
        sock = self.listener = listening_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  (not the main thread)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
                                        name=f"site-{name}", daemon=True)
        self._thread.start()
        for _ in range(500):  # up in a few milliseconds
            if self._server.started:
                break
            threading.Event().wait(0.01)
        else:
            raise RuntimeError(f"the {name} site did not start")

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


def tenant_of(request: Request) -> str:
    """The tenant a request comes from (`TENANT_HEADER`; "0" for a person browsing)."""
    return request.headers.get(TENANT_HEADER, "0")


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of a posted HTML form (the last value of each, stripped)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[-1].strip() for key, values in fields.items()}


def to_int(text: str | None, default: int) -> int:
    """`text` as an int, or `default` when it is missing or not a number."""
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
