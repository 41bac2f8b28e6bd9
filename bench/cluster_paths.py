"""A clustered worker's per-message code paths, in one process, without Kafka.

* exchange: N messages for key groups of another worker, sent (``ExchangeBatches``, the
  producer's record append ``egress/_kafka_append.write_records`` into record batches) and
  received (the reader's batch decoding ``ingress/_kafka_fetch._read_batch``,
  ``decode_exchange``): CPU microseconds per message on each side;
* cut: ``changelog_rows`` of a cut holding N messages in flight over 10,000 addresses, with the
  epoch's ``AddressPartitions`` as it is after the first cut: microseconds per message.

Best of ``--repeat`` rounds (CPU time of this process), so other work on the machine shows
less. bench/cluster.py measures the whole (workers and broker); this, the parts it changed.

    .venv/bin/python bench/cluster_paths.py
    .venv/bin/python bench/cluster_paths.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, expect, smoke_banner  # noqa: E402
from statefun._kafka import import_kafka  # noqa: E402
from statefun._settings import Settings  # noqa: E402
from statefun.cluster._changelog import AddressPartitions, TrackedMemoryState, changelog_rows  # noqa: E402
from statefun.cluster._config import ClusterConfig, cluster_config  # noqa: E402
from statefun.cluster._exchange import ExchangeBatches, decode_exchange, partition_in_key  # noqa: E402
from statefun.egress._kafka_append import write_records  # noqa: E402
from statefun.ingress._kafka_fetch import _read_batch  # noqa: E402
from statefun.runtime._envelope import Envelope  # noqa: E402
from statefun.sdk._types import TypedValue  # noqa: E402

KEYS = 10_000


def config() -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9",
            "cluster.job_id": "bench",
            "cluster.worker_id": "w",
            "cluster.partitions": "32",
        },
        environ={},
    )
    found = cluster_config(settings)
    assert found is not None
    return found


def messages(n: int) -> list[tuple[int, Envelope]]:
    value = TypedValue("bench/Stamp", b"T:1765000000000000000")
    return [
        (i * 7919 % 128, Envelope("bench/counter", f"k{i % KEYS}", value, None)) for i in range(n)
    ]


def send(cfg: ClusterConfig, sent: list[tuple[int, Envelope]]) -> list[tuple[int, bytes]]:
    """The messages as Kafka record batches: (partition, the batch's bytes)."""
    import_kafka()  # (kafka-python, its import warnings quiet)
    from kafka.record.memory_records import MemoryRecordsBuilder

    batches = ExchangeBatches(cfg)
    rows = [row for kg, e in sent if (row := batches.add(kg, e)) is not None]
    rows += batches.rows()
    by_partition: dict[int, list[tuple[bytes, bytes, tuple[()]]]] = {}
    for _, key, value, _ in rows:
        encoded = key.encode()
        by_partition.setdefault(partition_in_key(encoded), []).append((encoded, value, ()))
    out: list[tuple[int, bytes]] = []
    for partition, records in by_partition.items():
        done = 0
        while done < len(records):
            builder = MemoryRecordsBuilder(2, 0, 1 << 20)
            done = write_records(builder, records, done, 1)
            builder.close()
            out.append((partition, bytes(builder.buffer())))
    return out


def receive(batches: list[tuple[int, bytes]]) -> int:
    kafka = import_kafka()
    from kafka.record.memory_records import MemoryRecords

    count = 0
    for partition, data in batches:
        records = MemoryRecords(data)
        while (batch := records.next_batch()) is not None:
            found, _ = _read_batch(kafka.TopicPartition("x", partition), batch, -1)
            count += sum(len(decode_exchange(r.value)) for r in found)
    return count


def best(repeat: int, work: object) -> float:
    fastest = float("inf")
    for _ in range(repeat):
        gc.collect()
        started = time.process_time()
        work()  # type: ignore[operator]
        fastest = min(fastest, time.process_time() - started)
    return fastest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="exchange messages")
    parser.add_argument("--in-flight", type=int, default=6_000, help="messages at the cut")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.messages, args.in_flight, args.repeat = 500, 200, 1
    cfg = config()
    sent = messages(args.messages)
    batches = send(cfg, sent)
    expect(receive(batches) == len(sent), "the exchange lost or doubled messages")
    send_s = best(args.repeat, lambda: send(cfg, sent))
    receive_s = best(args.repeat, lambda: receive(batches))
    state = TrackedMemoryState()
    in_flight = [e for _, e in messages(args.in_flight)]
    owned = list(range(cfg.partitions // 2))
    addresses = AddressPartitions(cfg)
    changelog_rows(cfg, state, set(), in_flight, [], owned, None, addresses)  # the first cut
    cut_s = best(
        args.repeat,
        lambda: changelog_rows(cfg, state, set(), in_flight, [], owned, None, addresses),
    )
    if args.smoke:
        smoke_banner()
    print("| path | per message |")
    print("| --- | ---: |")
    print(f"| exchange: send ({len(batches)} record batches) | {1e6 * send_s / len(sent):.2f} us |")
    print(f"| exchange: receive | {1e6 * receive_s / len(sent):.2f} us |")
    print(f"| cut: a message in flight | {1e6 * cut_s / len(in_flight):.2f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
