"""Each worker of a clustered job serves its own admin port on a real broker: its /status
names the worker and the key groups it owns, /metrics counts its invocations, a state or
timeline lookup answers on the owner of the address's key group and names the owner and its
admin URL (421) on the other worker. A worker's counters go on across a rebalance."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statefun._keygroups import key_group_for
from tests._support import free_port
from tests.integration.test_cluster_workers import Cluster, model_counts, read_outputs
from tests.integration.test_console_browser import browser, open_page  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
MESSAGES = 300


class AdminCluster(Cluster):
    """Workers with an admin port each."""

    def __init__(self, tmp: Path, bootstrap: str) -> None:
        super().__init__(tmp, bootstrap)
        self.ports = {"w0": free_port(), "w1": free_port()}

    def settings(self, worker: str) -> dict[str, str]:
        settings = super().settings(worker)
        if worker in getattr(self, "ports", {}):
            settings["admin_port"] = str(self.ports[worker])
        return settings

    def get(self, worker: str, path: str) -> tuple[int, Any, dict[str, str]]:
        url = f"http://127.0.0.1:{self.ports[worker]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                status, body, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, body, headers = exc.code, exc.read(), exc.headers
        kind = headers.get("Content-Type", "")
        data = json.loads(body) if kind.startswith("application/json") else body.decode()
        return status, data, dict(headers)


@pytest.fixture
def cluster(tmp_path: Path, bootstrap: str) -> Iterator[AdminCluster]:
    made = AdminCluster(tmp_path, bootstrap)
    try:
        yield made
    finally:
        made.close()


def _settled(cluster: AdminCluster, seconds: float = 60) -> dict[str, dict[str, Any]]:
    """Both workers' ``worker`` status once they own disjoint key groups covering all."""
    deadline = time.monotonic() + seconds
    while True:
        seen: dict[str, dict[str, Any]] = {}
        for worker in cluster.ports:
            try:
                status, data, _ = cluster.get(worker, "/status")
            except OSError:
                continue
            if status == 200 and not data["worker"]["rebalancing"]:
                seen[worker] = data["worker"]
        groups = [set(w["key_groups"]) for w in seen.values()]
        if len(groups) == 2 and not groups[0] & groups[1] and len(groups[0] | groups[1]) == 128:
            return seen
        assert time.monotonic() < deadline, f"the workers did not settle: {seen}"
        time.sleep(0.3)


async def _console_names_the_owner(devtools: int, cluster: AdminCluster, worker: str) -> None:
    """The console of ``worker`` shows its key groups, and a lookup of an address another
    worker owns links that worker's console."""
    key_group = key_group_for("cluster/hop", "0", 128)
    async with open_page(devtools) as page:
        await page.call("Runtime.enable")
        await page.call("Page.navigate", url=f"http://127.0.0.1:{cluster.ports[worker]}/")
        shown = await page.wait_for(
            "!document.getElementById('worker-section').hidden &&"
            " document.getElementById('worker').textContent",
            "the worker panel",
        )
        assert f"worker{worker}" in shown and "key groups" in shown and "of 128" in shown
        await page.evaluate(
            "document.getElementById('address').value = 'cluster/hop/0';"
            "document.getElementById('lookup').requestSubmit(); true"
        )
        text = await page.wait_for(
            "(document.getElementById('state') || {}).textContent", "the owner of the address"
        )
        link = await page.evaluate("document.getElementById('owner-link').href")
        owner = next(w for w in cluster.ports if w != worker)
        assert f"key group {key_group} is owned by worker {owner}" in text
        assert link == f"http://127.0.0.1:{cluster.ports[owner]}/"


