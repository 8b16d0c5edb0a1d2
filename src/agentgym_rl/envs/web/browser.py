"""One headless Chromium per process, driven by Playwright's async API on a private thread.

Env instances are stepped from a rollout's worker threads, and Playwright's objects belong to
the event loop that made them. So the browser lives on one background event loop, and env
calls submit coroutines to it (`BrowserRuntime.run`): the waits of many instances overlap
there, while each instance keeps its own browser context (cookies, tabs, headers). A crashed
browser is relaunched on the next call that needs it.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-component-update", "--disable-quic",
               "--no-first-run", "--disable-sync", "--disable-extensions"]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(path: str | None = None) -> str:
    """The Chromium executable: `path`, else $AGENTGYM_CHROMIUM, else one on PATH.

    Raises:
        ValueError: none found (the message says how to install one).
    """
    candidate = path or os.environ.get("AGENTGYM_CHROMIUM")
    if candidate:
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            raise ValueError(f"Chromium executable {candidate!r} does not exist or is not executable")
        return candidate
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    raise ValueError("no Chromium found: install it (Debian: `apt-get install chromium`; `make test` does) "
                     "or set AGENTGYM_CHROMIUM to its path")


def check_browser(chromium: str | None = None, **kwargs: object) -> None:
    """A `UserError` when Playwright or a Chromium to drive is missing (the web environment's
    `EnvSpec.installed_entry_point`, checked before any work)."""
    import importlib.util

    from ...errors import UserError

    if importlib.util.find_spec("playwright") is None:
        raise UserError("the web environment needs Playwright: pip install 'agentgym-rl[web]'")
    try:
        find_chromium(chromium)
    except ValueError as error:
        raise UserError(f"the web environment: {error}") from None


class BrowserRuntime:
    """A Chromium process and the event loop thread that drives it."""

    def __init__(self, executable: str):
        self.executable = executable
        self.launches = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="browser", daemon=True)
        self._thread.start()
        self._playwright: Any = None
        self._browser: Any = None
        self._launch_lock: asyncio.Lock | None = None

    def run(self, make_coroutine: Callable[[], Awaitable[T]], timeout: float) -> T:
        """Run a coroutine on the browser's loop and wait for it at most `timeout` seconds.

        Raises:
            TimeoutError: it took longer (the coroutine is cancelled).
        """
        future = asyncio.run_coroutine_threadsafe(_call(make_coroutine), self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"the browser did not answer within {timeout:g} s") from None

    async def browser(self) -> Any:
        """The running browser, launched (again) when there is none or it has crashed."""
        if self._launch_lock is None:
            self._launch_lock = asyncio.Lock()
        async with self._launch_lock:
            if self._browser is None or not self._browser.is_connected():
                from playwright.async_api import async_playwright

                if self._playwright is None:
                    self._playwright = await async_playwright().start()
                self._browser = await self._playwright.chromium.launch(executable_path=self.executable,
                                                                        args=LAUNCH_ARGS)
                self.launches += 1
            return self._browser

    def close(self) -> None:
        async def stop() -> None:
            if self._browser is not None:
                await self._browser.close()
            if self._playwright is not None:
                await self._playwright.stop()

        if self._loop.is_running():
            try:
                self.run(stop, timeout=10)
            except Exception:  # closing at exit: a dead browser needs no closing
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


async def _call(make_coroutine: Callable[[], Awaitable[T]]) -> T:
    return await make_coroutine()


def chromium_pids() -> list[int]:
    """The Chromium processes descending from this one (Playwright's driver starts them)."""
    from pathlib import Path

    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                status = (proc / "status").read_text()
            except OSError:
                continue
            parents[int(proc.name)] = int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])
    descendants, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - descendants
        descendants |= frontier
    found = []
    for pid in sorted(descendants):
        try:
            if "chrom" in Path(f"/proc/{pid}/comm").read_text():
                found.append(pid)
        except OSError:  # it exited meanwhile
            continue
    return found


_RUNTIMES: dict[str, BrowserRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def shared_runtime(executable: str) -> BrowserRuntime:
    """The process' runtime for this Chromium executable (made on first use, closed at exit)."""
    with _RUNTIMES_LOCK:
        if executable not in _RUNTIMES:
            runtime = BrowserRuntime(executable)
            atexit.register(runtime.close)
            _RUNTIMES[executable] = runtime
        return _RUNTIMES[executable]
