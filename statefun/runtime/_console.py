"""The admin port's read-only views: the console page, the job graph, state and timelines.

* ``GET /``: the console, one static page (``console-page/index.html`` with ``console.js`` and
  ``console.css``, ``favicon.svg``, package data; plain JS, no build step) under a strict
  Content-Security-Policy: everything from the admin server itself, nothing inline, no frames.
  It polls ``GET /status`` and draws what it finds there.
* ``GET /plan``: the job graph as JSON (``_graph.Plan.to_json``).
* ``GET /state/...``: queryable state (``_state_view.py``).
* ``GET /addresses/<namespace>/<type>/<id>/timeline``: the timeline (``_timeline.py``).

``AdminViews`` is what the admin server (``_admin.py``) asks for the paths it does not serve
itself: ``method(path)`` (None: not one of these) and ``handle(request)``.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from statefun._http.server import Reply, Request, plain
from statefun.runtime._graph import make_plan
from statefun.runtime._state_view import StateView, StateViewJob
from statefun.runtime._timeline import TimelineView

if TYPE_CHECKING:
    from statefun.module._specs import ModuleSpec
    from statefun.runtime._timeline import Timeline

__all__ = ["CONTENT_SECURITY_POLICY", "AdminViews", "ConsoleJob"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: path -> (file under console-page/, content type)
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
_PAGE_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
)


class ConsoleJob(StateViewJob, Protocol):
    """What the views need of the job (``runtime/_job.py``'s ``Job``)."""

    @property
    def module(self) -> ModuleSpec: ...
    @property
    def timeline(self) -> Timeline | None: ...


def _static(name: str) -> bytes:
    return (resources.files("statefun.runtime") / "console-page" / name).read_bytes()


def _json(data: Any) -> Reply:
    return Reply(
        200, "application/json", json.dumps(data).encode(), (("Cache-Control", "no-store"),)
    )


class AdminViews:
    """The read-only views of the admin port (see the module docstring)."""

    def __init__(self, job: ConsoleJob) -> None:
        self.job = job
        self.state = StateView(job)
        self.timeline = TimelineView(job.timeline)
        self._files: dict[str, bytes] = {}

    @staticmethod
    def method(path: str) -> str | None:
        """``GET`` for a path these views serve, else None."""
        if path in _STATIC or path == "/plan" or path.startswith("/state/"):
            return "GET"
        if path.startswith("/addresses/") and path.endswith("/timeline"):
            return "GET"
        return None

    def handle(self, request: Request) -> Reply | Coroutine[Any, Any, Reply]:
        path = request.path
        static = _STATIC.get(path)
        if static is not None:
            name, content_type = static
            body = self._files.get(name)
            if body is None:
                body = self._files[name] = _static(name)
            return Reply(200, content_type, body, _PAGE_HEADERS)
        if path == "/plan":
            return _json(make_plan(self.job.module, self.job.settings).to_json())
        if path.startswith("/state/"):
            return self.state.handle(path[len("/state/") :].split("/"), request.query)
        return self._timeline(path[len("/addresses/") : -len("/timeline")].split("/"))

    async def _timeline(self, segments: list[str]) -> Reply:
        status, answer = await self.timeline.handle(segments)
        return _json(answer) if status == 200 else plain(status, answer)
