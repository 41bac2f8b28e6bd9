"""A job on the toy state backend (tests/toy_state.py): state, a checkpoint, a restore.

The backend is registered by importing its module; the job takes it as ``state=``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from statefun._settings import Settings
from statefun.module._specs import ModuleSpec
from statefun.runtime import Job
from statefun.state._registry import create_backend, kind
from tests import toy_state
from tests.integration.test_runtime import ListSink, ScriptSource, embedded


async def run(tmp_path: Path, script: list[tuple[str, str, str]]) -> tuple[Job, list[str]]:
    sink = ListSink()
    state = create_backend(toy_state.NAME, str(tmp_path / "state"))
    assert isinstance(state, toy_state.ToyStateBackend)
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        Settings(checkpoint_dir=str(tmp_path / "checkpoints"), checkpoint_interval_ms=60_000),
        sources=[ScriptSource(script)],
        sinks=[sink],
        state=state,
    )
    await asyncio.wait_for(job.run(), 30)
    return job, sink.values


async def test_a_job_keeps_state_on_the_toy_backend_across_a_restart(tmp_path: Path) -> None:
    assert kind(toy_state.NAME) is toy_state.KIND
    job, values = await run(tmp_path, [("test/counter", "a", "x"), ("test/counter", "a", "x")])
    assert values == ["a=1", "a=2"]
    assert job.checkpoints is not None and job.checkpoints.completed >= 1  # the last one
    last = job.checkpoints.last
    assert last is not None and last.metadata["state"]["backend"] == toy_state.NAME
    # a new process: the toy backend restores what the last checkpoint holds
    _, values = await run(tmp_path, [("test/counter", "a", "x"), ("test/counter", "b", "x")])
    assert values == ["a=3", "b=1"]
