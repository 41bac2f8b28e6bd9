"""The ceiling of bench/kafka_e2e.py: a plain kafka-python consume-and-produce loop.

It does what the runtime's counter does, with nothing in between: poll a batch, count per key
in a dict, produce ``<value> <count>`` keyed like the input (kafka-python sends in the
background, linger 0), and every ``--interval-ms``:

* at-least-once: flush (wait for every acknowledgement), then commit the consumed offsets;
* ``--transactional``: everything since the last commit is one Kafka transaction, which also
  commits the consumed offsets (``send_offsets_to_transaction``), every ``--interval-ms`` -
  what the runtime's exactly-once egress does per checkpoint.

Reads every partition of the ``--topics`` from the beginning (assigned, no rebalancing). Prints
``ready`` on stdout once connected; stops on SIGTERM.

    python bench/_kafka_loop.py --bootstrap HOST:PORT --topics a,b --out c --group g
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import warnings
from typing import Any

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True, help="comma-separated input topics")
    parser.add_argument("--out", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--interval-ms", type=int, default=1000)
    args = parser.parse_args()
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    partitions = [
        TopicPartition(topic, p)
        for topic in args.topics.split(",")
        for p in sorted(consumer.partitions_for_topic(topic) or ())
    ]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    config: dict[str, Any] = {"bootstrap_servers": args.bootstrap, "acks": "all"}
    if args.transactional:
        config.update(transactional_id=f"{args.group}-tx", enable_idempotence=True)
    producer = KafkaProducer(**config)
    if args.transactional:
        producer.init_transactions()
        producer.begin_transaction()
    print("ready", flush=True)
    counts: dict[bytes, int] = {}
    positions: dict[Any, int] = {}
    interval = args.interval_ms / 1000
    next_commit = time.monotonic() + interval
    send, out = producer.send, args.out
    while not stop:
        polled = consumer.poll(timeout_ms=100, max_records=500)
        for tp, records in polled.items():
            for record in records:
                count = counts.get(record.key, 0) + 1
                counts[record.key] = count
                send(out, key=record.key, value=record.value + b" %d" % count)
            positions[tp] = records[-1].offset + 1
        if time.monotonic() >= next_commit:
            next_commit = time.monotonic() + interval
            offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in positions.items()}
            if args.transactional:
                if offsets:
                    producer.send_offsets_to_transaction(offsets, args.group)
                producer.commit_transaction()
                producer.begin_transaction()
            else:
                producer.flush()
                if offsets:
                    consumer.commit(offsets)
    if args.transactional:
        producer.abort_transaction()
    producer.close(timeout=10)
    consumer.close(autocommit=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
