"""Damaged checkpoints: restore verifies every file and falls back to the next older one.

A first run crashes right after its third checkpoint committed (so the output file holds that
checkpoint's transaction, and the HTTP ingress's WAL was trimmed for it); the newest
checkpoint is then damaged on disk in one way or another, and a second run on the same folders
must restore the one before it, say which it skipped and why, and finish with every effect
exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._exceptions import CheckpointDamagedError, JobFailedError
from statefun._settings import Settings
from statefun.checkpoint import SimulatedCrash
from statefun.checkpoint.storage import CheckpointStorage
from statefun.egress.file import FileSink
from statefun.ingress._wal import WriteAheadLog
from statefun.ingress.http import HttpSource
from statefun.module._specs import ModuleSpec
from statefun.runtime import Job
from statefun.state._registry import read_snapshot
from tests.integration.test_checkpoints import (
    Paced,
    embedded,
    expected,
    make_job,
    output,
    write_input,
)
from tests.integration.test_savepoints_and_wal import take_savepoint_midway, wait_port

pytestmark = pytest.mark.timeout(120)

IDS, PER_ID = 20, 3000
CRASH_AFTER = 3


def folder(tmp: Path, checkpoint_id: int) -> Path:
    return tmp / "checkpoints" / f"chk-{checkpoint_id:06d}"


def job_for(tmp: Path, backend: str, hook: Any = None) -> Job:
    return make_job(
        tmp, embedded(), hook, state_backend=backend, state_dir=str(tmp / f"state-{backend}")
    )


async def crash_after(tmp: Path, backend: str, checkpoint_id: int) -> None:
    """Run until checkpoint ``checkpoint_id`` committed, then stop as if killed."""
    source = Paced("test/in", tmp / "in.jsonl")

    def crash(name: str, done: int) -> None:
        if name == "committed":
            source.committed.set()
            if done == checkpoint_id:
                raise SimulatedCrash(f"crash after checkpoint {done}")

    job = make_job(
        tmp,
        embedded(),
        crash,
        source=source,
        state_backend=backend,
        state_dir=str(tmp / f"state-{backend}"),
    )
    with pytest.raises(JobFailedError, match="crash after checkpoint"):
        await asyncio.wait_for(job.run(), timeout=60)
    # What a restart does first: a complete checkpoint whose metadata kept its temporary name
    # (the crash came before the rename) is verified whole and takes its name.
    CheckpointStorage(tmp / "checkpoints").prepare()
    assert (folder(tmp, checkpoint_id) / "_metadata").is_file()


# -- ways to damage a file ----------------------------------------------------------------


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def garbage(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(path.stat().st_size))


def flip(path: Path) -> None:
    """One byte changed in the middle (the file keeps its size)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


def edit_metadata(path: Path) -> None:
    """A value changed in the metadata: still valid JSON."""
    metadata = json.loads(path.read_text())
    metadata["created_ms"] += 1
    path.write_text(json.dumps(metadata, indent=1))


def own_file(state: Path, pattern: str) -> Path:
    """A file of ``state`` that no other checkpoint links (damaging it in place damages only
    this checkpoint)."""
    owned = sorted(p for p in state.glob(pattern) if p.stat().st_nlink == 1)
    assert owned, f"no file {pattern} of {state} is this checkpoint's own"
    return owned[-1]


MEMORY: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # name: (file, damage, what the log line must say)
    "truncated-state": ("state/state.msgpack", truncate, r"\d+ bytes, \d+ expected"),
    "garbage-state": ("state/state.msgpack", garbage, "checksum mismatch"),
    "flipped-state": ("state/state.msgpack", flip, "checksum mismatch"),
    "deleted-state": ("state/state.msgpack", delete, "missing"),
    "truncated-cut": ("cut.msgpack", truncate, r"\d+ bytes, \d+ expected"),
    "deleted-cut": ("cut.msgpack", delete, "missing"),
    "garbage-metadata": ("_metadata", garbage, "not valid JSON"),
    "edited-metadata": ("_metadata", edit_metadata, "checksum mismatch"),
}


