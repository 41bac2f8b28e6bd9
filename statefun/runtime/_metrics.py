"""``GET /metrics`` of the admin server: the job's counters in Prometheus's text format.

One ``CollectorRegistry`` per job (never the library's global one: several jobs may run in
one process, tests do), holding ``JobCollector`` and the library's process collector (CPU
seconds, resident memory, open files). ``JobCollector`` builds every metric family at scrape
time from the plain counters the runtime keeps (``_stats.py``, read through ``_status.py``),
so the hot path never calls into the metrics library.

Names follow Prometheus's conventions: the ``pystatefun_`` prefix, ``_total`` for counters,
``_seconds`` and ``_bytes`` for units. Labels are bounded by the module, never by the data:
``function`` (a function type), ``endpoint`` (a remote endpoint's origin), ``ingress`` and
``egress`` (ids), ``kind`` (of a failure), ``partition`` (a Kafka ingress's partitions). No
label names an address.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from statefun.runtime._status import ObservedJob, function_stats, mailboxes

if TYPE_CHECKING:
    from statefun.runtime._stats import Histogram

__all__ = ["CONTENT_TYPE", "CumulativeMetrics", "JobCollector", "JobMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_P = "pystatefun_"


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(_P + name, doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(_P + name, doc, labels=list(labels))


def _histogram(name: str, doc: str, labels: Iterable[str] = ()) -> HistogramMetricFamily:
    return HistogramMetricFamily(_P + name, doc, labels=list(labels))


def _observe(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    family.add_metric(labels, histogram.cumulative(), histogram.sum)


class JobCollector(Collector):
    """Every ``pystatefun_*`` metric of one job, read from its counters at scrape time."""

    def __init__(self, job: ObservedJob) -> None:
        self.job = job

    def collect(self) -> Iterator[Metric]:
        yield from self._functions()
        yield from self._endpoints()
        yield from self._ingresses()
        yield from self._egresses()
        yield from self._checkpoints()
        yield from self._runtime()

    def _functions(self) -> Iterator[Metric]:
        label = ["function"]
        invocations = _counter(
            "function_invocations", "messages a function type handled (one invocation each)", label
        )
        messages_in = _counter(
            "function_messages_in", "messages handed to a function type, failed attempts too", label
        )
        messages_out = _counter(
            "function_messages_out",
            "messages a function type sent (delayed ones too, not their cancellations)",
            label,
        )
        failures = _counter(
            "function_failures",
            "messages whose invocation failed, by kind (retryable: a remote call that timed out "
            "or kept failing; terminal: anything else)",
            ["function", "kind"],
        )
        latency = _histogram(
            "function_invocation_seconds",
            "seconds per remote (or asynchronous) batch; per invocation for synchronous "
            "embedded functions, one in 16 timed",
            label,
        )
        batches = _histogram(
            "function_batch_messages", "messages per batch (remote and async functions)", label
        )
        mailbox = _gauge(
            "function_mailbox_messages", "messages waiting behind a batch in flight now", label
        )
        mailbox_max = _gauge(
            "function_mailbox_max_messages", "the longest mailbox an address of it had", label
        )
        current, longest = mailboxes(self.job)
        for typename, stats in function_stats(self.job):
            labels = [typename]
            invocations.add_metric(labels, stats.invocations)
            messages_in.add_metric(labels, stats.messages_in)
            messages_out.add_metric(labels, stats.messages_out)
            failures.add_metric([typename, "retryable"], stats.failures_retryable)
            failures.add_metric([typename, "terminal"], stats.failures_terminal)
            _observe(latency, labels, stats.latency)
            _observe(batches, labels, stats.batch_sizes)
            mailbox.add_metric(labels, current.get(typename, 0))
            mailbox_max.add_metric(labels, longest.get(typename, 0))
        yield from (invocations, messages_in, messages_out, failures, latency, batches)
        yield from (mailbox, mailbox_max)

    def _endpoints(self) -> Iterator[Metric]:
        label = ["endpoint"]
        calls = _counter(
            "endpoint_calls", "calls to a remote endpoint (retries not counted)", label
        )
        errors = _counter("endpoint_errors", "calls that failed for good", label)
        retries = _counter("endpoint_retries", "attempts that failed and were tried again", label)
        latency = _histogram(
            "endpoint_call_seconds", "seconds per successful call, retries included", label
        )
        in_flight = _gauge("endpoint_calls_in_flight", "calls under way now", label)
        for origin, stats in sorted(self.job.client.endpoints.items()):
            labels = [origin]
            calls.add_metric(labels, stats.calls)
            errors.add_metric(labels, stats.errors)
            retries.add_metric(labels, stats.retries)
            _observe(latency, labels, stats.latency)
            in_flight.add_metric(labels, stats.in_flight)
        yield from (calls, errors, retries, latency, in_flight)
        open_connections = _gauge(
            "remote_open_connections", "connections open to remote functions (one shared pool)"
        )
        open_connections.add_metric([], self.job.client.open_connections)
        waiting = _gauge(
            "remote_calls_waiting_for_slot",
            "remote batches waiting for a connection slot (setting remote_max_connections)",
        )
        waiting.add_metric([], sum(d.waiting_for_slot for d in self.job.dispatchers))
        yield from (open_connections, waiting)

    def _ingresses(self) -> Iterator[Metric]:
        label = ["ingress"]
        records = _counter("ingress_records", "records an ingress handed to the runtime", label)
        blocked = _counter(
            "ingress_blocked_seconds", "seconds an ingress waited for room (backpressure)", label
        )
        for ingress_id, stats in sorted(self.job.ingress_stats.items()):
            records.add_metric([ingress_id], stats.records)
            blocked.add_metric([ingress_id], stats.blocked_seconds)
        position = _gauge(
            "ingress_kafka_position",
            "the next offset to read, per partition",
            ["ingress", "partition"],
        )
        lag = _gauge(
            "ingress_kafka_lag",
            "records behind the partition's end (its high watermark as last fetched)",
            ["ingress", "partition"],
        )
        for source in self.job.sources:
            offsets = getattr(source, "partition_offsets", None)
            if offsets is None:
                continue
            for partition, (next_offset, behind) in sorted(offsets().items()):
                position.add_metric([source.ingress_id, partition], next_offset)
                if behind is not None:
                    lag.add_metric([source.ingress_id, partition], behind)
        yield from (records, blocked, position, lag)

    def _egresses(self) -> Iterator[Metric]:
        label = ["egress"]
        records = _counter("egress_records", "records written to an egress", label)
        open_records = _gauge(
            "egress_open_transaction_records",
            "records an egress holds: buffered, or in a transaction not committed yet",
            label,
        )
        written = self.job.outputs.egress_records
        for egress_id, sink in sorted(self.job.sinks.items()):
            records.add_metric([egress_id], written.get(egress_id, 0))
            open_records.add_metric([egress_id], sink.backlog())
        commits = _histogram(
            "egress_commit_seconds", "seconds an egress's commit took at a checkpoint", label
        )
        checkpoints = self.job.checkpoints
        if checkpoints is not None:
            for egress_id, histogram in sorted(checkpoints.commit_seconds.items()):
                _observe(commits, [egress_id], histogram)
        yield from (records, open_records, commits)

    def _checkpoints(self) -> Iterator[Metric]:
        checkpoints = self.job.checkpoints
        if checkpoints is None:
            return
        completed = _counter("checkpoints", "checkpoints (and savepoints) completed")
        completed.add_metric([], checkpoints.completed)
        duration = _histogram("checkpoint_duration_seconds", "seconds from cut to commit")
        _observe(duration, [], checkpoints.durations)
        written = _counter("checkpoint_written_bytes", "bytes of the files checkpoints wrote")
        written.add_metric([], checkpoints.bytes_written)
        stall = _gauge("checkpoint_max_stall_seconds", "the longest time a cut held the event loop")
        stall.add_metric([], checkpoints.max_stall_ms / 1000)
        yield from (completed, duration, written, stall)
        if checkpoints.last_completed_at:
            age = _gauge(
                "checkpoint_last_completed_age_seconds", "seconds since a checkpoint completed"
            )
            age.add_metric([], max(0.0, time.time() - checkpoints.last_completed_at))
            yield age

    def _runtime(self) -> Iterator[Metric]:
        job = self.job
        in_flight = _gauge("messages_in_flight", "messages inside the runtime")
        in_flight.add_metric([], job.pending)
        remote = _gauge("remote_messages_in_flight", "of them, to remote functions")
        remote.add_metric([], job.pending_remote)
        dead = _counter("dead_letters", "messages and records written to the dead letters")
        dead.add_metric([], job.dead_letters)
        delayed = _gauge("delayed_messages_pending", "delayed messages waiting for their time")
        delayed.add_metric([], len(job.timers))
        lag = _histogram(
            "event_loop_lag_seconds", "how late the event loop ran a timer (probed 4 times/s)"
        )
        _observe(lag, [], job.loop_lag.histogram)
        yield from (in_flight, remote, dead, delayed, lag)


class JobMetrics:
    """The registry of one job's metrics, and its text exposition."""

    def __init__(self, job: ObservedJob) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobCollector(job))
        ProcessCollector(registry=self.registry)

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format (version 0.0.4)."""
        return generate_latest(self.registry)


#: metric types whose samples add up across jobs (gauges are the current job's alone)
_SUMMED = ("counter", "histogram")


def _sample_key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


class CumulativeMetrics:
    """``/metrics`` of a process that runs one job after another (a cluster worker runs a new
    job per assignment): each counter and histogram is the current job's plus those of the
    jobs before it in this process, so none goes backwards at a rebalance (Prometheus would
    read a reset). Gauges are the current job's; the process collector is the process's."""

    def __init__(self) -> None:
        #: family name -> the finished jobs' totals (the samples summed per name and labels)
        self._carried: dict[str, Metric] = {}
        self._job: JobCollector | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CarriedCollector(self))
        ProcessCollector(registry=self.registry)

    def serve(self, job: ObservedJob | None) -> None:
        """Count ``job`` from now on (None: none until the next); the totals of the job
        before, read now, are carried (its counts after this are not)."""
        if self._job is not None:
            self._fold(self._job.collect())
        self._job = None if job is None else JobCollector(job)

    def _fold(self, families: Iterable[Metric]) -> None:
        for family in families:
            if family.type not in _SUMMED:
                continue
            carried = self._carried.get(family.name)
            if carried is None:
                carried = self._carried[family.name] = Metric(
                    family.name, family.documentation, family.type
                )
            totals = {_sample_key(s): s for s in carried.samples}
            for sample in family.samples:
                key = _sample_key(sample)
                before = totals.get(key)
                totals[key] = (
                    sample if before is None else before._replace(value=before.value + sample.value)
                )
            carried.samples = list(totals.values())

    def collect(self) -> Iterator[Metric]:
        """The current job's families with the carried totals added, then the families only
        earlier jobs had."""
        shown: set[str] = set()
        for family in self._job.collect() if self._job is not None else ():
            carried = self._carried.get(family.name)
            if carried is not None and family.type in _SUMMED:
                base = {_sample_key(s): s for s in carried.samples}
                samples = []
                for sample in family.samples:
                    before = base.pop(_sample_key(sample), None)
                    if before is not None:
                        sample = sample._replace(value=sample.value + before.value)
                    samples.append(sample)
                family.samples = samples + list(base.values())  # label sets it lacks
                shown.add(family.name)
            yield family
        for name, carried in self._carried.items():
            if name not in shown:
                yield carried

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format (version 0.0.4)."""
        return generate_latest(self.registry)


class _CarriedCollector(Collector):
    def __init__(self, metrics: CumulativeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.collect()
