"""A real Kafka 4.x broker on 127.0.0.1 for local development (no Docker).

    python scripts/kafka_broker.py fetch     # fetch the jars from Maven Central (once)
    python scripts/kafka_broker.py start     # start one, print its address; Ctrl-C stops
    python scripts/kafka_broker.py start --port 9092

Needs Java 17+ and Maven. See statefun/_testing/kafka_broker.py.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

_HERE = Path(__file__).resolve().parent
# Run as a script from a checkout: import the package from the repository root.
sys.path.insert(0, str(_HERE.parent))

from statefun._testing.kafka_broker import (  # noqa: E402
    KafkaBroker,
    KafkaBrokerError,
    ensure_kafka_jars,
    kafka_version,
)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="fetch the broker's jars from Maven Central into the cache")
    start = commands.add_parser("start", help="start a broker; Ctrl-C stops it")
    start.add_argument("--port", type=int, default=0, help="PLAINTEXT port (default: a free one)")
    start.add_argument(
        "--controller-port", type=int, default=0, help="controller port (default: a free one)"
    )
    start.add_argument("--heap", default="512m", help="JVM -Xmx (default: 512m)")
    start.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    try:
        if args.command == "fetch":
            libs = ensure_kafka_jars()
            print(f"Kafka {kafka_version()} jars: {libs}")
            return 0
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
        with KafkaBroker(
            port=args.port, controller_port=args.controller_port, heap=args.heap
        ) as broker:
            print(f"Kafka {kafka_version()} bootstrap servers: {broker.bootstrap_servers}")
            print(f"broker log: {broker.log_file}  (Ctrl-C to stop)", flush=True)
            try:
                while broker.is_running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                return 0
            print(f"the broker exited on its own; end of its log:\n{broker.log_tail()}")
            return 1
    except KafkaBrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
