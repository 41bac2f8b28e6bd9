"""A savepoint out of a clustered job: ``statefun savepoint create --cluster``.

The savepoint folder is the single-process format (``sp-N-<time>/``: ``state/``,
``cut.msgpack``, ``_metadata`` with every file's checksum), so ``statefun run
--from-savepoint`` reads it in one process, and so does a clustered job's seeding
(``_savepoints.py``). It is read from Kafka alone, no worker is asked:

* the changelog, every partition ``read_committed`` to its end, the last record of each key
  (``_changelog.read_changelog``): each address's state and each partition's cut (messages in
  flight, delayed messages);
* the job's group's committed offsets: of the Kafka ingress topics, the savepoint's source
  positions (per ingress id, as a single-process job checkpoints them; a partition without
  one starts where the ingress's ``startupPosition`` says); of the exchange, where each
  partition's owner stopped reading: the exchange records after it (committed by the
  workers that sent them, not yet read by the owner) are messages in flight too, after the
  cut's messages.

Each changelog partition is a committed cut of its key groups, but the partitions are cut by
different workers at different times, and the exchange's tail moves while workers run: the
savepoint is consistent only when no worker runs. So it is refused while the job's group has
members: stop the workers (SIGTERM: each commits a last checkpoint as it leaves) or wait for
the session timeout of killed ones. Remote functions' registered state specs are not in the
changelog; a job restored from the savepoint learns them again from the functions.

The HTTP ingress's idempotency keys (the key records, with the replies and dead letters in
flight to them applied) become the ingress's position as a single-process job checkpoints it
(``_key_savepoints.export_keys``), so a repeat after the restore gets the recorded answer.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import msgpack

from statefun._checksums import ALGORITHM, crc32c
from statefun._exceptions import ConfigurationError, UnavailableError
from statefun._files import write_synced
from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.checkpoint._codec import encode_envelopes, encode_timers
from statefun.checkpoint.storage import CUT_FILE, FORMAT_VERSION, CheckpointStorage
from statefun.cluster._changelog import Restored, decode_records, read_changelog
from statefun.cluster._config import ClusterConfig, cluster_config
from statefun.cluster._exchange import decode_exchange
from statefun.cluster._kafka_admin import open_admin
from statefun.cluster._key_savepoints import export_keys, http_ingress_ids
from statefun.module._specs import KafkaIngressSpec, ModuleSpec
from statefun.runtime._timers import DelayedEntry
from statefun.state.memory import MemoryStateBackend

__all__ = ["export_command", "write_savepoint"]

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = 60.0


def export_command(module: ModuleSpec, settings: Settings, directory: str | None) -> Path:
    """``statefun savepoint create --cluster``: the savepoint folder written."""
    config = cluster_config(settings)
    if config is None:
        raise ConfigurationError(
            "statefun savepoint create --cluster needs --set cluster.bootstrap_servers=HOST:PORT "
            "and --set cluster.job_id=NAME"
        )
    root = Path(directory or settings.savepoint_dir or ".statefun/savepoints")
    return write_savepoint(module, settings, config, root)


def write_savepoint(
    module: ModuleSpec, settings: Settings, config: ClusterConfig, root: Path
) -> Path:
    """Read the stopped job's topics and write a savepoint folder under ``root`` (blocking)."""
    committed, ends = _group_offsets(config, module)
    latest, _ = read_changelog(
        config, range(config.partitions), _READ_TIMEOUT_S, client="savepoint"
    )
    restored = decode_records(latest)
    keys = export_keys(
        http_ingress_ids(module),
        restored.state,
        restored.messages + _exchange_tail(config, committed),
        restored.timers,
        settings.http_idempotency_retention_s * 1000,
        int(time.time() * 1000),
    )
    restored = Restored(keys.state, keys.messages, keys.timers, restored.records)
    positions: dict[str, Any] = {**_positions(module, committed, ends), **keys.positions}
    log.info(
        "cluster: savepoint of job %s: %d idempotency key(s) (%d expired or dropped)",
        config.job_id,
        keys.keys,
        keys.dropped,
    )
    return _write(settings, restored, positions, root)


