"""A savepoint into a clustered job: the job's changelog seeded from it, in one transaction.

``statefun run --workers N --from-savepoint PATH`` (before its workers start) and
``statefun worker --from-savepoint PATH`` (before it joins the group) call
``seed_from_savepoint``. A savepoint (or checkpoint) folder of the single-process runtime, or
one ``statefun savepoint create --cluster`` wrote (``_savepoint_export.py``), becomes what a
worker's checkpoints write (``_changelog.py``): a record per address with state, to the
changelog partition of its key group; per partition a cut record with the messages in flight
to its key groups and the delayed messages its key groups sent. The savepoint's Kafka
ingress positions become the job's group's committed offsets (``pystatefun.<job>``), in the
same transaction: an input partition the savepoint names starts where it says, one it does
not name at its beginning (as a single-process job restored from it does). The HTTP ingress's
idempotency keys become the key records of their key groups (``_key_savepoints.py``).

**Once per job.** The job's changelog is seeded only while it holds no committed record; the
first record of partition 0 is then a *seed* record (``0:seed``) naming the savepoint (its id,
creation time and metadata checksum). A changelog that holds records already is:

* left alone when its seed record names the same savepoint: a worker restarted with the same
  command line, or one of several started with it at once, goes on from the job's state;
* refused (one line) otherwise: the job has state of its own, which a savepoint must not
  silently replace. Start a new job (another ``cluster.job_id``) from the savepoint.

**Several seeders at once** (workers started on several machines with the same flag): the
transaction has one transactional id per job, ``pystatefun.<job>.seed``. Each seeder first
initialises its producer, which fences any other seeder's producer and aborts its open
transaction, and only then checks the changelog (``read_committed``): so of two seeders that
both found it empty, the later fences the earlier, whose commit fails; the fenced one checks
again and finds the other's seed. Exactly one seed commits, and its seeder alone reports
having seeded: each seed record names its seeder, the seeder waits for the acknowledgement of
every record it sent before it commits (a producer fenced before its partitions joined the
transaction may be told its commit succeeded), and reads the seed record back after the commit.

**The savepoint's egress transactions.** A single-process savepoint holds the Kafka egress's
transaction of its cut; if the job that took it stopped before committing it, the seeder
commits it (``KafkaSink.recover``, idempotent through the egress's markers), before its seed
commits, so that output is neither lost nor doubled. Seeders recovering at once fence each
other's egress producers (the egress's own transactional ids); a fenced one tries again, and
finds the seed of the one that got through.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from statefun._exceptions import CheckpointDamagedError, ConfigurationError, UnavailableError
from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.checkpoint._codec import decode_envelopes, decode_timers
from statefun.checkpoint.storage import CUT_FILE, READABLE_FORMATS, read_checkpoint
from statefun.checkpoint.verify import verify_files
from statefun.cluster._changelog import TrackedMemoryState, changelog_rows
from statefun.cluster._config import PREFIX, ClusterConfig, cluster_config
from statefun.cluster._exchange import partition_in_key
from statefun.cluster._key_savepoints import savepoint_keys
from statefun.cluster._support import check_clusterable
from statefun.cluster._topics import ensure_topics
from statefun.egress.kafka import KafkaSink, Row
from statefun.module._specs import KafkaEgressSpec, KafkaIngressSpec, ModuleSpec
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import FunctionRegistry
from statefun.runtime._timers import DelayedEntry
from statefun.state._registry import read_snapshot
from statefun.state.base import AddressKey

__all__ = [
    "SEED_KEY",
    "SavepointContents",
    "read_savepoint",
    "seed_changelog",
    "seed_from_savepoint",
    "seed_rows",
    "seed_savepoint_argument",
    "seeded_from",
]

log = logging.getLogger(__name__)

#: the key of the seed record: first of changelog partition 0
SEED_KEY = "0:seed"
_ATTEMPTS = 5
_CHECK_TIMEOUT_S = 60.0


@dataclass
class SavepointContents:
    """What a savepoint folder holds, decoded."""

    path: Path
    #: (key group, address, values) of every address with state
    state: list[tuple[int, AddressKey, dict[str, Any]]] = field(default_factory=list)
    messages: list[Envelope] = field(default_factory=list)
    #: (deadline ms, sender, token, message)
    timers: list[tuple[int, AddressKey, str, Envelope]] = field(default_factory=list)
    #: ingress id -> its checkpointed position ({"topic:partition": offset} for Kafka)
    positions: dict[str, Any] = field(default_factory=dict)
    #: egress id -> its transactions at the cut
    sinks: dict[str, Any] = field(default_factory=dict)
    #: what names the savepoint in the seed record
    identity: dict[str, Any] = field(default_factory=dict)
    #: how many of ``state``'s addresses are the HTTP ingress's idempotency keys
    keys: int = 0


def read_savepoint(
    path: Path, module: ModuleSpec, settings: Settings, allow_dropping_state: bool = False
) -> SavepointContents:
    """The savepoint (or checkpoint) folder ``path``, checked as a single-process restore
    checks it: its format, ``max_parallelism``, every file's checksum, and state of function
    types the module lost (an error unless ``allow_dropping_state``)."""
    checkpoint = read_checkpoint(path)
    metadata = checkpoint.metadata
    if metadata.get("format") not in READABLE_FORMATS:
        raise ConfigurationError(
            f"{path}: checkpoint format {metadata.get('format')!r} is not supported"
        )
    if metadata.get("max_parallelism") != settings.max_parallelism:
        raise ConfigurationError(
            f"{path} was written with max_parallelism {metadata.get('max_parallelism')}; "
            f"seed the job with the same max_parallelism (now {settings.max_parallelism})"
        )
    verify_files(checkpoint)
    manifest = metadata.get("state")
    if not isinstance(manifest, dict):
        raise CheckpointDamagedError(str(path / "_metadata"), "lists no state")
    try:
        cut = msgpack.unpackb((path / CUT_FILE).read_bytes(), raw=False)
        contents = SavepointContents(
            path,
            state=list(read_snapshot(path / "state", manifest, None)),
            messages=decode_envelopes(cut["messages"]),
            timers=decode_timers(cut["timers"]),
            sinks=dict(cut.get("sinks") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise CheckpointDamagedError(str(path), f"does not decode: {exc!r}") from exc
    contents.positions = dict(metadata.get("positions") or {})
    contents.identity = {
        "id": metadata.get("id"),
        "created_ms": metadata.get("created_ms"),
        "metadata_crc32c": metadata.get("metadata_crc32c"),
        "path": str(path),
    }
    functions = FunctionRegistry(module)
    orphans: dict[str, int] = {}
    for _, (typename, _id), _values in contents.state:
        if functions.resolve(typename) is None:
            orphans[typename] = orphans.get(typename, 0) + 1
    if orphans and not allow_dropping_state:
        names = ", ".join(f"{t} ({n} address(es))" for t, n in sorted(orphans.items()))
        raise ConfigurationError(
            f"{path} holds state of function types the module no longer has: {names}; allow "
            "dropping it with --allow-dropping-state"
        )
    if orphans:
        contents.state = [e for e in contents.state if e[1][0] not in orphans]
        for typename, count in sorted(orphans.items()):
            log.warning("dropped the state of %d address(es) of %s", count, typename)
    try:
        keys = savepoint_keys(module, settings, path, contents.positions, contents.messages)
    except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise CheckpointDamagedError(
            str(path), f"its HTTP ingress's idempotency keys do not decode: {exc!r}"
        ) from exc
    contents.state += keys.state
    contents.messages = keys.messages
    contents.keys = len(keys.state)
    if keys.dropped:
        log.info("%s: %d idempotency key(s) expired or without their call", path, keys.dropped)
    return contents


def seed_rows(
    config: ClusterConfig, contents: SavepointContents, seeder: str | None = None
) -> list[Row]:
    """The changelog records that hold ``contents``: the seed record first (on partition 0),
    then each address's state and each partition's cut. ``seeder``: a name of this seeding,
    in the seed record, by which it finds its own commit."""
    state = TrackedMemoryState()
    for key_group, key, values in contents.state:
        state.put(key_group, key, values)
    timers = [
        DelayedEntry(deadline, seq, envelope, sender, token)
        for seq, (deadline, sender, token, envelope) in enumerate(contents.timers)
    ]
    identity = dict(contents.identity)
    if seeder is not None:
        identity["seeder"] = seeder
    seed = json.dumps(identity, sort_keys=True).encode("utf-8")
    rows: list[Row] = [(config.changelog_topic, SEED_KEY, seed, None)]
    rows += changelog_rows(
        config,
        state,
        state.take_changed(),
        contents.messages,
        timers,
        range(config.partitions),
    )
    return rows


def input_offsets(
    module: ModuleSpec, positions: dict[str, Any], partitions: dict[str, list[int]]
) -> dict[tuple[str, int], int | None]:
    """(topic, partition) -> where the job's group starts it: the savepoint's offset, or None
    (its beginning) for a partition of a Kafka ingress topic the savepoint does not name.
    ``partitions``: topic -> its partitions now."""
    offsets: dict[tuple[str, int], int | None] = {}
    for ingress in module.ingresses:
        if not isinstance(ingress, KafkaIngressSpec):
            continue
        topics = {topic.topic for topic in ingress.topics}
        position = positions.get(ingress.id)
        named: dict[tuple[str, int], int] = {}
        for text, offset in (position if isinstance(position, dict) else {}).items():
            topic, _, number = str(text).rpartition(":")
            if topic in topics and number.isdigit():
                named[(topic, int(number))] = int(offset)
        for topic in sorted(topics):
            for partition in partitions.get(topic, []):
                offset = named.get((topic, partition))
                before = offsets.get((topic, partition), offset)
                if before != offset:
                    raise ConfigurationError(
                        f"ingress {ingress.id}: the savepoint has two positions for "
                        f"{topic}:{partition} ({before} and {offset}); a clustered job reads "
                        "a topic once"
                    )
                offsets[(topic, partition)] = offset
    return offsets


def seed_savepoint_argument(
    module: ModuleSpec, settings: Settings, args: argparse.Namespace
) -> bool:
    """``--from-savepoint`` of ``statefun run --workers N`` and ``statefun worker``: the job
    checked as its workers check it, then seeded (True) or found seeded from it (False)."""
    config = cluster_config(settings)
    if config is None:
        raise ConfigurationError(
            "--from-savepoint with --workers or statefun worker seeds a clustered job: set "
            "cluster.bootstrap_servers and cluster.job_id"
        )
    check_clusterable(module, settings, from_savepoint=True, bootstrap=config.bootstrap_servers)
    return seed_from_savepoint(
        module, settings, config, Path(args.from_savepoint), args.allow_dropping_state
    )


def seed_from_savepoint(
    module: ModuleSpec,
    settings: Settings,
    config: ClusterConfig,
    path: Path,
    allow_dropping_state: bool = False,
) -> bool:
    """Seed the job's changelog from the savepoint at ``path`` (blocking; see the module
    docstring). True: seeded now; False: seeded from it before."""
    contents = read_savepoint(path, module, settings, allow_dropping_state)
    ensure_topics(config)
    return seed_changelog(config, module, contents)


def seed_changelog(config: ClusterConfig, module: ModuleSpec, contents: SavepointContents) -> bool:
    """Seed the changelog with ``contents`` once (fenced: see the module docstring)."""
    kafka = import_kafka()
    for attempt in range(1, _ATTEMPTS + 1):
        producer = kafka.KafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            transactional_id=f"{PREFIX}.{config.job_id}.seed",
            transaction_timeout_ms=max(config.transaction_timeout_ms, 60_000),
            client_id=f"pystatefun-{config.worker_id}-seed",
        )
        try:
            producer.init_transactions()  # fences every other seeder of the job
            seeded = seeded_from(config)
            if seeded is not None:
                return _already(config, contents, seeded)
            try:
                _recover_egresses(module, contents)
            except ConfigurationError:
                raise
            except Exception as exc:  # (another seeder's recovery fenced this one's, or Kafka)
                raise _Retry(f"the savepoint's egress transactions: {exc}") from exc
            seeder = uuid.uuid4().hex
            _commit_seed(config, module, contents, producer, seeder)
            seeded = _read_back(config)
            if seeded.get("seeder") != seeder:
                # (a commit that kafka-python reported but another seeder's fenced: the seed
                # record read back is the proof of which one got through)
                return _already(config, contents, seeded)
            log.info(
                "cluster: job %s seeded from %s: %d address(es) with state, %d message(s) in "
                "flight, %d delayed, %d idempotency key(s)",
                config.job_id,
                contents.path,
                len(contents.state) - contents.keys,
                len(contents.messages),
                len(contents.timers),
                contents.keys,
            )
            return True
        except (kafka.errors.ProducerFencedError, kafka.errors.InvalidProducerEpochError) as exc:
            log.info("cluster: another seeder of job %s fenced this one (%s)", config.job_id, exc)
            if attempt == _ATTEMPTS:
                break
        except (kafka.errors.KafkaError, _Retry) as exc:
            if attempt == _ATTEMPTS:
                raise UnavailableError(
                    f"cluster: seeding job {config.job_id} from {contents.path}: {exc}"
                ) from exc
            log.warning("cluster: seeding job %s failed (%s); again", config.job_id, exc)
        finally:
            producer.close(timeout=5)
        time.sleep(random.uniform(0.2, 1.0) * attempt)
    raise UnavailableError(
        f"cluster: job {config.job_id} was not seeded from {contents.path} after {_ATTEMPTS} "
        "attempts (other seeders kept fencing it)"
    )


def _read_back(config: ClusterConfig) -> dict[str, Any]:
    """The seed record after a commit: the transaction's markers reach the partitions just
    after the commit returns, so an empty changelog is read again for a while."""
    deadline = time.monotonic() + _CHECK_TIMEOUT_S
    while True:
        seeded = seeded_from(config)
        if seeded is not None:
            return seeded
        if time.monotonic() > deadline:
            raise _Retry("the committed seed did not appear in the changelog")
        time.sleep(0.1)


class _Retry(Exception):
    """A seeding attempt failed in a way the next attempt may not."""


def _already(config: ClusterConfig, contents: SavepointContents, seeded: dict[str, Any]) -> bool:
    same = ("id", "created_ms", "metadata_crc32c")
    if seeded and all(seeded.get(k) == contents.identity.get(k) for k in same):
        log.info(
            "cluster: job %s was seeded from this savepoint before: it goes on from its state",
            config.job_id,
        )
        return False
    what = f"the savepoint {seeded.get('path')}" if seeded else "its own checkpoints"
    raise ConfigurationError(
        f"--from-savepoint {contents.path}: job {config.job_id} has state already (from "
        f"{what}); start it without --from-savepoint, or start a new job (another "
        "cluster.job_id) from the savepoint"
    )


def seeded_from(config: ClusterConfig) -> dict[str, Any] | None:
    """None: the changelog holds no committed record; else what its seed record says ({}: no
    seed record, the job's state is its own). Blocking; reads only the first records."""
    kafka = import_kafka()
    wanted = [kafka.TopicPartition(config.changelog_topic, p) for p in range(config.partitions)]
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        client_id=f"pystatefun-{config.worker_id}-seed-check",
    )
    try:
        reader.assign(wanted)
        reader.seek_to_beginning(*wanted)
        ends = reader.end_offsets(wanted)
        first = wanted[0]
        found_any = False
        deadline = time.monotonic() + _CHECK_TIMEOUT_S
        while True:
            if reader.position(first) >= ends[first] and (
                found_any or all(reader.position(tp) >= ends[tp] for tp in wanted)
            ):
                return {} if found_any else None
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"cluster: the changelog {config.changelog_topic} was not read in "
                    f"{_CHECK_TIMEOUT_S:.0f} s"
                )
            for tp, records in reader.poll(timeout_ms=200).items():
                if not records:
                    continue
                found_any = True
                if tp == first:  # the seed record, if any, is partition 0's first
                    head = records[0]
                    if head.key == SEED_KEY.encode() and head.value:
                        return dict(json.loads(head.value))
                    return {}
            if found_any:
                reader.pause(*[tp for tp in wanted if tp != first])
    finally:
        reader.close(autocommit=False)


