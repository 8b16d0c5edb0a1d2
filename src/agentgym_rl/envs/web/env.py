"""`WebEnv`: tasks on websites in a real headless Chromium, in WebArena's observation and
action format.

Observation: the objective, the URL, the open tabs, the page's accessibility tree with numeric
ids (`axtree.py`) and the previous action. Action: one of WebArena's (`actions.GRAMMAR`) in
triple backticks. A malformed or impossible action is explained in the next observation and
flagged `invalid_action`; it never raises. `stop [answer]` ends the episode, which the task's
evaluators score (`evaluators.py`): reward 1 when all pass.

By default the tasks are those of the embedded shop and forum (`shop_tasks.py`,
`forum_tasks.py`), on sites this process serves on loopback, with databases of their own per
env instance restored before every episode. With
`task_file` they are WebArena task configs run against sites the user hosts (`site_urls`).
Each env instance has its own browser context in the process' one Chromium (`browser.py`) and
may only reach its task's sites.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import random
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .. import snapshots
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..tasks import Task
from .actions import GRAMMAR, Action, ParseError, parse_action
from .axtree import AXPage, render_axtree
from .browser import BrowserRuntime, find_chromium, shared_runtime
from .evaluators import ALTERNATIVES, evaluate, needs_judge
from .forum_data import build_forum
from .forum_site import forum_app
from .forum_tasks import forum_tasks
from .shop_data import build_shop
from .shop_site import shop_app
from .shop_tasks import shop_tasks
from .site_server import TENANT_HEADER, SiteServer, TenantDatabases

INSTRUCTION = (
    "You browse websites to complete a task. Each observation shows the objective, the page's "
    "accessibility tree (every element has an id in brackets) and your previous action. Reply with "
    "one action in triple backticks, for example ```click [12]``` or ```type [7] [blue kettle] [1]```. "
    f"Actions: {GRAMMAR}. When the task asks a question, answer it with ```stop [answer]```; "
    "otherwise finish with ```stop []```."
)
PLACEHOLDERS = {"__SHOPPING__": "shopping", "__SHOPPING_ADMIN__": "shopping_admin", "__REDDIT__": "reddit",
                "__GITLAB__": "gitlab", "__WIKIPEDIA__": "wikipedia", "__MAP__": "map"}
VIEWPORT = {"width": 1280, "height": 900}
NAVIGATION_GRACE = 0.3
"""Seconds to wait after an action for a navigation the renderer did not request while handling
it (one a script starts later) before treating the page as settled (`WebEnv._settled`)."""
READ_ATTEMPTS = 3
"""Reads of a page's accessibility tree before it is observed as it stands (`WebEnv._loaded_tree`)."""


class EmbeddedSites:
    """The websites this process serves (the shop and the forum, one server each, a database
    per tenant) and their tasks: the test tasks of both, then the train tasks."""

    def __init__(self, seed: int):
        sites = {"shopping": (build_shop, shop_app, shop_tasks), "reddit": (build_forum, forum_app, forum_tasks)}
        self.databases = {name: TenantDatabases(lambda build=build: build(seed)) for name, (build, _, _) in sites.items()}
        self.servers = {name: SiteServer(app(self.databases[name]), name) for name, (_, app, _) in sites.items()}
        self.urls = {name: server.url for name, server in self.servers.items()}
        splits = [make_tasks(self.databases[name].pristine, seed) for name, (_, _, make_tasks) in sites.items()]
        test = [task for site_test, _ in splits for task in site_test]
        train = [task for _, site_train in splits for task in site_train]
        self.tasks = test + train
        for task_id, task in enumerate(self.tasks):
            task["task_id"] = task_id
        self.num_test = len(test)


_SITES_LOCK = threading.Lock()


@cache
def _embedded(seed: int) -> EmbeddedSites:
    return EmbeddedSites(seed)


def embedded_sites(seed: int = 0) -> EmbeddedSites:
    """The process' embedded sites for `seed`, started on first use."""
    with _SITES_LOCK:
        return _embedded(seed)


