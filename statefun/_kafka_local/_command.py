"""``statefun kafka``: a local Kafka broker for development, in the foreground.

    statefun kafka start [--port 9092] [--topic NAME[:PARTITIONS]]... [--data-dir DIR]
    statefun kafka status [--port 9092]
    statefun kafka stop [--port 9092]
    statefun kafka fetch

``start`` prints ``Kafka broker ready at 127.0.0.1:PORT`` once the broker answers and the
topics asked for exist, and runs until Ctrl-C (or SIGTERM), which stops the broker cleanly.
Without ``--data-dir`` its data lives in a temporary directory removed on stop. ``stop``
sends SIGTERM to the ``start`` that serves a port (found by the pid file it keeps in the
cache directory while it runs) and waits until it is gone.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from statefun._kafka_local import broker as kafka_local

__all__ = ["add_arguments", "run"]

log = logging.getLogger("statefun.kafka")

HOST = kafka_local.HOST
DEFAULT_PORT = 9092
_TOPIC = re.compile(r"^([A-Za-z0-9._-]{1,249})(?::(\d+))?$")
_POLL_SECONDS = 0.5


def topic_argument(text: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:PARTITIONS`` (Kafka's topic name rule; 1 partition by default)."""
    match = _TOPIC.match(text)
    if match is None or match.group(1) in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME[:PARTITIONS] (a topic name is 1-249 of A-Z a-z 0-9 . _ -)"
        )
    partitions = int(match.group(2) or 1)
    if not 1 <= partitions <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: partitions must be 1 to 10000")
    return match.group(1), partitions


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0-65535")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser(
        "start",
        help="start a broker on 127.0.0.1 in the foreground; Ctrl-C stops it",
        description="Start a single-node Kafka 4.x broker (KRaft) on 127.0.0.1 for "
        "development, built from Maven Central jars (needs Java 17+, and Maven for the first "
        "fetch). Runs until Ctrl-C.",
    )
    start.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help="the broker's port (0: a free one)"
    )
    start.add_argument(
        "--topic",
        dest="topics",
        type=topic_argument,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="create this topic (1 partition unless given); repeatable",
    )
    start.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the broker's data (topics, records, offsets) in DIR across restarts "
        "(default: a temporary directory, removed when the broker stops)",
    )
    start.add_argument(
        "--controller-port",
        type=_port,
        default=0,
        metavar="PORT",
        help="the KRaft controller's port (default: 0, a free one)",
    )
    start.add_argument("--heap", default="512m", metavar="SIZE", help="the broker JVM's -Xmx")
    status = actions.add_parser("status", help="tell whether a broker answers on 127.0.0.1:PORT")
    status.add_argument("--port", type=_port, default=DEFAULT_PORT, help="the broker's port")
    stop = actions.add_parser(
        "stop", help="stop the broker that `statefun kafka start` runs on 127.0.0.1:PORT"
    )
    stop.add_argument("--port", type=_port, default=DEFAULT_PORT, help="the broker's port")
    actions.add_parser("fetch", help="fetch Kafka's jars from Maven Central now (done once)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", "info") != "debug":
        # The command says what matters itself; the module's INFO lines would repeat it.
        logging.getLogger(kafka_local.__name__).setLevel(logging.WARNING)
    try:
        if args.action == "status":
            return _status(args.port)
        if args.action == "fetch":
            return _fetch()
        if args.action == "stop":
            return _stop(args.port)
        return _start(args)
    except kafka_local.KafkaBrokerError as exc:
        _fail(str(exc))
        return 1


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _fail(text: str) -> None:
    """One line on stderr; the rest (a log's tail, Maven's output) only at debug level."""
    first, _, rest = text.strip().partition("\n")
    if rest:
        log.debug("%s", rest)
        first += " (details: --log-level debug)"
    sys.stderr.write(f"statefun kafka: error: {first}\n")
    sys.stderr.flush()


def _tools_or_fail() -> bool:
    """Whether Java (and Maven, while the jars are not fetched yet) are there; else says so."""
    fetch = not kafka_local.jars_fetched()
    missing = kafka_local.missing_tools(fetch=fetch)
    if not missing:
        return True
    java = f"Java {kafka_local.MIN_JAVA}+"
    if fetch:
        version = kafka_local.kafka_version()
        needs = f"{java} and Maven (mvn) on PATH to fetch Kafka {version} from Maven Central"
    else:
        needs = f"{java} on PATH to run the Kafka broker"
    _fail(f"needs {needs}; missing: {', '.join(missing)}")
    return False


def _fetch() -> int:
    if not _tools_or_fail():
        return 1
    version = kafka_local.kafka_version()
    if not kafka_local.jars_fetched():
        _say(f"fetching Kafka {version} from Maven Central (about 45 MB, first run only)...")
    libs = kafka_local.ensure_kafka_jars()
    _say(f"Kafka {version} jars in {libs}")
    return 0


def _status(port: int) -> int:
    try:
        brokers = kafka_local.probe(HOST, port)
    except OSError as exc:
        _say(f"no Kafka broker at {HOST}:{port} ({exc.strerror or exc})")
        return 1
    except kafka_local.KafkaBrokerError as exc:
        _say(f"{HOST}:{port} answers, but not as a Kafka broker ({exc})")
        return 1
    _say(f"Kafka broker running at {HOST}:{port} ({brokers} broker(s) in the cluster)")
    return 0


_STOP_TIMEOUT = 60.0