def test_each_worker_serves_its_key_groups_and_names_the_owner(
    cluster: AdminCluster,
    browser: int,  # noqa: F811
) -> None:
    for worker in ("w0", "w1"):
        cluster.start(worker)
    cluster.wait_assigned(["w0", "w1"])
    workers = _settled(cluster)
    for worker, info in workers.items():
        assert info["id"] == worker and info["job"] == cluster.job_id
        assert info["admin_url"] == f"http://127.0.0.1:{cluster.ports[worker]}"
        assert len(info["partitions"]) == 4 and len(info["input_partitions"]) == 2
    for id_ in ("0", "7"):  # a timeline records an address from its first lookup on
        key_group = key_group_for("cluster/hop", id_, 128)
        owner = next(w for w, info in workers.items() if key_group in info["key_groups"])
        assert cluster.get(owner, f"/addresses/cluster/hop/{id_}/timeline")[0] == 200
    cluster.feed(0, MESSAGES)
    seen = read_outputs(cluster.bootstrap, cluster.output, MESSAGES, 90)
    assert sum(seen.values()) == MESSAGES
    assert _settled(cluster) == workers  # no rebalance since: the counts below are whole

    invocations = 0
    for worker in ("w0", "w1"):
        status, text, headers = cluster.get(worker, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain"), text
        counted = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith('pystatefun_function_invocations_total{function="cluster/hop"')
        ]
        assert counted and counted[0] > 0, f"{worker}: {text[:2000]}"
        invocations += int(counted[0])
        status, page, _ = cluster.get(worker, "/")
        assert status == 200 and "pystatefun console" in page
    model = model_counts(MESSAGES)
    assert invocations == sum(model.values())

    for id_ in ("0", "7"):
        key_group = key_group_for("cluster/hop", id_, 128)
        owner = next(w for w, info in workers.items() if key_group in info["key_groups"])
        other = next(w for w in workers if w != owner)
        status, found, _ = cluster.get(owner, f"/state/cluster/hop/{id_}")
        assert status == 200, found
        assert found["values"]["count"]["value"] == model[("cluster/hop", id_)]
        status, timeline, _ = cluster.get(owner, f"/addresses/cluster/hop/{id_}/timeline")
        assert status == 200 and timeline["invocations"], timeline
        for path in (f"/state/cluster/hop/{id_}", f"/addresses/cluster/hop/{id_}/timeline"):
            status, refused, _ = cluster.get(other, path)
            assert status == 421, refused
            assert refused["owner"] == owner and refused["key_group"] == key_group, refused
            assert f"owned by worker {owner}" in refused["error"]
            assert refused["admin_url"] == f"http://127.0.0.1:{cluster.ports[owner]}", refused

    owner_of_0 = next(
        w
        for w, info in workers.items()
        if key_group_for("cluster/hop", "0", 128) in info["key_groups"]
    )
    asyncio.run(
        _console_names_the_owner(browser, cluster, next(w for w in workers if w != owner_of_0))
    )


def _invocations(cluster: AdminCluster, worker: str) -> tuple[int, float]:
    """The worker's invocations of ``cluster/hop``: by ``/status``, by ``/metrics``."""
    status, data, _ = cluster.get(worker, "/status")
    assert status == 200, data
    status, text, _ = cluster.get(worker, "/metrics")
    assert status == 200, text
    counted = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('pystatefun_function_invocations_total{function="cluster/hop"')
    ]
    return data["functions"]["cluster/hop"]["invocations"], sum(counted)


def test_a_workers_counters_go_on_across_a_rebalance(cluster: AdminCluster) -> None:
    cluster.start("w0")
    deadline = time.monotonic() + 60
    while True:  # alone, w0 owns every key group
        with contextlib.suppress(OSError):
            status, data, _ = cluster.get("w0", "/status")
            if status == 200 and len(data["worker"]["key_groups"]) == 128:
                break
        assert time.monotonic() < deadline, "w0 was never assigned every key group"
        time.sleep(0.3)
    cluster.feed(0, MESSAGES)
    assert sum(read_outputs(cluster.bootstrap, cluster.output, MESSAGES, 90).values()) == MESSAGES
    by_status, by_metrics = before = _invocations(cluster, "w0")
    assert by_status == by_metrics == sum(model_counts(MESSAGES).values())
    generation = data["worker"]["generation"]
    cluster.start("w1")  # a rebalance: w0 runs a new job for half the key groups
    workers = _settled(cluster)
    assert workers["w0"]["generation"] > generation
    after = _invocations(cluster, "w0")
    assert after[0] >= before[0] and after[1] >= before[1], (before, after)
