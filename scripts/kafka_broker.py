"""The local Kafka broker, from a checkout: the same as ``statefun kafka ...``.

    .venv/bin/python scripts/kafka_broker.py fetch
    .venv/bin/python scripts/kafka_broker.py start [--port 9092] [--topic NAME[:PARTITIONS]]...

Prefer ``statefun kafka start``, which an installed pystatefun provides.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from statefun._cli import main as statefun
    except ImportError as exc:
        sys.stderr.write(
            f"kafka_broker.py: error: pystatefun is not installed for {sys.executable} ({exc}); "
            "run `make .venv/.installed` and use .venv/bin/statefun kafka start\n"
        )
        return 2
    return statefun(["kafka", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
