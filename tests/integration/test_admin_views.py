"""The admin port's read-only views against a running job: decoded state, paging through the
ids of a type, the per-address timeline, the console's files and the job graph, and
``statefun state`` against the admin port and against a savepoint."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import serve_functions
from tests.integration._admin_job import AdminJob, admin_job, wait_for
from tests.integration.test_http_defences import ROOT, STATEFUN

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminJob]:
    with admin_job(tmp_path_factory.mktemp("admin-views")) as running:
        # an address's timeline is recorded from its first lookup on
        for address in ("shop/cart/dave", "shop/audit/dave"):
            status, timeline, _ = _get(running, f"/addresses/{address}/timeline")
            assert status == 200 and timeline["invocations"] == [], timeline
            assert timeline["recorded_since_ms"] <= time.time() * 1000
            assert timeline["every_invocation"] is False
        for item in ("apple", "apple", "pear"):
            running.send("shop/cart/dave", item)
        for name in ("ann", "bob", "cy", "dee", "eve", "fay"):
            running.send(f"shop/cart/{name}", "fig")
        wait_for(lambda: _status(running, "/state/shop/audit/dave") == 200, "the audit")
        yield running


def _get(job: AdminJob, path: str) -> tuple[int, Any, dict[str, str]]:
    try:
        with urllib.request.urlopen(f"{job.admin}{path}", timeout=30) as response:
            body = response.read()
            data = (
                json.loads(body) if response.headers["Content-Type"] == "application/json" else body
            )
            return response.status, data, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def _status(job: AdminJob, path: str) -> int:
    return _get(job, path)[0]


def test_state_is_decoded_with_its_deadlines(job: AdminJob) -> None:
    status, found, _ = _get(job, "/state/shop/cart/dave")
    assert status == 200, found
    assert found["address"] == "shop/cart/dave"
    values = found["values"]
    assert values["items"] == {
        "typename": "shop.types/items",
        "encoding": "json",
        "value": {"apple": 2, "pear": 1},
    }
    count = values["count"]
    assert (count["typename"], count["encoding"], count["value"]) == (
        "io.statefun.types/int",
        "builtin",
        3,
    )
    assert count["expires_at_ms"] > time.time() * 1000 + 3_000_000  # an hour after the write
    status, text, _ = _get(job, "/state/shop/cart/nobody")
    assert status == 404 and "no state for shop/cart/nobody" in text


def test_ids_page_through_a_type(job: AdminJob) -> None:
    everyone: list[str] = []
    after = ""
    while True:
        status, page, _ = _get(job, f"/state/shop/cart?limit=2&after={after}")
        assert status == 200, page
        everyone += page["ids"]
        if page["next"] is None:
            break
        after = page["next"]
    assert sorted(everyone) == ["ann", "bob", "cy", "dave", "dee", "eve", "fay"]
    assert len(set(everyone)) == len(everyone)
    status, text, _ = _get(job, "/state/shop/cart?limit=0")
    assert status == 400 and "limit must be an integer 1-1000" in text


def test_timeline_shows_what_each_invocation_did(job: AdminJob) -> None:
    status, timeline, _ = _get(job, "/addresses/shop/cart/dave/timeline")
    assert status == 200, timeline
    invocations = timeline["invocations"]
    assert [i["messages_in"][0]["preview"] for i in invocations] == ["apple", "apple", "pear"]
    last = invocations[-1]
    assert last["messages_in"][0]["caller"] is None  # from the ingress
    assert {s["name"] for s in last["state"]} == {"items", "count"}
    count = next(s for s in last["state"] if s["name"] == "count")
    assert count["value"]["preview"] == 3
    assert last["messages_out"] == [
        {
            "target": "shop/audit/dave",
            "typename": "io.statefun.types/string",
            "size": 6,
            "preview": "pear",
            "encoding": "builtin",
        }
    ]
    assert last["delayed"][0]["target"] == "shop/audit/reminder"
    assert last["delayed"][0]["delay_ms"] == 3_600_000
    assert last["egress"][0]["egress"] == "shop/out" and last["egress"][0]["records"] == 1
    assert last["duration_ms"] >= 0 and last["error"] is None
    status, audit, _ = _get(job, "/addresses/shop/audit/dave/timeline")
    assert audit["invocations"][0]["messages_in"][0]["caller"] == "shop/cart/dave"
    status, bob, _ = _get(job, "/addresses/shop/cart/bob/timeline")
    assert status == 200 and bob["invocations"] == []  # invoked before its first lookup


def test_console_files_and_plan(job: AdminJob) -> None:
    status, page, headers = _get(job, "/")
    assert status == 200 and b"/console.js" in page
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    status, _script, headers = _get(job, "/console.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    status, plan, _ = _get(job, "/plan")
    kinds = {node["kind"] for node in plan["nodes"]}
    assert kinds == {"source", "operator", "dispatcher", "sink"}
    assert any(edge["label"] == "feedback" for edge in plan["edges"])
    assert _status(job, "/nothing") == 404


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STATEFUN, "state", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_state_command_against_the_job_and_a_savepoint(job: AdminJob) -> None:
    found = _cli("get", "shop/cart/dave", "--admin-url", job.admin)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["values"]["items"]["value"] == {"apple": 2, "pear": 1}
    table = _cli("get", "shop/cart/dave", "--admin-url", job.admin, "--format", "table")
    assert '{"apple": 2, "pear": 1}' in table.stdout and "expires_at_ms=" in table.stdout
    listed = _cli(
        "list", "shop/cart", "--admin-url", job.admin, "--limit", "3", "--format", "table"
    )
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 4  # 3 and "(more...)"
    missing = _cli("get", "shop/cart/nobody", "--admin-url", job.admin)
    assert (
        missing.returncode == 1
        and missing.stderr == "statefun state: no state for shop/cart/nobody\n"
    )

    request = urllib.request.Request(f"{job.admin}/savepoints", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        savepoint = json.loads(response.read())["path"]
    offline = _cli("get", "shop/cart/dave", "--from", savepoint)
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout) == json.loads(found.stdout) | {
        "values": json.loads(offline.stdout)["values"]
    }
    assert json.loads(offline.stdout)["values"]["count"]["value"] == 3
    pages = _cli("list", "shop/cart", "--from", savepoint, "--limit", "4")
    first = json.loads(pages.stdout)
    rest = json.loads(
        _cli("list", "shop/cart", "--from", savepoint, "--after", first["next"]).stdout
    )
    assert sorted(first["ids"] + rest["ids"]) == ["ann", "bob", "cy", "dave", "dee", "eve", "fay"]
    assert rest["next"] is None
    latest = _cli("get", "shop/audit/dave", "--from", str(job.folder / "checkpoints"))
    assert latest.returncode == 0, latest.stderr
    bad = _cli("get", "shop/cart", "--from", savepoint)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_timeline_off(tmp_path: Path) -> None:
    with admin_job(tmp_path, "timeline_invocations=0") as running:
        running.send("shop/cart/dave", "apple")
        wait_for(lambda: _status(running, "/state/shop/cart/dave") == 200, "the state")
        status, text, _ = _get(running, "/addresses/shop/cart/dave/timeline")
        assert status == 409 and "timeline_invocations" in text


def test_remote_functions_state_and_timeline(tmp_path: Path) -> None:
    functions = ROOT / "tests" / "integration" / "fns" / "inspect_fns.py"
    with (
        serve_functions(functions, ROOT) as url,
        # every invocation kept in the job's ring: found without a lookup before
        admin_job(tmp_path, "timeline_entries=1000", remote=url) as running,
    ):
        for item in ("apple", "pear", "fig"):
            running.send("shop/cart/rita", item)
        wait_for(
            lambda: (
                _status(running, "/state/shop/audit/rita") == 200
                and _get(running, "/state/shop/audit/rita")[1]["values"]["seen"]["value"] == 3
            ),
            "the audits",
        )
        status, found, _ = _get(running, "/state/shop/cart/rita")
        assert status == 200, found
        assert found["values"]["items"]["value"] == {"apple": 1, "pear": 1, "fig": 1}
        assert found["values"]["items"]["encoding"] == "json"  # remote: by its look
        status, timeline, _ = _get(running, "/addresses/shop/cart/rita/timeline")
        assert status == 200, timeline
        assert timeline["every_invocation"] is True
        invocations = timeline["invocations"]
        # a remote batch is one invocation with its messages in
        assert sum(i["messages_in_count"] for i in invocations) == 3
        assert [m["preview"] for i in invocations for m in i["messages_in"]] == [
            "apple",
            "pear",
            "fig",
        ]
        last = invocations[-1]
        assert {s["name"] for s in last["state"]} == {"items", "count"}
        assert last["messages_out"][-1]["target"] == "shop/audit/rita"
        assert last["delayed"][-1]["delay_ms"] == 3_600_000
        assert last["egress"][-1]["egress"] == "shop/out"
