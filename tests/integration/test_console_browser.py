"""The admin console in a real headless Chromium, driven over the DevTools protocol (a
websocket, with aiohttp): a job runs and gets traffic; the page must draw the job graph,
show a live invocation rate and, after an address lookup, that address's decoded state and
timeline, with no Content-Security-Policy violation. A screenshot is saved in the test's
temporary folder (``console.png``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration._admin_job import AdminJob, admin_job

pytestmark = pytest.mark.timeout(180)

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WAIT = 30.0
#: the page's own files (the token guards the data, not these)
STATIC = ("/", "/console.js", "/console.css", "/favicon.svg")


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "no Chromium found (looked for chromium, chromium-browser, google-chrome on PATH): "
        "install Debian's chromium package, as .ci/run does"
    )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[int]:
    """The DevTools port of a headless Chromium."""
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [
            _browser(),
            "--headless=new",
            "--no-sandbox",  # tests may run as root (CI containers)
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT
        while not (active.is_file() and active.read_text().strip()):
            assert process.poll() is None, "chromium exited"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.05)
        yield int(active.read_text().splitlines()[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Page:
    """One page target over the DevTools protocol: a reader task answers calls and hands
    events to ``on_event`` (default: kept in ``events``)."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self.handlers: set[asyncio.Task[None]] = set()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for frame in self.socket:
            message = json.loads(frame.data)
            future = self.waiting.pop(message.get("id", -1), None)
            if future is not None:
                future.set_result(message)
            elif self.on_event is not None:
                task = asyncio.get_running_loop().create_task(self.on_event(message))
                self.handlers.add(task)
                task.add_done_callback(self.handlers.discard)
            else:
                self.events.append(message)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        future = self.waiting[message_id] = asyncio.get_running_loop().create_future()
        await self.socket.send_json({"id": message_id, "method": method, "params": params})
        message = await asyncio.wait_for(future, WAIT)
        assert "error" not in message, message
        result: dict[str, Any] = message.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str) -> Any:
        """Evaluate ``expression`` until it is truthy (an exception, as while the page is
        still loading, counts as not yet)."""
        deadline = time.monotonic() + WAIT
        guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }})()"
        while True:
            value = await self.evaluate(guarded)
            if value:
                return value
            assert time.monotonic() < deadline, f"the page never showed {what}"
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def open_page(port: int) -> AsyncIterator[Page]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        target = next(t for t in targets if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            try:
                yield page
            finally:
                page.reader.cancel()


# The figures of a runtime that reports them in /status (per function type, ingress, egress,
# endpoint, and the checkpoint history): two polls 2 s apart, drawn by the page's own render().
METRICS_SHOWN = """(() => {
  const base = {invocations: 0, parallelism: 2, dead_letters: 0,
    checkpoints: {completed: 3, last: "x", last_duration_ms: 4.5, max_stall_ms: 0.1}};
  const at = (n) => Object.assign({}, base, {
    functions: {"shop/cart": {invocations: 10 * n, messages_in: 20 * n, messages_out: 30 * n,
      failures: 1, mailbox: 7}},
    ingresses: {"shop/http": {records: 100 * n, blocked_seconds: 1.5}},
    egresses: {"shop/out": {records: 5 * n}},
    endpoints: {"shop-remote": {calls: 9, errors: 1, retries: 2, latency_p99_ms: 12.5}},
    checkpoint_history: [{id: 3, duration_ms: 4.5, bytes: 2048, completed_at: 1700000000}],
  });
  previous = {at: 0, status: at(0)};
  render(at(1), 2000);
  const row = (id, i) => Array.from(document.getElementById(id).tBodies[0].rows[i].cells)
    .map((c) => c.textContent);
  const checkpoint = row("checkpoints", 0);
  return {functions: row("functions", 0), io: row("io", 0), egress: row("io", 1),
    endpoints: row("endpoints", 0), checkpoints: [checkpoint[0], checkpoint[2], checkpoint[3]]};
})()"""


def _traffic(job: AdminJob, stop: threading.Event) -> None:
    for n in itertools.count():
        if stop.is_set():
            return
        job.send(f"shop/cart/user{n % 20}", "fig")
        time.sleep(0.01)


async def test_console_shows_graph_rates_and_state(browser: int, tmp_path: Path) -> None:
    with admin_job(tmp_path / "job") as job:
        job.send("shop/cart/dave", "apple")
        job.send("shop/cart/dave", "pear")
        stop = threading.Event()
        sender = threading.Thread(target=_traffic, args=(job, stop), daemon=True)
        sender.start()
        try:
            async with open_page(browser) as page:
                await page.call("Log.enable")
                await page.call("Runtime.enable")
                await page.call("Page.enable")
                await page.call("Page.navigate", url=f"{job.admin}/")
                nodes = await page.wait_for(
                    "document.querySelectorAll('#graph-svg g.node').length", "the job graph"
                )
                assert nodes >= 6  # source, router, keyBy, 2 dispatchers, timers, sink
                labels = await page.evaluate("document.getElementById('graph').textContent")
                assert "http ingress shop/http" in labels and "dispatcher 0/2" in labels
                rate = await page.wait_for(
                    "(() => { const r = document.getElementById('invocation-rate');"
                    " const v = r && parseFloat(r.cells[1].textContent.replace(/,/g, ''));"
                    " return v > 0 ? v : 0; })()",
                    "a positive invocation rate",
                )
                assert rate > 0
                await page.evaluate(
                    "document.getElementById('address').value = 'shop/cart/dave';"
                    "document.getElementById('lookup').requestSubmit(); true"
                )
                state = await page.wait_for(
                    "(document.getElementById('state-values') || {}).textContent",
                    "the state of shop/cart/dave",
                )
                assert '{"apple":1,"pear":1}' in state and "shop.types/items" in state
                # the lookup started recording the address; the page asks again as it polls
                await page.wait_for(
                    "document.getElementById('timeline').textContent.includes('recorded since')",
                    "the timeline recording shop/cart/dave",
                )
                job.send("shop/cart/dave", "fig")
                job.send("shop/cart/dave", "kiwi")
                timeline = await page.wait_for(
                    "document.querySelectorAll('#timeline .invocation').length >= 2 &&"
                    " document.getElementById('timeline').textContent",
                    "the timeline of shop/cart/dave",
                )
                assert "out to shop/audit/dave" in timeline
                figures = await page.evaluate(METRICS_SHOWN)
                assert figures == {
                    "functions": ["shop/cart", "5", "10", "15", "1", "7"],
                    "io": ["shop/http", "ingress", "50", "100", "1.5 s"],
                    "egress": ["shop/out", "egress", "2.5", "5", "-"],
                    "endpoints": ["shop-remote", "9", "1", "2", "12.5 ms"],
                    "checkpoints": ["3", "4.5 ms", "2 KiB"],
                }
                shot = await page.call("Page.captureScreenshot", format="png")
                (tmp_path / "console.png").write_bytes(base64.b64decode(shot["data"]))
                await page.evaluate("true")  # collect the events that came meanwhile
                problems = [
                    json.dumps(e["params"])
                    for e in page.events
                    if e.get("method") in ("Log.entryAdded", "Runtime.exceptionThrown")
                    and (
                        e["method"] == "Runtime.exceptionThrown"
                        or e["params"]["entry"]["level"] == "error"
                    )
                ]
                assert not problems, problems
        finally:
            stop.set()
            sender.join(timeout=10)
    assert (tmp_path / "console.png").stat().st_size > 10_000


async def test_console_asks_for_a_token_once_and_sends_it(browser: int, tmp_path: Path) -> None:
    """Where the admin server answers 401 (a token is set), the page asks for the token,
    keeps it for the tab and sends it as a bearer token with every request. The admin
    server's answers are made to need a token here with the DevTools Fetch domain: every
    request for data without ``Authorization: Bearer s3cret`` gets 401."""
    with admin_job(tmp_path / "job") as job:
        job.send("shop/cart/dave", "apple")
        seen: list[tuple[str, str | None]] = []
        async with open_page(browser) as page:

            async def on_event(message: dict[str, Any]) -> None:
                if message.get("method") != "Fetch.requestPaused":
                    return
                params = message["params"]
                request = params["request"]
                auth = request["headers"].get("Authorization")
                path = request["url"].removeprefix(job.admin)
                seen.append((path, auth))
                if auth == "Bearer s3cret" or path in STATIC:
                    await page.call("Fetch.continueRequest", requestId=params["requestId"])
                else:
                    await page.call(
                        "Fetch.fulfillRequest",
                        requestId=params["requestId"],
                        responseCode=401,
                        responseHeaders=[{"name": "Content-Type", "value": "text/plain"}],
                        body=base64.b64encode(b"a token is needed\n").decode(),
                    )

            page.on_event = on_event
            await page.call("Fetch.enable", patterns=[{"urlPattern": f"{job.admin}/*"}])
            await page.call("Page.navigate", url=f"{job.admin}/")
            await page.wait_for("!document.getElementById('token-form').hidden", "the token form")
            await page.evaluate(
                "document.getElementById('token').value = 's3cret';"
                "document.getElementById('token-form').requestSubmit(); true"
            )
            nodes = await page.wait_for(
                "document.querySelectorAll('#graph-svg g.node').length", "the job graph"
            )
            assert nodes >= 6
            await page.wait_for(
                "document.getElementById('token-form').hidden &&"
                " document.getElementById('invocation-rate') !== null",
                "the figures, once the token was given",
            )
            stored = await page.evaluate("sessionStorage.getItem('pystatefun-admin-token')")
            assert stored == "s3cret"
            assert await page.evaluate("document.getElementById('token').value") == ""
    api = [(path, auth) for path, auth in seen if path in ("/plan", "/status")]
    assert api[0][1] is None  # at first without a token, then always with it
    assert ("/plan", "Bearer s3cret") in api and ("/status", "Bearer s3cret") in api
    first_with = next(i for i, (_path, auth) in enumerate(api) if auth)
    assert all(auth == "Bearer s3cret" for _path, auth in api[first_with:])