def _recover_egresses(module: ModuleSpec, contents: SavepointContents) -> None:
    """Commit the savepoint's egress transactions that did not reach Kafka (idempotent)."""
    specs = {e.id: e for e in module.egresses if isinstance(e, KafkaEgressSpec)}
    states = {egress_id: s for egress_id, s in contents.sinks.items() if s and egress_id in specs}
    if not states:
        return

    async def recover() -> None:
        for egress_id, state in states.items():
            sink = KafkaSink.from_spec(specs[egress_id])
            await sink.start()
            try:
                await sink.recover(state)
            finally:
                await sink.close()

    asyncio.run(recover())


def _commit_seed(
    config: ClusterConfig,
    module: ModuleSpec,
    contents: SavepointContents,
    producer: Any,
    seeder: str | None = None,
) -> None:
    kafka = import_kafka()
    topics = sorted(
        {t.topic for i in module.ingresses if isinstance(i, KafkaIngressSpec) for t in i.topics}
    )
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        enable_auto_commit=False,
        client_id=f"pystatefun-{config.worker_id}-seed-offsets",
    )
    try:
        partitions = {t: sorted(reader.partitions_for_topic(t) or ()) for t in topics}
        wanted = input_offsets(module, contents.positions, partitions)
        unnamed = [kafka.TopicPartition(t, p) for (t, p), o in wanted.items() if o is None]
        beginnings = reader.beginning_offsets(unnamed) if unnamed else {}
    finally:
        reader.close(autocommit=False)
    offsets = {
        kafka.TopicPartition(t, p): kafka.structs.OffsetAndMetadata(
            beginnings[kafka.TopicPartition(t, p)] if o is None else o, "", -1
        )
        for (t, p), o in wanted.items()
    }
    producer.begin_transaction()
    sent = []
    for topic, key, value, _ in seed_rows(config, contents, seeder):
        assert key is not None
        sent.append(
            producer.send(
                topic,
                key=key.encode("utf-8"),
                value=value,
                partition=partition_in_key(key.encode()),
            )
        )
    producer.flush(timeout=_CHECK_TIMEOUT_S)
    for future in sent:  # (a fenced producer's batches fail here; its commit may not say so)
        future.get(timeout=_CHECK_TIMEOUT_S)
    if offsets:
        producer.send_offsets_to_transaction(offsets, config.group_id)
    producer.commit_transaction()