def _pid_file(port: int) -> Path:
    """Where a running ``statefun kafka start`` on ``port`` keeps its process id."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pystatefun" / "kafka-run" / f"{port}.pid"


def _alive_start(pid: int) -> bool:
    """Whether ``pid`` is a running ``statefun kafka start`` (not a process that reused it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not one this user started
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc here: the live pid has to do
    return b"kafka" in command and b"start" in command


def _stop(port: int) -> int:
    path = _pid_file(port)
    try:
        pid = int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        pid = 0
    if not pid or not _alive_start(pid):
        path.unlink(missing_ok=True)
        _say(f"no broker of `statefun kafka start` on {HOST}:{port}")
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT
    while _alive_start(pid):
        if time.monotonic() > deadline:
            _fail(f"process {pid} did not stop within {_STOP_TIMEOUT:.0f} s")
            return 1
        time.sleep(0.2)
    _say(f"Kafka broker on {HOST}:{port} stopped")
    return 0


def _port_taken(port: int) -> str | None:
    """Why the broker cannot listen on ``port`` (None if it can)."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the broker binds (Java's server sockets reuse addresses): connections of an earlier
        # broker on that port, closed and waiting out TIME_WAIT, do not keep it from listening.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            reason = f"cannot listen on {HOST}:{port}: {exc.strerror or exc}"
        else:
            return None
    try:
        kafka_local.probe(HOST, port, timeout=2.0)
    except (OSError, kafka_local.KafkaBrokerError):
        return reason
    return reason + " (a Kafka broker runs there already: use it, or pick another --port)"


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _start(args: argparse.Namespace) -> int:
    taken = _port_taken(args.port)
    if taken:
        _fail(taken)
        return 1
    if not _tools_or_fail():
        return 1
    if not kafka_local.jars_fetched():
        _say(
            f"fetching Kafka {kafka_local.kafka_version()} from Maven Central "
            "(about 45 MB, first run only)..."
        )
    # Ctrl-C, and SIGTERM, stop the broker cleanly (also where SIGINT came in ignored: a
    # shell starts background jobs so).
    previous = {s: signal.signal(s, _stop_on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    broker = kafka_local.KafkaBroker(
        port=args.port,
        controller_port=args.controller_port,
        heap=args.heap,
        data_dir=args.data_dir,
        startup_timeout=120.0,
    )
    pid_port = 0
    try:
        try:
            broker.start()
        except OSError as exc:  # the data directory
            _fail(f"cannot use {args.data_dir}: {exc.strerror or exc}")
            return 1
        try:
            created = _create_topics(broker.bootstrap_servers, args.topics)
        except Exception as exc:  # kafka-python's errors have no common base of ours
            _fail(f"cannot create the topics: {type(exc).__name__}: {exc}")
            return 1
        pid_port = _write_pid_file(broker.port)
        _say(f"Kafka broker ready at {broker.bootstrap_servers}")
        for line in created:
            _say(line)
        kept = f"data in {broker.data_dir}" if args.data_dir else "its data goes with it"
        _say(f"Ctrl-C stops the broker ({kept}; its log: {broker.log_file})")
        try:
            while broker.is_running:
                time.sleep(_POLL_SECONDS)
        except KeyboardInterrupt:
            broker.stop()
            _say("Kafka broker stopped")
            return 0
        _fail(f"the Kafka broker exited on its own: {_first_error(broker)}")
        return 1
    finally:
        broker.stop()
        if pid_port:
            _remove_pid_file(pid_port)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _write_pid_file(port: int) -> int:
    """Record this process for `statefun kafka stop`; the port, or 0 if it cannot."""
    path = _pid_file(port)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n", encoding="utf-8")
    except OSError as exc:
        log.warning(
            "cannot write %s (statefun kafka stop will not find this broker): %s", path, exc
        )
        return 0
    return port


def _remove_pid_file(port: int) -> None:
    path = _pid_file(port)
    try:
        if int(path.read_text(encoding="utf-8").strip()) == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _first_error(broker: kafka_local.KafkaBroker) -> str:
    for line in broker.log_tail(200).splitlines():
        if " ERROR " in line or " FATAL " in line:
            return line.strip()
    return f"see {broker.log_file}"


def _create_topics(bootstrap: str, topics: list[tuple[str, int]]) -> list[str]:
    """Create the topics that do not exist yet; one line per topic saying what it is."""
    if not topics:
        return []
    wanted = dict(topics)  # the last NAME:PARTITIONS given for a name wins
    from statefun._kafka import import_kafka

    kafka = import_kafka()
    admin: Any = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="statefun-kafka")
    try:
        existing = {
            t["name"]: len(t["partitions"])
            for t in admin.describe_topics()
            if not t.get("is_internal")
        }
        new = {name: n for name, n in wanted.items() if name not in existing}
        if new:
            admin.create_topics(
                {name: {"num_partitions": n, "replication_factor": 1} for name, n in new.items()},
                wait_for_metadata=True,
            )
    finally:
        admin.close()
    lines = []
    for name, partitions in wanted.items():
        if name in new:
            lines.append(f"created topic {name} ({_partitions(partitions)})")
        else:
            had = existing[name]
            note = "" if had == partitions else f"; kept, not {partitions}"
            lines.append(f"topic {name} exists ({_partitions(had)}{note})")
    return lines


def _partitions(count: int) -> str:
    return f"{count} partition" + ("" if count == 1 else "s")