def assert_fell_back(caplog: pytest.LogCaptureFixture, name: str, why: str) -> None:
    damaged = re.escape(f"chk-{CRASH_AFTER:06d}")
    lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(lines) == 1, lines
    assert re.search(f"{damaged} is damaged and is skipped: {re.escape(name)}: {why}", lines[0])
    restored = [r.getMessage() for r in caplog.records if "in place of the damaged" in r.message]
    assert len(restored) == 1
    assert re.search(
        f"restored checkpoint {CRASH_AFTER - 1} .* in place of the damaged {damaged}",
        restored[0],
    )


@pytest.mark.parametrize("damage", sorted(MEMORY))
async def test_memory_backend_falls_back_past_a_damaged_newest_checkpoint(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_input(tmp_path / "in.jsonl", IDS, PER_ID)
    await crash_after(tmp_path, "memory", CRASH_AFTER)
    name, how, why = MEMORY[damage]
    how(folder(tmp_path, CRASH_AFTER) / name)
    caplog.set_level(logging.INFO)
    await job_for(tmp_path, "memory").run()
    assert_fell_back(caplog, name, why)
    assert output(tmp_path / "out.jsonl") == expected(IDS, PER_ID)


def own_tail(newest: Path, older: Path) -> tuple[Path, int, int]:
    """The chain's changelog file in checkpoint ``newest`` and the range of its bytes that
    only ``newest`` holds: ``older`` (the checkpoint before) holds a prefix of the same file,
    later checkpoints append to it."""
    log = json.loads((newest / "_metadata").read_text())["state"]["log"]
    before = json.loads((older / "_metadata").read_text())["state"]["log"]
    start = before["size"] if before is not None and before["name"] == log["name"] else 0
    assert log["size"] > start
    return newest / "state" / log["name"], start, log["size"]


def truncate_tail(path: Path, start: int, end: int) -> None:
    os.truncate(path, (start + end) // 2)


def flip_tail(path: Path, start: int, end: int) -> None:
    with path.open("r+b") as file:
        file.seek((start + end) // 2)
        byte = file.read(1)
        file.seek((start + end) // 2)
        file.write(bytes([byte[0] ^ 0x20]))


ROCKSDB: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # the changelog: only the newest checkpoint's own bytes (the tail); see own_tail
    "truncated-delta": ("delta-*.msgpack", truncate, r"\d+ bytes, \d+ expected"),
    "flipped-delta": ("delta-*.msgpack", flip, "checksum mismatch"),
    "deleted-delta": ("delta-*.msgpack", delete, "missing"),
    "deleted-manifest": ("MANIFEST-*", delete, "missing"),
    "truncated-cut": ("../cut.msgpack", truncate, r"\d+ bytes, \d+ expected"),
}


async def crashed_with_changes(tmp_path: Path, backend: str) -> Path:
    """The folder of a run that crashed after checkpoint CRASH_AFTER, whose state has changes
    of its own: with RocksDB a chain (the files it links and a delta of its own), in memory
    at least one address. On a loaded machine a checkpoint can be cut before any record of the
    chunk after the previous commit is handled (nothing of its own; every checkpoint empty if
    the source had not started): then the run is made again, in a fresh folder."""
    for attempt in range(3):
        tmp = tmp_path / f"run-{attempt}"
        tmp.mkdir()
        write_input(tmp / "in.jsonl", IDS, PER_ID)
        await crash_after(tmp, backend, CRASH_AFTER)
        newest = folder(tmp, CRASH_AFTER)
        manifest = json.loads((newest / "_metadata").read_text())["state"]
        if backend == "rocksdb":
            assert not manifest["materialized"]
            if manifest["log"]:
                return tmp
        elif any(True for _ in read_snapshot(newest / "state", manifest, None)):
            return tmp
    pytest.fail(f"checkpoint {CRASH_AFTER} had no changes of its own in 3 runs")


@pytest.mark.parametrize("damage", sorted(ROCKSDB))
async def test_rocksdb_backend_falls_back_past_a_damaged_newest_checkpoint(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_path = await crashed_with_changes(tmp_path, "rocksdb")
    newest = folder(tmp_path, CRASH_AFTER)
    pattern, how, why = ROCKSDB[damage]
    if pattern.startswith("../"):
        target = newest / pattern[3:]
        how(target)
    elif how is delete:  # removing a linked name leaves the other checkpoints' links
        target = sorted((newest / "state").glob(pattern))[-1]
        how(target)
    elif pattern.startswith("delta-"):
        target, start, end = own_tail(newest, folder(tmp_path, CRASH_AFTER - 1))
        (truncate_tail if how is truncate else flip_tail)(target, start, end)
    else:
        target = own_file(newest / "state", pattern)
        how(target)
    caplog.set_level(logging.INFO)
    await job_for(tmp_path, "rocksdb").run()
    assert_fell_back(caplog, str(target.relative_to(newest)), why)
    assert output(tmp_path / "out.jsonl") == expected(IDS, PER_ID)


@pytest.mark.parametrize("how", [flip, delete], ids=["flipped", "deleted"])
async def test_rocksdb_damaged_sst_of_its_own_materialization(
    tmp_path: Path, how: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    """The first checkpoint after a restart materializes with files of its own: one changed
    byte in one of its SSTs, or one of them gone, sends the restore back to the checkpoint
    before it."""
    write_input(tmp_path / "in.jsonl", IDS, PER_ID)
    await crash_after(tmp_path, "rocksdb", CRASH_AFTER - 1)
    await crash_after(tmp_path, "rocksdb", CRASH_AFTER)
    newest = folder(tmp_path, CRASH_AFTER)
    assert json.loads((newest / "_metadata").read_text())["state"]["materialized"]
    target = own_file(newest / "state", "*.sst")
    how(target)
    caplog.set_level(logging.INFO)
    await job_for(tmp_path, "rocksdb").run()
    why = "checksum mismatch" if how is flip else "missing"
    assert_fell_back(caplog, str(target.relative_to(newest)), why)
    assert output(tmp_path / "out.jsonl") == expected(IDS, PER_ID)


async def test_no_intact_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    """A file every retained checkpoint links (hard links of one chain), changed in place,
    damages all of them: the job does not start (nor start empty), and says why for each."""
    write_input(tmp_path / "in.jsonl", IDS, PER_ID)
    await crash_after(tmp_path, "rocksdb", CRASH_AFTER)
    shared = [
        p
        for p in (folder(tmp_path, CRASH_AFTER) / "state").glob("MANIFEST-*")
        if p.stat().st_nlink >= CRASH_AFTER
    ]
    assert shared
    flip(shared[0])
    before = (tmp_path / "out.jsonl").read_bytes()
    with pytest.raises(CheckpointDamagedError) as raised:
        await job_for(tmp_path, "rocksdb").run()
    message = str(raised.value)
    assert "\n" not in message
    assert "no retained checkpoint is intact" in message
    for checkpoint_id in range(1, CRASH_AFTER + 1):
        assert f"chk-{checkpoint_id:06d}: state/{shared[0].name}: checksum mismatch" in message
    assert (tmp_path / "out.jsonl").read_bytes() == before  # nothing recovered or written


async def test_a_damaged_savepoint_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    write_input(tmp_path / "in.jsonl", ids=5, per_id=600)
    savepoint = await take_savepoint_midway(tmp_path)
    truncate(savepoint / "state" / "state.msgpack")
    job = make_job(tmp_path, embedded())
    job.restore_from = savepoint
    damaged = savepoint / "state" / "state.msgpack"
    with pytest.raises(CheckpointDamagedError) as raised:
        await job.run()
    assert re.fullmatch(
        re.escape(f"{damaged}: {damaged.stat().st_size} bytes, ")
        + r"\d+ expected \(truncated or changed\)",
        str(raised.value),
    )
    assert job.restored_positions == {}  # no checkpoint was restored in its place


# -- the HTTP ingress's WAL: records the older checkpoint needs are kept -------------------


def wal_job(tmp: Path) -> tuple[Job, HttpSource]:
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        # Checkpoints only when the test takes them.
        Settings(
            checkpoint_dir=str(tmp / "checkpoints"),
            checkpoint_interval_ms=600_000,
            idle_checkpoint_delay_ms=0,
        ),
        sinks=[FileSink("test/out", tmp / "out.jsonl")],
    )
    source = HttpSource("test/http", port=0, replies=job.replies, wal_dir=tmp / "wal")
    assert source.wal is not None
    source.wal.segment_bytes = 1  # a segment per group commit: trimming deletes at once
    job.sources = [source]
    return job, source


async def settle(job: Job, source: HttpSource, seq: int) -> None:
    for _ in range(500):
        if job.pending == 0 and source.position >= seq:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the job did not process what it acknowledged")


async def test_wal_keeps_what_the_oldest_retained_checkpoint_needs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, source = wal_job(tmp_path)
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    acked = 0
    async with aiohttp.ClientSession() as http:
        for round_ in range(CRASH_AFTER):
            for _ in range(20):
                async with http.post(
                    f"{url}/messages/test/counter/a",
                    data=str(acked),
                    headers={"Content-Type": "text/plain"},
                ) as response:
                    assert response.status == 202
                    acked += 1
            await settle(job, source, acked)
            assert job.checkpoints is not None
            done = await job.checkpoints.checkpoint()
            assert done.id == round_ + 1
    job._crashed = True  # as if killed right after the third checkpoint
    job.fail(SimulatedCrash("killed"))
    with pytest.raises(JobFailedError):
        await running
    assert len(list((tmp_path / "wal").glob("wal-*.log"))) < acked  # trimming happened
    garbage(folder(tmp_path, CRASH_AFTER) / "state" / "state.msgpack")
    caplog.set_level(logging.INFO)
    job, source = wal_job(tmp_path)
    running = asyncio.create_task(job.run())
    await wait_port(source)
    await settle(job, source, acked)
    job.stop()
    await running
    assert_fell_back(caplog, "state/state.msgpack", "checksum mismatch")
    # Every acknowledged message counts once: the ones after checkpoint 2 came from the WAL.
    assert output(tmp_path / "out.jsonl") == Counter(f"a={n}" for n in range(1, acked + 1))


def test_wal_trims_only_what_every_retained_checkpoint_covers(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=1, retained=2)
    wal.open()
    seqs = [wal.append([["test/counter", "a", None, "t", True, b"x"]]) for _ in range(6)]
    assert wal.trim(seqs[1]) == 0  # one checkpoint: nothing older to keep records for yet
    wal.trim(seqs[3])  # two checkpoints: records after the older one (seq 2) stay
    assert [r[0] for r in wal.read_after(seqs[1])] == seqs[2:]
    wal.trim(seqs[5])
    assert [r[0] for r in wal.read_after(seqs[3])] == seqs[4:]
    assert min(r[0] for r in wal.read_after(0)) > seqs[1]
    wal.close()


# -- checkpoints written before checksums: damage found while decoding ---------------------


def strip_checksums(metadata_path: Path) -> None:
    """Make a checkpoint look written by a version without checksums (format 2)."""
    metadata = json.loads(metadata_path.read_text())
    for key in ("files", "checksum", "metadata_crc32c"):
        del metadata[key]
    metadata["format"] = 2
    metadata_path.write_text(json.dumps(metadata, indent=1))


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
async def test_a_half_restored_checkpoint_is_undone_before_the_older_one(
    tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without checksums the damage shows only while the state is read, half of it loaded
    already: that half is dropped (StateBackend.clear) before the older checkpoint."""
    tmp_path = await crashed_with_changes(tmp_path, backend)
    newest = folder(tmp_path, CRASH_AFTER)
    strip_checksums(newest / "_metadata")
    if backend == "memory":
        target, start = newest / "state" / "state.msgpack", 0
    else:  # the newest checkpoint's own bytes of the chain's changelog
        target, start, _ = own_tail(newest, folder(tmp_path, CRASH_AFTER - 1))
    data = target.read_bytes()  # the last third spoiled (0xc1: no msgpack value), same size
    cut = start + (len(data) - start) * 2 // 3
    with target.open("r+b") as file:  # in place: other checkpoints link the changelog
        file.seek(cut)
        file.write(b"\xc1" * (len(data) - cut))
    caplog.set_level(logging.INFO)
    await job_for(tmp_path, backend).run()
    assert_fell_back(caplog, str(target.relative_to(newest)), "does not decode")
    assert output(tmp_path / "out.jsonl") == expected(IDS, PER_ID)
