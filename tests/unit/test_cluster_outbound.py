"""Messages to key groups another worker owns leave through ``Outbound`` and leave the
job's in-flight counts as they go, from ``send`` and from ``emit_many`` (whose inlined counts
an ``offer`` must not change under it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from statefun._settings import Settings
from statefun.cluster._config import ClusterConfig, cluster_config
from statefun.cluster._exchange import decode_exchange
from statefun.cluster._worker import Outbound
from statefun.module import load_module
from statefun.runtime._envelope import Envelope
from statefun.runtime._job import Job
from statefun.sdk._types import TypedValue

FNS = Path(__file__).resolve().parents[1] / "integration" / "fns" / "cluster_fns.py"


class Rows:
    """What ``Outbound`` writes to the worker's transaction (a list here)."""

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def write_rows(self, rows: list[Any]) -> None:
        self.rows.extend(rows)


def _job(tmp: Path) -> tuple[Job, ClusterConfig]:
    module = tmp / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: cluster/*\n"
        f"  module: {FNS}:functions\n"
    )
    settings = Settings.load(
        {"cluster.bootstrap_servers": "127.0.0.1:9", "cluster.job_id": "t"}, environ={}
    )
    config = cluster_config(settings)
    assert config is not None
    return Job(load_module(module), settings), config


def test_messages_leave_the_in_flight_counts(tmp_path: Path) -> None:
    async def scenario() -> None:
        job, config = _job(tmp_path)
        rows = Rows()
        outbound = Outbound(job, config, rows)
        job.router.reroute(range(config.max_parallelism), outbound)
        value = TypedValue("io.statefun.types/string", b"\n\x011")
        messages = [(str(i), value) for i in range(25_000)]  # > max_in_flight_messages
        sent, rounds = 0, 0
        while sent < len(messages):
            sent = job.emit_many("cluster/hop", messages, sent)
            await asyncio.sleep(0)
            rounds += 1
            assert rounds < 100, f"the sources' gate stayed shut: {job.pending} in flight"
        for i in range(10):
            job.send(Envelope("cluster/hop", f"s{i}", value, None))
        await asyncio.sleep(0)
        assert job.pending == 0 and job.has_room()
        outbound.flush()  # what is still gathered (full records were written already)
        sent_ids = [e.id for row in rows.rows for e in decode_exchange(row[2])]
        assert sorted(sent_ids) == sorted(
            [str(i) for i in range(25_000)] + [f"s{i}" for i in range(10)]
        )

    asyncio.run(scenario())
