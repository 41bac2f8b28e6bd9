"""A worker of a clustered job: a ``Job`` per assignment of key groups, checkpointed into Kafka.

``ClusterWorker.run`` makes or checks the job's topics, joins the group (``Membership``) and
then lives from assignment to assignment. Each assignment is an *epoch*:

1. ``Epoch.start``: a fresh ``WorkerTransactions`` (``init_transactions`` fences this worker's
   previous incarnation and aborts the transaction it left open), a fresh ``Job`` whose state is
   a ``TrackedMemoryState``, whose Kafka egresses hand their records to the transaction
   (``ForwardingKafkaSink``) and whose only source is the exchange (``ExchangeSource``). The
   router sends the key groups of partitions this worker does not own to ``Outbound``, which
   writes each message to the exchange in the open transaction. The owned partitions are
   restored from the changelog (state; the cut's messages through keyBy; delayed messages),
   then the job runs.
2. Every ``checkpoint_interval_ms``, ``Epoch.checkpoint`` cuts - synchronously, as the local
   coordinator does - the changed state, messages in flight and delayed messages into changelog
   records, seals the transaction with the exchange offsets routed so far and the group's
   metadata, and commits it: one Kafka transaction is the checkpoint.
3. When the group revokes the partitions, the epoch checkpoints once more and is dropped whole
   (``Job.abandon``: what ran after that cut is replayed by the next owner from it), and the
   transaction still open (after the cut) is aborted.

A rebalance therefore restarts the worker's job (the eager protocol revokes every partition),
but a partition the worker gets back is not read from the changelog again when nothing was
written to it since the revoke's checkpoint: its state, messages in flight and delayed messages
come from that checkpoint's cut, kept in memory (``_carry.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from statefun._exceptions import JobFailedError
from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.cluster._admin import WorkerAdmin
from statefun.cluster._carry import Carried, carry_cut, changelog_ends
from statefun.cluster._changelog import (
    AddressPartitions,
    TrackedMemoryState,
    changelog_rows,
    restore_partitions,
)
from statefun.cluster._config import ClusterConfig
from statefun.cluster._exchange import ExchangeBatches, WorkerTransactions
from statefun.cluster._http_ingress import EpochHttp, WorkerHttp, http_ingresses
from statefun.cluster._ingress import ClusteredKafkaSource
from statefun.cluster._key_retention import KeySweep
from statefun.cluster._membership import ExchangeSource, Membership, Partitions
from statefun.cluster._topics import delete_retention_ms, ensure_topics
from statefun.egress.base import Sink
from statefun.egress.kafka import KafkaSink
from statefun.egress.stdout import StdoutSink
from statefun.module._specs import (
    KafkaEgressSpec,
    KafkaIngressSpec,
    ModuleSpec,
    StdoutEgressSpec,
)
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import RemoteFunction
from statefun.runtime._job import Job

if TYPE_CHECKING:
    from statefun.cluster._local_state import LocalCopy, TrackedRocksDBState

__all__ = ["ClusterWorker"]

log = logging.getLogger(__name__)

#: how often idleness is checked (and the egresses' rows handed to the transaction)
_TICK_S = 0.05
#: how long a stopping worker waits for its consumer's thread to leave its poll
_STOP_POLLING_S = 10.0


class ForwardingKafkaSink(KafkaSink):
    """A Kafka egress whose records go into the worker's transaction (exactly-once whatever
    its ``deliverySemantic``: they commit with the checkpoint)."""

    def __init__(self, spec: KafkaEgressSpec, transactions: WorkerTransactions) -> None:
        super().__init__(spec.id, spec.address, "at-least-once", properties=spec.properties)
        self.transactional = False  # flushed by the job's loop into the transaction
        self._transactions = transactions

    async def start(self) -> None:
        pass

    def forward(self) -> None:
        if self._buffer:
            rows, self._buffer = self._buffer, []
            self._transactions.write_rows(rows)

    async def flush(self) -> None:
        self.forward()

    async def close(self) -> None:
        self._executor.shutdown(wait=False)


class Outbound:
    """The router's subtask for key groups other workers own: to the exchange.

    Its messages are gathered per exchange partition (``ExchangeBatches``) and written to the
    transaction as records at each ``flush``: every tick of the checkpoint loop and at every
    cut, before the cut is sealed, so a message sent before a cut is in that cut's
    transaction.

    A message sent here has left this worker, so it leaves the in-flight counts the router
    added - in the next loop step, not inside ``offer``: ``Router.emit_many`` keeps the counts
    in locals while it routes and writes them back after, so a release inside ``offer`` would
    be lost (and the sources' gate would stay shut)."""

    def __init__(self, job: Job, config: ClusterConfig, transactions: Any) -> None:
        self._job = job
        self._batches = ExchangeBatches(config)
        self._transactions = transactions
        self._remote: dict[str, bool] = {}
        self._owed = [0, 0]  # messages left, not released yet: embedded, remote

    def offer(self, envelope: Envelope, key_group: int, key: tuple[str, str]) -> None:
        full = self._batches.add(key_group, envelope)
        if full is not None:
            self._transactions.write_rows([full])
        remote = self._remote.get(envelope.typename)
        if remote is None:
            function = self._job.functions.resolve(envelope.typename)
            remote = self._remote[envelope.typename] = isinstance(function, RemoteFunction)
        owed = self._owed
        if owed[0] == owed[1] == 0:
            asyncio.get_running_loop().call_soon(self._release)
        owed[remote] += 1

    def flush(self) -> None:
        """The messages gathered, into the transaction."""
        rows = self._batches.rows()
        if rows:
            self._transactions.write_rows(rows)

    def _release(self) -> None:
        embedded, remote = self._owed
        self._owed = [0, 0]
        if remote:
            self._job.release_remote(remote)
        if embedded:
            self._job.release(embedded)


class Epoch:
    """The job of one assignment of partitions (see the module docstring)."""

    def __init__(
        self,
        module: ModuleSpec,
        settings: Settings,
        config: ClusterConfig,
        membership: Membership,
        partitions: Partitions,
        input_partitions: list[tuple[str, int]],
        carried: Carried | None = None,
        http: WorkerHttp | None = None,
    ) -> None:
        self.module = module
        #: the previous epoch's last cut (partitions this one may take from memory)
        self.carried = carried
        #: this epoch's last cut, once ``stop`` checkpointed it
        self.carry: Carried | None = None
        #: the group generation of this assignment
        self.generation: int = membership.generation
        #: the worker's HTTP ingresses; each epoch's job serves them (``_http_ingress.py``)
        self.http = http
        self.http_link: EpochHttp | None = None
        #: deletes the expired idempotency keys of the epoch's key groups
        self.sweep: KeySweep | None = None
        self.settings = settings
        self.config = config
        self.membership = membership
        self.partitions = list(partitions)
        self.input_partitions = set(input_partitions)
        self.ingresses: list[ClusteredKafkaSource] = []
        self._by_topic: dict[str, ClusteredKafkaSource] = {}
        self.transactions = WorkerTransactions(config)
        self.state: TrackedMemoryState | TrackedRocksDBState = TrackedMemoryState()
        #: with state_backend=rocksdb: the worker's local copy of its state (_local_state.py)
        self.local: LocalCopy | None = None
        self._lock = asyncio.Lock()
        self._checkpoint_id = 0
        self._last_offsets: dict[tuple[str, int], int] = {}
        self._last_cut_empty = False
        #: partition -> its cut record as this epoch last wrote it (an equal one is not written)
        self._last_cuts: dict[int, bytes] = {}
        #: the partitions of the addresses of messages in flight at the cuts
        self._addresses = AddressPartitions(config)
        self.job: Job | None = None
        self.source: ExchangeSource | None = None
        self.outbound: Outbound | None = None
        self._forwarders: list[ForwardingKafkaSink] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.committed = 0

    async def start(self) -> None:
        if self.settings.state_backend == "rocksdb":
            from statefun.cluster._local_state import open_local_copy

            opened = await asyncio.to_thread(open_local_copy, self.settings.state_dir, self.config)
            self.state, self.local = opened
        await self.transactions.start()
        sinks: list[Sink] = []
        for egress in self.module.egresses:
            if isinstance(egress, KafkaEgressSpec):
                forwarder = ForwardingKafkaSink(egress, self.transactions)
                self._forwarders.append(forwarder)
                sinks.append(forwarder)
            elif isinstance(egress, StdoutEgressSpec):
                sinks.append(StdoutSink(egress.id))
        self.job = job = Job(
            self.module, self.settings, sinks=sinks, state=self.state, serve_admin=False
        )
        owned = [kg for p in self.partitions for kg in self.config.key_groups_of(p)]
        if self.http is not None:  # before anything is routed: its idempotency keys' function
            self.sweep = self.http.serve_keys(job, owned)
        self.source = ExchangeSource(job.send)
        for ingress in self.module.ingresses:
            if isinstance(ingress, KafkaIngressSpec):
                source = ClusteredKafkaSource(ingress)
                self.ingresses.append(source)
                self._by_topic.update(dict.fromkeys(source.topics, source))
        job.sources = [self.source, *self.ingresses]
        starts = self.membership.start_positions
        exchange = self.config.exchange_topic
        self.source.positions.update(
            (p, starts[(exchange, p)]) for p in self.partitions if (exchange, p) in starts
        )
        for source in self.ingresses:
            source.start_at(starts)
        mine = set(owned)
        others = [kg for kg in range(self.config.max_parallelism) if kg not in mine]
        self.outbound = Outbound(job, self.config, self.transactions)
        job.router.reroute(others, self.outbound)
        kept = await self._kept()
        rest = [p for p in self.partitions if p not in kept]
        if self.local is not None:  # into RocksDB: caught up from its marks, or read whole
            retention = functools.partial(delete_retention_ms, self.config)
            restored = await asyncio.to_thread(self.local.restore, self.partitions, kept, retention)
        else:
            restored = await asyncio.to_thread(restore_partitions, self.config, rest)
        addresses, messages, timers = self._take_carried(kept)
        for key_group, key, values in restored.state:
            self.state.restore_put(key_group, key, values)
        for envelope in restored.messages:
            job.send(envelope)
        for deadline, sender, token, envelope in restored.timers:
            job.timers.add(deadline, envelope, sender, token)
        log.info(
            "cluster: %d partition(s) kept in memory, %d restored from %d changelog record(s): "
            "%d address(es) with state, %d message(s) in flight, %d delayed",
            len(kept),
            len(rest),
            restored.records,
            len(restored.state) + addresses,
            len(restored.messages) + messages,
            len(restored.timers) + timers,
        )
        self._last_cut_empty = not (restored.messages or restored.timers or messages or timers)
        self.carried = None
        if self.http is not None:
            self.http_link = self.http.attach(job, self.transactions)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(job.run()), loop.create_task(self._checkpoints())]
        if self.sweep is not None:  # expired idempotency keys, deleted with no traffic
            self._tasks.append(loop.create_task(self.sweep.run()))

    async def deliver(self, records: list[Any]) -> None:
        """A poll's records: the exchange's to keyBy, the inputs' to their ingress."""
        assert self.source is not None
        exchange = self.config.exchange_topic
        if all(record.topic == exchange for record in records):
            await self.source.queue.put(records)
            return
        split: dict[Any, list[Any]] = {}
        for record in records:
            target = self.source if record.topic == exchange else self._by_topic[record.topic]
            split.setdefault(target, []).append(record)
        for target, part in split.items():
            await target.queue.put(part)

    def _positions(self) -> dict[tuple[str, int], int]:
        """Every partition this epoch consumed: the offset after the last record routed."""
        assert self.source is not None
        exchange = self.config.exchange_topic
        positions = {
            (exchange, p): o for p, o in self.source.positions.items() if p in self.partitions
        }
        for ingress in self.ingresses:
            for key, offset in ingress.positions().items():
                if key in self.input_partitions:
                    positions[key] = offset
        return positions

    async def _checkpoints(self) -> None:
        """Every ``checkpoint_interval_ms``; sooner when the job has nothing in flight while
        rows wait for a commit (``idle_checkpoint_delay_ms`` after the last checkpoint, and no
        sooner than 9x the CPU time it took, as the single-process job does).

        Rows are produced at the cut, not as they come: a transaction is open only while its
        checkpoint commits, so a worker that dies or stops seldom leaves one open, and an open
        one holds back every ``read_committed`` reader of the partitions it wrote to until
        the broker aborts it (``cluster_transaction_timeout_ms``, checked by the broker every
        ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default)."""
        job = self.job
        assert job is not None
        loop = asyncio.get_running_loop()
        interval = self.settings.checkpoint_interval_ms / 1000
        idle = self.settings.idle_checkpoint_delay_ms / 1000
        soon = self.settings.reply_checkpoint_delay_ms / 1000
        http = self.http_link
        next_at, ended, cpu = loop.time() + interval, loop.time(), 0.0
        while True:
            await asyncio.sleep(_TICK_S)
            self._forward()
            now = loop.time()
            early = bool(idle) and job.pending == 0 and self.transactions.unsealed() > 0
            # HTTP requests waiting for a commit: group commit, as replies in one process
            asked = http is not None and http.wants_checkpoint() and now - ended >= soon
            if now < next_at and not (early and now - ended >= max(idle, 9 * cpu)) and not asked:
                continue
            next_at = now + interval
            started = time.process_time()
            await self.checkpoint()
            ended, cpu = loop.time(), time.process_time() - started

    def _forward(self) -> None:
        """The egresses' records and the exchange messages gathered, into the transaction."""
        for forwarder in self._forwarders:
            forwarder.forward()
        if self.outbound is not None:
            self.outbound.flush()

    async def _kept(self) -> list[int]:
        """The partitions to take from the carried cut (their changelog unchanged since)."""
        carried = self.carried
        mine = [p for p in self.partitions if carried is not None and p in carried.ends]
        if carried is None or not mine or carried.generation + 1 != self.generation:
            return []  # (a generation in between, without this worker: others may have written)
        ends = await asyncio.to_thread(changelog_ends, self.config, mine)
        return carried.usable(mine, ends)

    def _take_carried(self, kept: list[int]) -> tuple[int, int, int]:
        """State, messages in flight and delayed messages of ``kept`` from the carried cut;
        how many of each."""
        carried, job = self.carried, self.job
        if carried is None or job is None:
            return 0, 0, 0
        addresses = messages = timers = 0
        for partition in kept:
            for key_group in self.config.key_groups_of(partition):
                for key, values in carried.groups.get(key_group, {}).items():
                    self.state.restore_put(key_group, key, values)
                    addresses += 1
            for envelope in carried.messages.get(partition, ()):
                job.send(envelope)
            for entry in carried.timers.get(partition, ()):
                job.timers.add(entry.deadline_ms, entry.envelope, entry.sender, entry.token)
            messages += len(carried.messages.get(partition, ()))
            timers += len(carried.timers.get(partition, ()))
        return addresses, messages, timers

    async def checkpoint(self, carry: bool = False) -> bool:
        """Cut, seal and commit one checkpoint; False: nothing happened since the last one.
        ``carry``: keep the cut in ``self.carry`` with the changelog's end offsets after it
        (the epoch's last checkpoint, before a revocation)."""
        job, source = self.job, self.source
        assert job is not None and source is not None
        async with self._lock:
            if job.failed:
                raise JobFailedError("the job failed: no checkpoint is taken after a failure")
            # The commit carries the group's metadata as of this cut, for the broker to fence
            # a member whose partitions moved (KIP-447). A consumer that the group dropped
            # has no generation, and the broker checks no generation at all for such a
            # transaction's offsets: a cut outside this epoch's generation is never committed.
            member = self.membership.group_metadata()
            if member.generation_id != self.generation or not member.member_id:
                raise import_kafka().errors.CommitFailedError(
                    f"worker {self.config.worker_id}: its consumer is at generation "
                    f"{member.generation_id} of the group, not at this assignment's "
                    f"{self.generation}: no checkpoint of this assignment is committed"
                )
            self._forward()
            http = None if self.http_link is None else self.http_link.cut(self.config)
            changed = self.state.take_changed()
            local_cut = self.local.cut() if self.local is not None else None
            messages = job.messages_in_flight()
            timers = list(job.timers.pending())
            positions = self._positions()
            empty_cut = not messages and not timers
            cut = (
                carry_cut(
                    self.config,
                    self.state.group,
                    self.partitions,
                    messages,
                    timers,
                    self.generation,
                )
                if carry
                else None
            )
            if (
                not changed
                and not self.transactions.unsealed()
                and positions == self._last_offsets
                and empty_cut
                and self._last_cut_empty
            ):
                if http is not None:
                    http.committed()  # nothing to commit: its effects are done
                if self.local is not None and local_cut is not None:
                    await self.local.committed(local_cut, [], proven=False)
                await self._carry_ends(cut)
                return False
            rows = changelog_rows(
                self.config,
                self.state,
                changed,
                messages,
                timers,
                self.partitions,
                self._last_cuts,
                self._addresses,
            )
            self.transactions.write_rows(rows)
            kafka = import_kafka()
            offsets = {
                kafka.TopicPartition(t, p): kafka.structs.OffsetAndMetadata(o, "", -1)
                for (t, p), o in positions.items()
            }
            self._checkpoint_id += 1
            checkpoint_id = self._checkpoint_id
            proven = False
            try:
                if self.transactions.seal(checkpoint_id, offsets, member):
                    await self.transactions.commit(checkpoint_id)
                    self.committed += 1
                    proven = True
            except BaseException as exc:
                if http is not None:
                    http.aborted(exc)
                raise
            if http is not None:
                http.committed()
            if self.local is not None and local_cut is not None:  # the commit, into RocksDB
                await self.local.committed(local_cut, rows, proven)
            self._last_offsets = positions
            self._last_cut_empty = empty_cut
            await self._carry_ends(cut)
            return True

    async def _carry_ends(self, cut: Carried | None) -> None:
        """The changelog's end offsets once ``cut`` is what it holds; then keep the cut."""
        if cut is not None:
            cut.ends = await asyncio.to_thread(changelog_ends, self.config, self.partitions)
            self.carry = cut

    async def stop(self, checkpoint: bool, carry: bool = False) -> Carried | None:
        """Checkpoint (when asked and the job is sound), then drop the job; with ``carry``,
        the checkpoint's cut, for partitions the worker may get back (None: no checkpoint)."""
        job = self.job
        if self.http is not None and self.http_link is not None:
            self.http.detach(self.http_link)  # new requests wait for the next epoch
        try:
            if checkpoint and job is not None and not job.failed:
                await self.checkpoint(carry=carry)
        finally:
            if self.http_link is not None:
                self.http_link.close()
            if job is not None:
                job.abandon()
            for task in self._tasks[1:]:  # the checkpoints; the job ends by itself
                task.cancel()
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, JobFailedError):
                    log.warning("cluster: %s", result)
            await self.transactions.close()  # aborts what was written after the cut
            if self.local is not None:
                await asyncio.to_thread(self.local.close)
        return self.carry

    def failure(self) -> BaseException | None:
        """Why the epoch stopped on its own (its job or its checkpoints failed), if it did."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None


class ClusterWorker:
    """One worker process of a clustered job."""

    def __init__(self, module: ModuleSpec, settings: Settings, config: ClusterConfig) -> None:
        self.module = module
        # the job inside keeps no local checkpoints; the worker serves its admin port (across
        # assignments), not the job of each assignment
        self.settings = dataclasses.replace(settings, checkpoint_dir="")
        self.config = config
        self.admin = WorkerAdmin(self.settings, config) if settings.admin_port else None
        self.http = WorkerHttp(module, settings, config) if http_ingresses(module) else None
        self.epoch: Epoch | None = None
        self.membership: Membership | None = None
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        self.epochs = 0
        #: the last epoch's last cut, until the next assignment takes what it can of it
        self._carried: Carried | None = None

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        await asyncio.to_thread(ensure_topics, self.config)
        if self.admin is not None:
            await self.admin.start()
        try:
            if self.http is not None:
                await self.http.start()
            await self._run()
        finally:
            if self.http is not None:
                await self.http.close()
            if self.admin is not None:
                await self.admin.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        inputs = {
            topic.topic: ingress.startup_position
            for ingress in self.module.ingresses
            if isinstance(ingress, KafkaIngressSpec)
            for topic in ingress.topics
        }
        published = {"admin_url": self.admin.url} if self.admin is not None else {}
        self.membership = membership = Membership(
            self.config,
            loop,
            self._assigned,
            self._revoked,
            self._deliver,
            inputs,
            user_data=json.dumps(published).encode() if published else b"",
        )
        membership.start()
        log.info(
            "cluster: worker %s joined job %s (group %s)",
            self.config.worker_id,
            self.config.job_id,
            self.config.group_id,
        )
        watch = loop.create_task(self._watch())
        stopped = loop.create_task(self._stopping.wait())
        ended: list[asyncio.Future[Any]] = [membership.stopped, stopped, watch]
        try:
            await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
        finally:
            membership.stop_polling()
            for task in (watch, stopped):
                task.cancel()
            with contextlib.suppress(BaseException):  # (a poll stuck in delivery: go on)
                await asyncio.wait_for(asyncio.shield(membership.stopped), _STOP_POLLING_S)
            if self.admin is not None:
                self.admin.pause()
            if self.epoch is not None:
                epoch, self.epoch = self.epoch, None
                await epoch.stop(checkpoint=self._failure is None)
            await asyncio.to_thread(membership.close)
        if self._failure is not None:
            raise JobFailedError(f"the worker failed: {self._failure}") from self._failure
        if membership.stopped.done() and membership.stopped.exception() is not None:
            raise JobFailedError(f"the worker's consumer failed: {membership.stopped.exception()}")

    async def _watch(self) -> None:
        """End the worker when its epoch fails (a commit refused, a job failure)."""
        while True:
            await asyncio.sleep(0.1)
            epoch = self.epoch
            failure = epoch.failure() if epoch is not None else None
            if failure is not None:
                log.error("cluster: the worker stops: %s", failure)
                self._failure = failure
                return

    async def _assigned(self, partitions: Partitions, inputs: list[tuple[str, int]]) -> None:
        assert self.membership is not None
        carried, self._carried = self._carried, None
        epoch = Epoch(
            self.module,
            self.settings,
            self.config,
            self.membership,
            partitions,
            inputs,
            carried,
            http=self.http,
        )
        await epoch.start()
        self.epoch = epoch
        self.epochs += 1
        if self.admin is not None and epoch.job is not None:
            self.admin.serve(epoch.job, partitions, inputs, self.membership.generation)

    async def _revoked(self, partitions: Partitions, lost: bool) -> None:
        """The epoch ends: checkpointed and its cut carried, or, its partitions ``lost``
        (the group dropped this worker), dropped without a checkpoint."""
        if self.admin is not None:
            self.admin.pause()
        epoch, self.epoch = self.epoch, None
        if lost:
            self._carried = None
            if epoch is not None:
                await epoch.stop(checkpoint=False)
        elif epoch is not None:
            self._carried = await epoch.stop(checkpoint=True, carry=True)

    async def _deliver(self, records: list[Any]) -> None:
        if self.epoch is not None:
            await self.epoch.deliver(records)