@cache
def _task_file(path: str) -> tuple[dict, ...]:
    """WebArena task configs: a JSON list, one JSON object, or a folder of `<id>.json` files."""
    source = Path(path)
    if source.is_dir():
        files = sorted(source.glob("*.json"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.stem))
        configs = [json.loads(file.read_text()) for file in files]
    elif source.is_file():
        loaded = json.loads(source.read_text())
        configs = loaded if isinstance(loaded, list) else [loaded]
    else:
        raise ValueError(f"no task file or folder {path!r}")
    for config in configs:
        missing = {"intent", "start_url", "eval"} - set(config)
        if missing:
            raise ValueError(f"{path}: task {config.get('task_id', '?')} lacks {', '.join(sorted(missing))}")
    return tuple(configs)


def _user_tasks(task_file: str, judged: bool) -> list[dict]:
    tasks = [task for task in _task_file(task_file) if judged or not needs_judge(task)]
    left_out = len(_task_file(task_file)) - len(tasks)
    if left_out:
        _warn_once(f"web: {left_out} of the {left_out + len(tasks)} tasks of {task_file} need a judge model for "
                   "fuzzy_match and are left out; set judge_url (an OpenAI-compatible /v1 endpoint) to run them")
    return tasks


@cache
def _check_reachable(site: str, url: str) -> None:
    """Raise ValueError (a one-line user error) when a user-hosted site does not answer HTTP;
    checked once per process."""
    import httpx

    try:
        httpx.get(url, timeout=10, follow_redirects=False)
    except httpx.HTTPError as error:
        raise ValueError(f"site {site!r} at {url} does not answer: {error or type(error).__name__}") from None


@cache
def _warn_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


def web_tasks(split: str, task_file: str | None = None, judge_url: str | None = None, seed: int = 0) -> list[Task]:
    """The embedded sites' test or train tasks; with `task_file`, its tasks in both splits
    (WebArena has no train split), without those that need a judge when none is set."""
    if task_file is not None:
        return [Task("web", index, _category(task)) for index, task in enumerate(_user_tasks(task_file, bool(judge_url)))]
    sites = embedded_sites(seed)
    indices = range(sites.num_test) if split == "test" else range(sites.num_test, len(sites.tasks))
    return [Task("web", index, sites.tasks[index]["category"]) for index in indices]


def _category(task: dict) -> str:
    if "category" in task:
        return task["category"]
    kinds = task["eval"].get("eval_types", ["?"])
    return f"{'+'.join(task.get('sites', ['web']))}/{'state' if 'program_html' in kinds else 'info' if 'string_match' in kinds else 'navigation'}"


@dataclass
class _Browsing:
    """One env instance's browser state: its context, tabs and the last page text."""

    context: Any = None
    active: int = 0
    page: AXPage = field(default_factory=lambda: AXPage(""))
    sessions: dict = field(default_factory=dict)  # page -> its DevTools session
    main_frames: dict = field(default_factory=dict)  # page -> its main frame's DevTools id
    refused: list[str] = field(default_factory=list)  # pages it was not allowed to open
    allowed: set[str] = field(default_factory=set)  # the hosts (netlocs) the episode may reach
    with_state: bool = False  # the context was made with a task's storage_state (a login)