def _group_offsets(
    config: ClusterConfig, module: ModuleSpec
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], tuple[int, int]]]:
    """The group's committed offsets (refused while the group has members), and (beginning,
    end) of every input partition."""
    kafka = import_kafka()
    admin = open_admin(config, "pystatefun-savepoint")
    try:
        described = admin.describe_groups([config.group_id]).get(config.group_id) or {}
        members = [str(m.get("client_id") or "?") for m in described.get("members") or []]
        if members:
            raise ConfigurationError(
                f"job {config.job_id} has {len(members)} running worker(s) (group "
                f"{config.group_id}: {', '.join(sorted(members))}): stop them first, a "
                "savepoint of a running clustered job would not be one consistent cut"
            )
        found = admin.list_group_offsets({config.group_id: None}).get(config.group_id)
    finally:
        admin.close()
    committed = {
        (tp.topic, tp.partition): int(meta.offset)
        for tp, meta in (found or {}).items()
        if meta is not None and meta.offset is not None and meta.offset >= 0
    }
    topics = sorted(
        {t.topic for i in module.ingresses if isinstance(i, KafkaIngressSpec) for t in i.topics}
    )
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        enable_auto_commit=False,
        client_id="pystatefun-savepoint",
    )
    try:
        tps = [
            kafka.TopicPartition(t, p)
            for t in topics
            for p in sorted(reader.partitions_for_topic(t) or ())
        ]
        beginnings = reader.beginning_offsets(tps) if tps else {}
        last = reader.end_offsets(tps) if tps else {}
    finally:
        reader.close(autocommit=False)
    ends = {(tp.topic, tp.partition): (beginnings[tp], last[tp]) for tp in tps}
    return committed, ends


def _exchange_tail(config: ClusterConfig, committed: dict[tuple[str, int], int]) -> list[Any]:
    """The exchange's committed records after where each partition's owner stopped."""
    kafka = import_kafka()
    topic = config.exchange_topic
    wanted = [kafka.TopicPartition(topic, p) for p in range(config.partitions)]
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="pystatefun-savepoint",
    )
    messages: list[Any] = []
    try:
        reader.assign(wanted)
        for tp in wanted:
            offset = committed.get((topic, tp.partition))
            if offset is None:
                reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, offset)
        ends = reader.end_offsets(wanted)
        deadline = time.monotonic() + _READ_TIMEOUT_S
        by_partition: dict[int, list[Any]] = {}
        while any(reader.position(tp) < ends[tp] for tp in wanted):
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"cluster: the exchange {topic} was not read to its end in "
                    f"{_READ_TIMEOUT_S:.0f} s"
                )
            for tp, records in reader.poll(timeout_ms=200, max_records=10_000).items():
                by_partition.setdefault(tp.partition, []).extend(
                    message for r in records for message in decode_exchange(r.value)
                )
    finally:
        reader.close(autocommit=False)
    for partition in sorted(by_partition):
        messages.extend(by_partition[partition])
    return messages


def _positions(
    module: ModuleSpec,
    committed: dict[tuple[str, int], int],
    ends: dict[tuple[str, int], tuple[int, int]],
) -> dict[str, dict[str, int]]:
    """Per Kafka ingress id, ``{"topic:partition": offset}`` as a single-process job
    checkpoints it: the group's offset, else where ``startupPosition`` starts it."""
    positions: dict[str, dict[str, int]] = {}
    for ingress in module.ingresses:
        if not isinstance(ingress, KafkaIngressSpec):
            continue
        latest = ingress.startup_position == "latest"
        mine: dict[str, int] = {}
        for (topic, partition), (beginning, end) in sorted(ends.items()):
            if topic in {t.topic for t in ingress.topics}:
                start = end if latest else beginning
                mine[f"{topic}:{partition}"] = committed.get((topic, partition), start)
        positions[ingress.id] = mine
    return positions


def _write(settings: Settings, restored: Restored, positions: dict[str, Any], root: Path) -> Path:
    """The savepoint folder, as the single-process coordinator writes one."""
    storage = CheckpointStorage(root)
    checkpoint_id = storage.next_id()
    folder = storage.begin(checkpoint_id, savepoint=True)
    state = MemoryStateBackend()
    for key_group, key, values in restored.state:
        state.put(key_group, key, values)
    snapshot = state.snapshot()
    try:
        manifest = snapshot.write(folder / "state")
    finally:
        snapshot.release()
    timers = [
        DelayedEntry(deadline, seq, envelope, sender, token)
        for seq, (deadline, sender, token, envelope) in enumerate(restored.timers)
    ]
    cut = bytes(
        msgpack.packb(
            {
                "messages": encode_envelopes(restored.messages),
                "timers": encode_timers(timers),
                "sinks": {},
            },
            use_bin_type=True,
        )
    )
    write_synced(folder / CUT_FILE, cut)
    files = {CUT_FILE: [len(cut), crc32c(cut)]}
    for name, checksum in manifest.pop("checksums", {}).items():
        files[f"state/{name}"] = list(checksum)
    metadata = {
        "format": FORMAT_VERSION,
        "id": checkpoint_id,
        "savepoint": True,
        "created_ms": int(time.time() * 1000),
        "parallelism": settings.parallelism,
        "max_parallelism": settings.max_parallelism,
        "state_backend": "memory",
        "positions": positions,
        "remote_specs": {},
        "messages": len(restored.messages),
        "timers": len(restored.timers),
        "sinks": [],
        "state_types": sorted({key[0] for _, key, _ in restored.state}),
        "state": manifest,
        "checksum": ALGORITHM,
        "files": files,
    }
    return storage.finish(folder, metadata).path
