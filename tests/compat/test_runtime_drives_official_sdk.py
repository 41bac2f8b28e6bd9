"""This runtime driving functions written with, and served by, Apache StateFun's own SDK.

The functions file (tests/integration/fns/shop.py) uses only StateFun's SDK names; here it
is served by `apache-flink-statefun==3.3.0` (and by the 3.5.0 fork) in their own
virtualenvs, and the runtime must produce the same results as with its own SDK.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from statefun._settings import Settings
from statefun.module._specs import FunctionTarget, HttpEndpointSpec, ModuleSpec
from statefun.runtime import Job
from tests.integration.test_runtime import SCRIPT, ListSink, ScriptSource, run_job

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

FUNCTIONS = Path(__file__).resolve().parents[1] / "integration" / "fns" / "shop.py"
SERVER = Path(__file__).with_name("official_server.py")


def _serve(python: Path) -> Iterator[str]:
    process = subprocess.Popen(
        [str(python), str(SERVER), str(FUNCTIONS), "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("ready "), f"peer server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/statefun"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module", params=["statefun-3.3.0", "flink-statefun-3.5.0"])
def peer_url(request: pytest.FixtureRequest) -> Iterator[str]:
    fixture = "official_sdk_python" if request.param == "statefun-3.3.0" else "fork_sdk_python"
    python = request.getfixturevalue(fixture)
    yield from _serve(python)


def module(url: str, **kwargs: object) -> ModuleSpec:
    return ModuleSpec(endpoints=(HttpEndpointSpec(FunctionTarget("test", None), url, **kwargs),))  # type: ignore[arg-type]


async def test_state_and_messages_between_functions(peer_url: str) -> None:
    assert sorted(await run_job(module(peer_url), SCRIPT)) == ["a=1", "a=2", "b=1"]


async def test_hot_key_batches_keep_order(peer_url: str) -> None:
    sink = ListSink()
    job = Job(
        module(peer_url, max_num_batch_requests=40),
        Settings(),
        sources=[ScriptSource([("test/counter", "hot", "x")] * 200)],
        sinks=[sink],
    )
    await job.run()
    assert sink.values == [f"hot={i}" for i in range(1, 201)]


async def test_delayed_messages_and_cancellation(peer_url: str) -> None:
    script = [
        ("test/reminder", "keep", "arm"),
        ("test/reminder", "drop", "arm"),
        ("test/reminder", "drop", "disarm"),
    ]
    assert await run_job(module(peer_url), script) == ["fired keep"]


async def test_state_ttl_and_json_state(peer_url: str) -> None:
    script = [
        ("test/ttl", "k", "set:v1"),
        ("test/ttl", "k", "get"),
        ("sleep", 0.5),
        ("test/ttl", "k", "get"),
        ("test/async-echo", "e", "a"),
        ("test/async-echo", "e", "b"),
    ]
    values = await run_job(module(peer_url), script)
    assert [v for v in values if v.startswith("value=")] == ["value=v1", "value=None"]
    assert [v for v in values if not v.startswith("value=")] == ["a", "a|b"]