class WebEnv(TextEnv):
    """Web tasks in Chromium (see the module docstring).

    Args:
        task_file: WebArena task configs (a JSON list, one config, or a folder of `<id>.json`)
            to run instead of the embedded sites' tasks; `__SHOPPING__`-style placeholders in
            them are replaced by `site_urls`.
        site_urls: base URL per WebArena site name ("shopping", "shopping_admin", "reddit",
            "gitlab", "wikipedia", "map") for `task_file`.
        judge_url, judge_model: an OpenAI-compatible `/v1` endpoint and model that decide
            `fuzzy_match` answers; tasks that need one are left out when it is not set.
        screenshot: put a PNG of the page (base64) in `info["screenshot"]` after every step.
        timeout: seconds a page load or an action may take.
        chromium: the Chromium executable (default: `browser.find_chromium`).
        own_browser: give this instance a Chromium process of its own instead of a context in
            the process' shared one (more memory and slower resets, `docs/BENCHMARKS.md`;
            a crash then takes down only this instance).
        seed: the embedded sites' data and tasks.
    """

    env_id = "web"
    instruction = INSTRUCTION
    _tenants = itertools.count(1)

    def __init__(self, task_file: str | None = None, site_urls: dict[str, str] | None = None,
                 judge_url: str | None = None, judge_model: str = "gpt-4o-mini", screenshot: bool = False,
                 timeout: float = 10.0, chromium: str | None = None, own_browser: bool = False, seed: int = 0):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        executable = find_chromium(chromium)
        self._own_runtime = own_browser
        self._runtime: BrowserRuntime = BrowserRuntime(executable) if own_browser else shared_runtime(executable)
        self._judge = _OpenAIJudge(judge_url, judge_model) if judge_url else None
        if task_file is not None:
            self._tasks = _user_tasks(task_file, self._judge is not None)
            self._sites: EmbeddedSites | None = None
            self._site_urls = dict(site_urls or {})
            for site, url in self._site_urls.items():
                _check_reachable(site, url)
        else:
            if site_urls:
                raise ValueError("site_urls is for WebArena task files (task_file); the embedded sites serve themselves")
            self._sites = embedded_sites(seed)
            self._tasks = self._sites.tasks
            self._site_urls = dict(self._sites.urls)
        self.screenshot = screenshot
        self.timeout = timeout
        self._tenant = f"env{next(self._tenants)}"
        self._browsing = _Browsing()
        self._task: dict | None = None
        self._done = True
        self._turn = 0
        self._previous_action = "None"

    # -- the TextEnv API --------------------------------------------------------------

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            item_id = random.Random(seed).randrange(len(self._tasks))
        index = parse_item_index(item_id, self.env_id)
        if index >= len(self._tasks):
            raise ValueError(f"item {item_id!r} is out of range: there are {len(self._tasks)} web tasks")
        task = self._tasks[index]
        if self._sites is not None:
            for site in task["sites"]:
                self._sites.databases[site].reset(self._tenant)
        self._task, self._item_id = task, f"web_{index}"
        self._done, self._turn, self._previous_action = False, 0, "None"
        self._run(lambda: self._open(self.fill(task["start_url"])), self.timeout * 3)
        return self._observe(), {"item_id": self._item_id, "category": _category(task)}

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise EnvStateError("step() called before reset() or after the episode ended")
        self._turn += 1
        parsed = parse_action(action)
        info: dict[str, Any] = {"item_id": self._item_id, "success": False, "invalid_action": False}
        if isinstance(parsed, ParseError):
            info["invalid_action"] = True
            return self._observe(f"Invalid action: {parsed.message}"), 0.0, False, False, info
        if parsed.kind == "stop":
            reward = self._run(lambda: self._score(parsed.text), self.timeout * 3)
            self._done = True
            info["success"] = reward >= 1.0
            self._previous_action = str(parsed)
            return f"The episode ended with {parsed}.", reward, True, False, info
        problem = self._run(lambda: self._act(parsed), self.timeout * 2)
        if problem:
            info["invalid_action"] = True
            return self._observe(f"Invalid action: {problem}"), 0.0, False, False, info
        self._previous_action = str(parsed)
        observation = self._observe()
        if self.screenshot:
            info["screenshot"] = base64.b64encode(self._run(self._screenshot, self.timeout)).decode()
        return observation, 0.0, False, False, info

    def snapshot(self) -> bytes:
        """The episode as it stands: its task, turn, last action and whether it ended; the
        databases of its sites (this instance's copies); each open tab's history (its URLs and
        where in them it is), which tab is active, and the cookies. A restore loads those pages
        again from the restored databases. Not held: what was typed into a form and not
        submitted, scroll positions, and page state a script keeps (the embedded sites keep none)."""
        if self._task is None:
            raise EnvStateError("call reset before snapshot")
        if self._sites is None:
            raise NotImplementedError("a task file's websites keep their state on their own servers, out of a "
                                      "snapshot's reach: only the embedded sites snapshot")
        databases = {site: self._sites.databases[site].dump(self._tenant) for site in self._task["sites"]}
        tabs, cookies = self._run(self._tabs_and_cookies, self.timeout)
        return snapshots.dump(self.env_id, {
            "item_id": self._item_id, "turn": self._turn, "done": self._done, "previous_action": self._previous_action,
            "databases": databases, "tabs": tabs, "active": self._browsing.active, "cookies": cookies})

    def restore(self, state: bytes) -> None:
        record = snapshots.load(self.env_id, state)
        if self._sites is None:
            raise NotImplementedError("a task file's websites keep their state on their own servers: only the "
                                      "embedded sites restore")
        index = parse_item_index(record["item_id"], "web")
        if index >= len(self._tasks):
            raise ValueError(f"the snapshot's item {record['item_id']!r} is out of range: there are "
                             f"{len(self._tasks)} web tasks")
        self._task, self._item_id = self._tasks[index], record["item_id"]
        for site, data in record["databases"].items():
            self._sites.databases[site].load(self._tenant, data)
        self._turn, self._done, self._previous_action = record["turn"], record["done"], record["previous_action"]
        pages = sum(len(tab["urls"]) for tab in record["tabs"])
        self._run(lambda: self._reopen(record["tabs"], record["active"], record["cookies"]), self.timeout * (2 + pages))
        self._run(self._read_page, self.timeout * 2)  # the element ids the next action names

    def expert_action(self) -> str | None:
        """The next step of the task's scripted solution, as a reply (the plan is followed from
        the episode's start, one step per turn)."""
        if self._task is None or "expert" not in self._task:
            return None
        plan = self._task["expert"]
        if self._turn >= len(plan):
            return "```stop []```"
        step = plan[self._turn]
        if step["do"] == "stop":
            return f"```stop [{step['answer']}]```"
        node = self._browsing.page.find(step["role"], step["name"])
        if node is None:
            raise EnvStateError(f"expert step {self._turn} of {self._item_id}: no {step['role']} "
                                f"{step['name']!r} on {self.url}")
        if step["do"] == "type":
            return f"```type [{node.element_id}] [{step['text']}] [{step['enter']}]```"
        return f"```{step['do']} [{node.element_id}]```"

    def close(self) -> None:
        if self._browsing.context is not None:
            context, self._browsing.context = self._browsing.context, None
            try:
                self._run(context.close, self.timeout)
            except Exception:  # a crashed browser has no context left to close
                pass
        if self._own_runtime:
            self._runtime.close()
        if self._sites is not None:
            for databases in self._sites.databases.values():
                databases.drop(self._tenant)

    # -- helpers ------------------------------------------------------------------------

    def fill(self, url: str) -> str:
        """`url` with WebArena's site placeholders replaced by this env's site URLs."""
        for placeholder, site in PLACEHOLDERS.items():
            if placeholder in url:
                if site not in self._site_urls:
                    raise ValueError(f"the task needs site {site!r}; give its base URL in site_urls")
                url = url.replace(placeholder, self._site_urls[site].rstrip("/"))
        return url

    @property
    def url(self) -> str:
        return self._pages()[self._browsing.active].url if self._browsing.context else ""

    def _allowed_hosts(self) -> set[str]:
        hosts = {urlparse(self._site_urls[site]).netloc for site in self._task["sites"] if site in self._site_urls}
        hosts.add(urlparse(self.fill(self._task["start_url"])).netloc)
        return hosts

    def _run(self, make_coroutine, timeout: float):
        return self._runtime.run(make_coroutine, timeout)

    def _pages(self) -> list:
        return self._browsing.context.pages

    def _observe(self, feedback: str = "") -> str:
        page_text, tabs, url = self._run(self._read_page, self.timeout * 2)
        lines = [feedback] if feedback else []
        lines += [f"Objective: {self._task['intent']}", f"URL: {url}", f"Open tabs: {tabs}",
                  page_text, f"Previous action: {self._previous_action}"]
        return "\n".join(lines)

    # -- coroutines run on the browser's loop ---------------------------------------------

    async def _open(self, start_url: str) -> None:
        """The episode's browser context on `start_url`, holding nothing of an earlier episode (no
        cookies, site storage, cache, history or extra tabs): the instance's context emptied, or
        a new one when that fails or the task brings a login state (`storage_state`) of its own.
        Most of a new context's cost is starting its tab's renderer: resets went from 1.9 to 5.2
        a second (docs/BENCHMARKS.md)."""
        state = self._task.get("storage_state")
        state = state if state and Path(state).is_file() else None
        allowed = self._allowed_hosts()
        page = (None if state else await self._emptied_page(allowed)) or await self._new_context(state, allowed)
        await page.goto(start_url, wait_until="load")
        # The blank page a tab opens on (and the last episode's pages) are not the episode's
        # history: `go_back` on the start page stays there.
        session = self._browsing.sessions.get(page) or await self._open_session(page)
        await session.send("Page.resetNavigationHistory")

    async def _tabs_and_cookies(self) -> tuple[list[dict], list[dict]]:
        """Each tab's history ({"urls": [...], "current": index}) and the context's cookies."""
        tabs = []
        for page in self._pages():
            session = self._browsing.sessions.get(page) or await self._open_session(page)
            history = await session.send("Page.getNavigationHistory")
            tabs.append({"urls": [entry["url"] for entry in history["entries"]], "current": history["currentIndex"]})
        return tabs, await self._browsing.context.cookies()

    async def _reopen(self, tabs: list[dict], active: int, cookies: list[dict]) -> None:
        """The episode's browser context holding nothing but `cookies` and `tabs`, each tab's
        history walked again (every page loaded afresh from the sites' restored state) and
        stepped back to where it was; tab `active` in front."""
        state = self._task.get("storage_state")
        state = state if state and Path(state).is_file() else None
        allowed = self._allowed_hosts()
        first = (None if state else await self._emptied_page(allowed)) or await self._new_context(state, allowed)
        if cookies:
            await self._browsing.context.add_cookies(cookies)
        pages = [first] + [await self._browsing.context.new_page() for _ in tabs[1:]]
        for page, tab in zip(pages, tabs):
            await page.goto(tab["urls"][0], wait_until="load")
            session = self._browsing.sessions.get(page) or await self._open_session(page)
            await session.send("Page.resetNavigationHistory")
            for url in tab["urls"][1:]:
                await page.goto(url, wait_until="load")
            for _ in range(len(tab["urls"]) - 1 - tab["current"]):
                await page.go_back(wait_until="load")
        self._browsing.active = min(active, len(pages) - 1)
        await pages[self._browsing.active].bring_to_front()

    async def _emptied_page(self, allowed: set[str]) -> Any:
        """The instance's context with its last episode's state removed, on a blank first tab
        that is returned; None when there is no context to reuse (none yet, one made with a
        login state, a crashed browser)."""
        last = self._browsing
        if last.context is None or last.with_state or not last.context.pages:
            return None
        try:
            if not last.context.browser.is_connected():
                return None
            first, *others = last.context.pages
            for page in others:
                await page.close()
            await first.goto("about:blank")  # off the sites before their data is cleared
            await last.context.clear_cookies()
            session = last.sessions.get(first) or await self._open_session(first)
            for host in last.allowed:
                for scheme in ("http", "https"):
                    await session.send("Storage.clearDataForOrigin",
                                       {"origin": f"{scheme}://{host}", "storageTypes": "all"})
            await session.send("Network.clearBrowserCache")
        except Exception:  # a browser that crashed meanwhile, a page that would not leave
            return None
        self._browsing = _Browsing(context=last.context, allowed=allowed, sessions={first: session},
                                   main_frames={first: last.main_frames[first]})
        return first

    async def _new_context(self, state: str | None, allowed: set[str]) -> Any:
        """A new browser context (the last one closed) with one tab, which is returned."""
        if self._browsing.context is not None:
            try:
                await self._browsing.context.close()
            except Exception:  # the browser crashed since: nothing to close
                pass
        browser = await self._runtime.browser()
        context = await browser.new_context(viewport=VIEWPORT, extra_http_headers={TENANT_HEADER: self._tenant},
                                            storage_state=state)
        context.set_default_timeout(self.timeout * 1000)

        async def guard(route) -> None:  # the allowed hosts of the episode under way
            url = route.request.url
            if urlparse(url).netloc in self._browsing.allowed or url.startswith(("about:", "data:")):
                await route.continue_()
            else:
                if route.request.is_navigation_request():
                    self._browsing.refused.append(url)
                await route.abort("blockedbyclient")

        await context.route("**/*", guard)
        self._browsing = _Browsing(context=context, allowed=allowed, with_state=state is not None)
        return await context.new_page()

    async def _open_session(self, page: Any) -> Any:
        """`page`'s DevTools session, with its main frame's id noted (for `_settled`)."""
        session = self._browsing.sessions[page] = await self._browsing.context.new_cdp_session(page)
        await session.send("Page.enable")  # for Page.frameRequestedNavigation (`_settled`)
        tree = await session.send("Page.getFrameTree")
        self._browsing.main_frames[page] = tree["frameTree"]["frame"]["id"]
        return session

    async def _read_page(self) -> tuple[str, str, str]:
        pages = self._pages()
        self._browsing.active = min(self._browsing.active, len(pages) - 1)
        page = pages[self._browsing.active]
        session = self._browsing.sessions.get(page) or await self._open_session(page)
        tree = await self._loaded_tree(page, session)
        self._browsing.page = render_axtree(tree["nodes"])
        titles = []
        for number, other in enumerate(pages):
            current = " (current)" if number == self._browsing.active else ""
            titles.append(f"[{number}] {await other.title() or other.url}{current}")
        return self._browsing.page.text, " | ".join(titles), page.url

    async def _loaded_tree(self, page: Any, session: Any) -> dict:
        """The accessibility tree of `page`'s current document once it has loaded.

        `_settled` waits for the navigations an action starts, but one can still overtake the
        read on a loaded machine (CI once saw a search URL with the search form's tree): a read
        while the document was loading, or across a change of URL, waits for the load and is
        made again (`READ_ATTEMPTS` times at most)."""
        for _ in range(READ_ATTEMPTS):
            url = page.url
            try:
                state = await page.evaluate("document.readyState")
            except Exception:  # the document went away under the call: a navigation committed
                state = "navigating"
            tree = await session.send("Accessibility.getFullAXTree")
            if state == "complete" and page.url == url:
                break
            try:
                await page.wait_for_load_state("load", timeout=self.timeout * 1000 / READ_ATTEMPTS)
            except Exception:  # a page that never finishes loading is observed as it stands
                break
        return tree

    async def _screenshot(self) -> bytes:
        return await self._pages()[self._browsing.active].screenshot()

    async def _center(self, page, session, element: int) -> tuple[float, float] | str:
        node = self._browsing.page.nodes.get(element)
        if node is None:
            return f"there is no element [{element}] on this page"
        if node.backend_node_id is None:
            return f"element [{element}] ({node.role}) cannot be targeted"
        try:
            await session.send("DOM.scrollIntoViewIfNeeded", {"backendNodeId": node.backend_node_id})
            quads = (await session.send("DOM.getContentQuads", {"backendNodeId": node.backend_node_id}))["quads"]
        except Exception:
            return f"element [{element}] ({node.role} {node.name!r}) is not visible"
        if not quads:
            return f"element [{element}] ({node.role} {node.name!r}) is not visible"
        xs, ys = quads[0][0::2], quads[0][1::2]
        return sum(xs) / 4, sum(ys) / 4

    async def _settled(self, page, action) -> None:
        """Run `action()` and, if it starts a navigation of the page, wait for the new page to load.

        The renderer reports a navigation it requests (a link followed, a form submitted) on the
        page's DevTools session while it handles the input, before the click or key press is
        acknowledged: so when `action()` returns the request is known, however busy the machine.
        Navigations that start later (a script's timer) get `NAVIGATION_GRACE` seconds."""
        session = self._browsing.sessions[page]
        started, loaded = asyncio.Event(), asyncio.Event()

        def on_requested(event: dict) -> None:
            if event.get("frameId") == self._browsing.main_frames.get(page):
                started.set()

        def on_request(request) -> None:
            if request.is_navigation_request() and request.frame == page.main_frame:
                started.set()

        def on_failed(request) -> None:
            if request.is_navigation_request():
                loaded.set()

        def on_load(*_) -> None:
            loaded.set()

        session.on("Page.frameRequestedNavigation", on_requested)
        page.on("request", on_request)
        page.on("requestfailed", on_failed)
        page.on("load", on_load)
        try:
            await action()
            if not started.is_set():
                try:
                    await asyncio.wait_for(started.wait(), NAVIGATION_GRACE)
                except TimeoutError:
                    return
            await asyncio.wait_for(loaded.wait(), self.timeout)
        finally:
            session.remove_listener("Page.frameRequestedNavigation", on_requested)
            page.remove_listener("request", on_request)
            page.remove_listener("requestfailed", on_failed)
            page.remove_listener("load", on_load)

    async def _act(self, action: Action) -> str:
        """Carry out `action` on the active tab; a non-empty result says why it could not be."""
        self._browsing.refused.clear()
        problem = await self._carry_out(action)
        if self._browsing.refused and not problem:
            page = self._pages()[self._browsing.active]
            for _ in range(40):  # Chromium shows its error page for the refused one: leave it
                if page.url.startswith("chrome-error:"):
                    await page.go_back()
                    break
                await asyncio.sleep(0.05)
            problem = f"{self._browsing.refused[0]} is outside this task's websites"
        return problem

    async def _carry_out(self, action: Action) -> str:
        context = self._browsing.context
        page = self._pages()[self._browsing.active]
        session = self._browsing.sessions[page]
        if action.kind in ("click", "hover", "type"):
            center = await self._center(page, session, action.element)
            if isinstance(center, str):
                return center
            x, y = center
            if action.kind == "hover":
                await page.mouse.move(x, y)
            elif action.kind == "click":
                await self._settled(page, lambda: page.mouse.click(x, y))
            else:
                await page.mouse.click(x, y)
                await page.keyboard.press("Control+A")
                await page.keyboard.press("Delete")
                await page.keyboard.type(action.text)
                if action.press_enter:
                    await self._settled(page, lambda: page.keyboard.press("Enter"))
        elif action.kind == "press":
            try:
                await self._settled(page, lambda: page.keyboard.press(action.text))
            except Exception:
                return f"unknown key {action.text!r} (examples: Enter, Tab, ArrowDown, Control+a)"
        elif action.kind == "scroll":
            await page.mouse.wheel(0, (1 if action.direction == "down" else -1) * VIEWPORT["height"] * 0.8)
        elif action.kind == "goto":
            if urlparse(action.text).netloc not in self._allowed_hosts():
                return f"{action.text} is outside this task's websites"
            try:
                await page.goto(action.text, wait_until="load")
            except Exception as error:
                return f"could not open {action.text}: {str(error).splitlines()[0]}"
        elif action.kind in ("go_back", "go_forward"):
            await (page.go_back() if action.kind == "go_back" else page.go_forward())
        elif action.kind == "new_tab":
            await context.new_page()
            self._browsing.active = len(self._pages()) - 1
        elif action.kind == "tab_focus":
            if not 0 <= action.tab < len(self._pages()):
                return f"there is no tab {action.tab}; tabs are 0 to {len(self._pages()) - 1}"
            self._browsing.active = action.tab
            await self._pages()[action.tab].bring_to_front()
        elif action.kind == "close_tab":
            if len(self._pages()) == 1:
                return "the last tab cannot be closed"
            await page.close()
            self._browsing.sessions.pop(page, None)
            self._browsing.active = len(self._pages()) - 1
        return ""

    async def _score(self, answer: str) -> float:
        texts: dict[tuple[str, str], str] = {}
        for target in self._task["eval"].get("program_html", []):
            texts[(target["url"], target.get("locator", ""))] = await self._page_text(target["url"], target.get("locator", ""))
        task = self._task
        if "reference_url" in task["eval"]:
            references = task["eval"]["reference_url"].split(ALTERNATIVES)
            task = {**task, "eval": {**task["eval"], "reference_url": ALTERNATIVES.join(map(self.fill, references))}}
        url = self._pages()[self._browsing.active].url
        return await asyncio.to_thread(
            evaluate, task, answer, url, lambda u, loc: texts[(u, loc)], self._site_rows, self._judge)

    async def _page_text(self, url: str, locator: str) -> str:
        """The text `locator` (a JavaScript expression, or "" for the whole page) selects on
        `url` ("last": the page the episode ended on)."""
        if locator.startswith("func:") or url.startswith("func:"):
            raise ValueError(f"WebArena's helper functions ({url or locator}) are not supported")
        page = self._pages()[self._browsing.active]
        opened = None
        if url != "last":
            opened = page = await self._browsing.context.new_page()
            await page.goto(self.fill(url), wait_until="load")
        try:
            expression = locator or "document.body.innerText"
            value = await page.evaluate(f"() => {{ try {{ return String({expression}); }} catch (e) {{ return ''; }} }}")
            return value or ""
        finally:
            if opened is not None:
                await opened.close()

    def _site_rows(self, site: str, sql: str) -> list[tuple]:
        if self._sites is None or site not in self._sites.databases:
            raise ValueError(f"site_state checks need an embedded site; {site!r} is not one")
        return self._sites.databases[site].query(self._tenant, sql)


class _OpenAIJudge:
    """`fuzzy_match` by asking an OpenAI-compatible chat model whether two answers agree."""

    def __init__(self, url: str, model: str):
        import os

        import httpx

        headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
        self._client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60)
        self.model = model

    def __call__(self, question: str, answer: str, reference: str) -> bool:
        prompt = (f"Question: {question}\nReference answer: {reference}\nGiven answer: {answer}\n"
                  "Does the given answer mean the same as the reference answer? Reply with yes or no only.")
        response = self._client.post("/chat/completions", json={
            "model": self.model, "temperature": 0, "messages": [{"role": "user", "content": prompt}]})
        response.raise_for_status()
        return response.json()["choices"][0]["message"]["content"].strip().lower().startswith("yes")
