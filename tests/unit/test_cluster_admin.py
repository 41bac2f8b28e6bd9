"""A worker's admin port between two assignments (real HTTP on 127.0.0.1, no broker): only
/status answers, naming the worker as rebalancing; the rest is 503 with Retry-After. And the
admin URL a worker publishes in its group subscription, read back."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._admin import WorkerAdmin, address_of
from statefun.cluster._status import Ownership, _admin_url
from statefun.cluster._supervisor import supervise, worker_ports
from statefun.module._specs import HttpIngressSpec, ModuleSpec


def _get(url: str, method: str = "GET", origin: str = "") -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, method=method)
    if origin:
        request.add_header("Origin", origin)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def _owners() -> tuple[str, list[Ownership]]:
    raise AssertionError("a paused worker does not look up owners")


def test_a_paused_worker_answers_status_only() -> None:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:1",
            "cluster.job_id": "shop",
            "cluster.worker_id": "w7",
            "admin_port": "1",  # replaced below by a free port
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None

    async def main() -> None:
        admin = WorkerAdmin(settings, config, owners=_owners)
        admin.port = 0
        await admin.start()
        base = f"http://127.0.0.1:{admin.port}"
        try:
            status, body, _ = await asyncio.to_thread(_get, base + "/status")
            assert status == 200
            worker = json.loads(body)["worker"]
            assert worker["id"] == "w7" and worker["job"] == "shop"
            assert worker["rebalancing"] is True and worker["key_groups"] == []
            assert worker["admin_url"] == base
            for path in ("/metrics", "/state/shop/cart/dave", "/"):
                status, body, headers = await asyncio.to_thread(_get, base + path)
                assert status == 503 and headers["Retry-After"] == "1", (path, body)
                assert b"being reassigned" in body
            status, _, _ = await asyncio.to_thread(_get, base + "/status", "POST")
            assert status == 405
            evil = "http://evil.example"
            status, body, _ = await asyncio.to_thread(_get, base + "/status", "GET", evil)
            assert status == 403 and b"cross-site" in body
        finally:
            await admin.close()

    asyncio.run(main())


def test_address_of_state_and_timeline_paths() -> None:
    assert address_of("/state/shop/cart/dave") == ("shop/cart", "dave")
    assert address_of("/addresses/shop/cart/d%2Fx/timeline") == ("shop/cart", "d/x")
    assert address_of("/state/shop/cart") is None  # a listing: this worker's ids
    assert address_of("/status") is None


class _Subscription:
    def __init__(self, user_data: bytes | None) -> None:
        self.user_data = user_data


def test_the_published_admin_url_is_read_back() -> None:
    published = json.dumps({"admin_url": "http://db-3:8081"})
    assert _admin_url({"topics": ["t"], "user_data": published}) == "http://db-3:8081"
    assert _admin_url(_Subscription(published.encode())) == "http://db-3:8081"
    for junk in (None, {}, {"user_data": ""}, {"user_data": "not json"}, _Subscription(b"[1]")):
        assert _admin_url(junk) == ""
    assert _admin_url({"user_data": json.dumps({"admin_url": "file:///etc"})}) == ""


def test_worker_admin_ports_past_65535_are_refused() -> None:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:1",
            "cluster.job_id": "shop",
            "admin_port": "65534",
        },
        environ={},
    )
    with pytest.raises(ConfigurationError, match=r"admin_port 65534 \+ 3 workers goes past"):
        supervise(ModuleSpec(), settings, [], [], 3)


def test_each_workers_ports_are_one_line() -> None:
    module = ModuleSpec(
        ingresses=(HttpIngressSpec("shop/http", port=8090), HttpIngressSpec("shop/any", port=0))
    )
    assert worker_ports(module, 2, 8083) == (
        "admin port 8083, HTTP ingress shop/http on http://127.0.0.1:8092, "
        "HTTP ingress shop/any on a free port of 127.0.0.1 (in its log)"
    )
    assert worker_ports(ModuleSpec(), 0, 0) == "no port"
