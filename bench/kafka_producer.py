"""The Kafka egress's producer settings: CPU per record with kafka-python's defaults and ours.

Each setting sends the same records through one kafka-python ``KafkaProducer`` to a real
Kafka broker (started here, single node, 127.0.0.1; or an existing one: ``--bootstrap``), the
way the exactly-once egress does: a transactional producer (idempotent, ``acks=all``), records
to one key of a one-partition topic, a short pause every 2,000 records (the egress hands
records over per 50 ms flush), then ``flush`` and ``commit_transaction``. Reported: CPU seconds
of this process per record (the producer's sender thread included), wall time, and how often
``send`` woke the sender thread. The topic must then hold every record exactly once.

  defaults     kafka-python's ``linger.ms`` 0 and ``batch.size`` 16 KiB, ``send`` per record
  egress-send  ``statefun.egress.kafka.DEFAULT_LINGER_MS`` / ``DEFAULT_BATCH_BYTES`` and the
               egress's ``KeyPartitioner`` (each key's partition remembered), ``send`` per
               record (the egress before bulk appends, and its fallback)
  egress       the same settings, records handed over 2,000 at a time by the egress's
               ``BulkAppender`` (statefun/egress/_kafka_append.py), one outcome per batch

    .venv/bin/python bench/kafka_producer.py                 # about 30 s
    .venv/bin/python bench/kafka_producer.py --records 20000 # quicker
    .venv/bin/python bench/kafka_producer.py --smoke --bootstrap 127.0.0.1:9092  # does it run?

Progress goes to stderr; a Markdown table and the ratio to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, cpu_seconds, expect, progress, smoke_banner  # noqa: E402
from bench._jvm_processes import create_topics, end_offsets  # noqa: E402
from statefun._kafka import import_kafka  # noqa: E402
from statefun._kafka_local.broker import KafkaBroker, kafka_version  # noqa: E402
from statefun.egress._kafka_append import BulkAppender  # noqa: E402
from statefun.egress._kafka_partitioner import KeyPartitioner  # noqa: E402
from statefun.egress.kafka import DEFAULT_BATCH_BYTES, DEFAULT_LINGER_MS  # noqa: E402

kafka = import_kafka()
from kafka.producer.sender import Sender  # noqa: E402


def _egress() -> dict[str, Any]:
    return {
        "linger_ms": DEFAULT_LINGER_MS,
        "batch_size": DEFAULT_BATCH_BYTES,
        "partitioner": KeyPartitioner(),
    }


SETTINGS: dict[str, Callable[[], dict[str, Any]]] = {
    "defaults": lambda: {},
    "egress-send": _egress,
    "egress": _egress,
}
#: settings whose records go through BulkAppender, CHUNK at a time
BULK = {"egress"}
CHUNK = 2000


def count_wakeups() -> list[int]:
    """Count ``Sender.wakeup`` calls (a socket write to the sender thread each)."""
    counter = [0]
    original = Sender.wakeup

    def wakeup(self: Any) -> None:
        counter[0] += 1
        original(self)

    Sender.wakeup = wakeup  # type: ignore[method-assign]
    return counter


def run(bootstrap: str, name: str, records: int, wakeups: list[int]) -> dict[str, float]:
    topic = f"bench-producer-{name}-{time.time_ns()}"
    create_topics(bootstrap, [topic])
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        transactional_id=topic,
        **SETTINGS[name](),
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        value = b"x" * 40
        wakeups[0] = 0
        failed = 0
        cpu, wall = cpu_seconds(), time.perf_counter()
        if name in BULK:
            appender = BulkAppender(producer, producer.config["partitioner"])
            deliveries = []
            for start in range(0, records, CHUNK):
                rows = [(topic, "hot", value, None)] * min(CHUNK, records - start)
                deliveries.append(appender.append(rows))
                time.sleep(0.002)
            producer.flush()
            failed = sum(n for d in deliveries for _, n in d.failures())
        else:
            futures = []
            for i in range(records):
                futures.append(producer.send(topic, key=b"hot", value=value))
                if i % CHUNK == CHUNK - 1:
                    time.sleep(0.002)
            producer.flush()
            failed = sum(1 for f in futures if f.failed())
        producer.commit_transaction()
        cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
        expect(not failed, f"{name}: {failed} records not acknowledged")
    finally:
        producer.close()
    # Every record once, then the transaction's commit marker.
    written = end_offsets(bootstrap, topic).get(0, 0)
    expect(written == records + 1, f"{name}: {topic} ends at {written}, expected {records} + 1")
    return {"cpu_us": cpu / records * 1e6, "wall_s": wall, "wakeups": float(wakeups[0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per setting")
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting; the best counts")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.records, args.repeat = 5_000, 1
    wakeups = count_wakeups()
    results: dict[str, dict[str, float]] = {}
    broker = KafkaBroker.external(args.bootstrap) if args.bootstrap else KafkaBroker(heap="512m")
    with broker:
        progress(f"Kafka {kafka_version()} at {broker.bootstrap_servers}")
        for repeat in range(args.repeat):
            for name in SETTINGS:
                got = run(broker.bootstrap_servers, name, args.records, wakeups)
                progress(
                    f"[{repeat + 1}/{args.repeat}] {name}: {got['cpu_us']:.1f} us CPU per "
                    f"record, {got['wall_s']:.2f} s, {got['wakeups']:.0f} wake-ups"
                )
                best = results.get(name)
                if best is None or got["cpu_us"] < best["cpu_us"]:
                    results[name] = got
    if args.smoke:
        smoke_banner()
    print(f"{args.records:,} transactional sends per run, best of {args.repeat}")
    print()
    print("| settings | CPU per record | wall | sender wake-ups |")
    print("| --- | ---: | ---: | ---: |")
    for name, got in results.items():
        print(
            f"| {name} | {got['cpu_us']:.1f} us | {got['wall_s']:.2f} s | {got['wakeups']:,.0f} |"
        )
    print()
    cpu = {name: got["cpu_us"] for name, got in results.items()}
    for slower, faster in (
        ("defaults", "egress-send"),
        ("egress-send", "egress"),
        ("defaults", "egress"),
    ):
        ratio = f"{cpu[slower] / cpu[faster]:.2f}x" if cpu[faster] else "-"  # CPU clock ticks
        print(f"- CPU per record: {slower} / {faster} = {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
