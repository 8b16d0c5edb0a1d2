"""What every HTTP server of the project (`serve-env`, `serve-model`, `serve-retriever`, `view`)
puts in front of its routes, so that hostile or careless requests get a 4xx and bounded work:

- `RequestGuard`, a plain ASGI middleware: the `Host` header (when the app names the hosts it
  answers, against DNS rebinding), the bearer token (every path but `GET /health`), and the
  body size counted as the bytes arrive: a chunked body carries no `Content-Length`, and one
  read whole before its size is known can fill the memory;
- `add_error_handlers`: a 422 for a malformed body that quotes at most a short excerpt of it
  and encodes whatever the client sent (an infinite number, a lone surrogate, raw bytes);
- `Text`, the string type of request fields: text that is not valid Unicode (a lone surrogate
  escape) is refused at validation instead of failing deep in a tokenizer or an encoder;
- `listening_socket`, the socket each server (the web env's sites too) listens on.
"""

from __future__ import annotations

import hmac
import json
import socket
from typing import Annotated, Any, Iterable

from pydantic import AfterValidator

EXCERPT_CHARS = 120
"""Longest excerpt of a client's input an error response quotes."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def host_names(bound: str, extra: Iterable[str] = ()) -> list[str]:
    """The names a server bound to `bound` answers for in a request's `Host` (`RequestGuard`):
    this machine's loopback names, the bound address, and `extra` (`--allow-host`). A page of
    another site that rebinds its own name to this machine's address names that site: refused."""
    own = f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound
    return list(dict.fromkeys([*LOOPBACK_HOSTS, own, *extra]))


def is_loopback(bound: str) -> bool:
    """Whether an address to listen on takes connections from this machine only."""
    import ipaddress

    try:
        return bound == "localhost" or ipaddress.ip_address(bound.strip("[]")).is_loopback
    except ValueError:
        return False


def excerpt(value: Any) -> str:
    """`value` as at most `EXCERPT_CHARS` characters of encodable text (repr for non-strings)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > EXCERPT_CHARS:
        text = f"{text[:EXCERPT_CHARS]}... ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not valid Unicode: a lone surrogate at character {error.start}") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
"""A request's string field: any text that is valid Unicode."""


def _json_reply(status: int, detail: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> tuple[dict, dict]:
    body = json.dumps({"detail": detail}).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         *headers]}
    return start, {"type": "http.response.body", "body": body}


class RequestGuard:
    """Checks, in this order: the `Host` (when `allowed_hosts` is given), the bearer `token`
    (when given; every path except `open_paths`), and the body size (`max_body_bytes`; the
    declared length first, then the bytes as they arrive). A plain ASGI middleware:
    Starlette's `BaseHTTPMiddleware` cost more server time per call than a BabyAI step.

    Args:
        allowed_hosts: host names (without port) the `Host` header may carry; None accepts any.
        token: the bearer token every request must carry; None: no token.
        max_body_bytes: larger bodies get 413, without more of them being read.
        open_paths: paths answered without the token (a supervisor's `/health` probe).
    """

    def __init__(self, app: Any, max_body_bytes: int, token: str | None = None,
                 allowed_hosts: Iterable[str] | None = None, open_paths: Iterable[str] = ("/health",)):
        self.app, self.max_body_bytes = app, max_body_bytes
        self.expected = f"Bearer {token}".encode() if token is not None else None
        self.allowed_hosts = None if allowed_hosts is None else {host.lower() for host in allowed_hosts}
        self.open_paths = set(open_paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            for message in refusal:
                await send(message)
            return
        received, cut = 0, False
        started = False

        async def counted() -> dict:
            nonlocal received, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:  # the app sees a client gone: it stops reading
                    cut = True
                    return {"type": "http.disconnect"}
            return message

        async def answer(message: dict) -> None:
            nonlocal started
            if cut and not started:  # the app's reply to a body it never got whole: ours goes instead
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, answer)
        except Exception:
            if not cut:
                raise
        if cut and not started:
            for message in _json_reply(413, f"request body over {self.max_body_bytes} bytes"):
                await send(message)

    def _refusal(self, scope: dict, headers: dict[bytes, bytes]) -> tuple[dict, dict] | None:
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in self.allowed_hosts:
                return _json_reply(400, f"this server does not answer for host {excerpt(host)!r} (allow it with "
                                        "--allow-host)")
        if (self.expected is not None and scope.get("path") not in self.open_paths
                and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected)):
            return _json_reply(401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return _json_reply(413, f"request body over {self.max_body_bytes} bytes")
        return None


def add_error_handlers(app: Any) -> None:
    """A 422 for a request that fails validation, quoting only excerpts of what was sent."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    async def invalid(request: Any, error: RequestValidationError) -> JSONResponse:
        details = []
        for item in error.errors()[:10]:
            detail = {"loc": [part if isinstance(part, int) else excerpt(part) for part in item.get("loc", ())],
                      "msg": excerpt(str(item.get("msg", ""))), "type": excerpt(str(item.get("type", "")))}
            if "input" in item:
                detail["input"] = excerpt(item["input"])
            details.append(detail)
        return JSONResponse({"detail": details}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: a free one) for uvicorn's `sockets=`; raises
    OSError (address in use, not permitted) or OverflowError (port out of range).

    Nagle's algorithm is off: asyncio turns it off only on sockets made with proto=IPPROTO_TCP
    (this one has proto 0, as do the connections it accepts, which inherit the option), and
    with it on a response's body waited for the client's delayed ACK of its headers, 40 ms on
    each request of a reused connection (measured with curl and httpx on the web env's sites,
    which run on plain asyncio; uvloop, under the CLI's servers, sets it itself)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind((host, port))
    except BaseException:
        listener.close()
        raise
    return listener
