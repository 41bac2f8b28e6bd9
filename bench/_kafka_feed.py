"""Input for bench/kafka_e2e.py: records ``<kind>:<time.time_ns() at send>`` to one topic.

Keys are ``k0`` .. ``k<keys-1>`` round-robin. ``--rate 0`` produces as fast as kafka-python
can (the backlog); otherwise ``--rate`` records per second for ``--seconds`` (paced every 5
ms, linger 0: each record is sent when it is stamped). Prints the number sent on stdout.

    python bench/_kafka_feed.py --bootstrap HOST:PORT --topic t --count 1000 --rate 0 --kind T
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaProducer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--kind", default="T")
    args = parser.parse_args()
    keys = [f"k{i}".encode() for i in range(args.keys)]
    prefix = f"{args.kind}:".encode()
    fast = args.rate <= 0
    producer = KafkaProducer(
        bootstrap_servers=args.bootstrap,
        acks="all",
        linger_ms=20 if fast else 0,
        batch_size=256 * 1024 if fast else 16 * 1024,
    )
    send, topic, n_keys, now_ns = producer.send, args.topic, len(keys), time.time_ns
    start = time.monotonic()
    for i in range(args.count):
        if not fast and i % max(1, int(args.rate / 200)) == 0:
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        send(topic, key=keys[i % n_keys], value=prefix + b"%d" % now_ns())
    producer.flush(timeout=120)
    producer.close(timeout=30)
    print(args.count, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
