"""The Kafka ingress's batch reader: CPU per record with kafka-python's reader and the lean one.

A real Kafka broker (started here, single node, 127.0.0.1; or an existing one: ``--bootstrap``)
holds one topic of small records shaped like the benchmark against StateFun's inputs (a short
key, a ~20-byte value), written once by a producer in batches of its ``batch.size``; optionally
gzip-compressed or with two headers per record. Each reader then consumes the whole topic from
the start with one ``KafkaConsumer`` the way the ingress does (``max_poll_records`` 2,000,
``read_committed``), and the CPU seconds of this process per record are reported (the
consumer's network thread included), best of ``--repeat``:

  kafka-python  the consumer as it comes (``Fetcher.PartitionRecords``)
  lean          the same consumer after ``statefun.ingress._kafka_fetch.install``

The records the two read are compared (count, last offset, a checksum of keys and values).

    .venv/bin/python bench/kafka_consumer.py                  # about 1 minute
    .venv/bin/python bench/kafka_consumer.py --records 50000  # quicker
    .venv/bin/python bench/kafka_consumer.py --smoke --bootstrap 127.0.0.1:9092  # does it run?

Progress goes to stderr; a Markdown table and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, cpu_seconds, expect, progress, smoke_banner  # noqa: E402
from bench._jvm_processes import create_topics  # noqa: E402
from statefun._kafka import import_kafka  # noqa: E402
from statefun._kafka_local.broker import KafkaBroker, kafka_version  # noqa: E402
from statefun.ingress._kafka_fetch import install  # noqa: E402
from statefun.ingress.kafka import DEFAULT_POLL_RECORDS  # noqa: E402

kafka = import_kafka()

#: topic shapes: name -> (compression, headers per record)
SHAPES: dict[str, tuple[str | None, int]] = {
    "plain": (None, 0),
    "gzip": ("gzip", 0),
    "headers": (None, 2),
}
READERS = ("kafka-python", "lean")


def fill(bootstrap: str, shape: str, records: int) -> str:
    compression, header_count = SHAPES[shape]
    topic = f"bench-consumer-{shape}-{time.time_ns()}"
    create_topics(bootstrap, [topic])
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=compression,
        linger_ms=50,
        batch_size=256 * 1024,
    )
    headers = [(f"h{i}", b"header-value") for i in range(header_count)]
    try:
        for i in range(records):
            producer.send(
                topic,
                key=b"key-%d" % (i % 10_000),
                value=b"%d %d" % (i, time.time_ns()),
                headers=headers,
            )
        producer.flush()
    finally:
        producer.close()
    return topic


def read(bootstrap: str, topic: str, records: int, reader: str) -> tuple[float, tuple[int, ...]]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        max_poll_records=DEFAULT_POLL_RECORDS,
    )
    try:
        unsupported = install(consumer) if reader == "lean" else None
        if unsupported is not None:
            raise RuntimeError(f"the lean reader cannot be used: {unsupported}")
        partition = kafka.TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        consumer.position(partition)
        count, last, digest = 0, -1, 0
        cpu = cpu_seconds()
        deadline = time.monotonic() + 300
        while count < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{reader}: read {count} of {records} records")
            for batch in consumer.poll(timeout_ms=500).values():
                count += len(batch)
                last = batch[-1].offset
                digest = zlib.crc32(batch[-1].key + batch[-1].value, digest)
        cpu = cpu_seconds() - cpu
    finally:
        consumer.close()
    expect(count == records, f"{reader}: read {count} records of {topic}, expected {records}")
    return cpu / records * 1e6, (count, last, digest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per topic")
    parser.add_argument("--repeat", type=int, default=3, help="reads per reader; the best counts")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.records, args.repeat = 2_000, 1
    best: dict[tuple[str, str], float] = {}
    broker = KafkaBroker.external(args.bootstrap) if args.bootstrap else KafkaBroker(heap="512m")
    with broker:
        bootstrap = broker.bootstrap_servers
        progress(f"Kafka {kafka_version()} at {bootstrap}")
        for shape in SHAPES:
            topic = fill(bootstrap, shape, args.records)
            progress(f"{shape}: {args.records:,} records written")
            seen: dict[str, Any] = {}
            for repeat in range(args.repeat):
                for reader in READERS:
                    cpu_us, summary = read(bootstrap, topic, args.records, reader)
                    seen[reader] = summary
                    progress(f"[{repeat + 1}/{args.repeat}] {shape}, {reader}: {cpu_us:.2f} us")
                    key = (shape, reader)
                    best[key] = min(best.get(key, cpu_us), cpu_us)
            expect(
                seen["lean"] == seen["kafka-python"],
                f"{shape}: the readers read different records: {seen}",
            )
    if args.smoke:
        smoke_banner()
    print(f"{args.records:,} records per topic, one partition, best of {args.repeat}")
    print()
    print("| topic | kafka-python's reader | lean reader | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for shape in SHAPES:
        theirs, ours = best[(shape, "kafka-python")], best[(shape, "lean")]
        ratio = f"{theirs / ours:.2f}x" if ours else "-"  # CPU time is counted in ticks
        print(f"| {shape} | {theirs:.2f} us | {ours:.2f} us | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
