"""A real single-node Apache Kafka 4.x broker (KRaft mode) on 127.0.0.1, for development and tests.

No Docker and no tarball: the broker's jars come from Maven Central through the ``pom.xml``
beside this module (``mvn dependency:copy-dependencies``) into a cache directory, and the
broker runs as ``java -cp 'libs/*' kafka.Kafka server.properties``. Needs Java 17+, and Maven
for the first fetch. ``statefun kafka start`` runs one from the command line.

::

    from statefun._kafka_local.broker import KafkaBroker

    with KafkaBroker() as broker:
        use(broker.bootstrap_servers)        # "127.0.0.1:PORT"

Each broker gets fresh loopback ports and a fresh temporary data directory (removed by
:meth:`KafkaBroker.stop`), unless it is given a ``data_dir`` to keep (then the topics and
their records outlive the broker, and the next broker on that directory uses them again);
its log is ``broker.log`` in that directory.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from statefun._kafka_local._jars import (
    CACHE_ENV,
    LOG_TAIL_LINES,
    MIN_JAVA,
    POM_ENV,
    KafkaBrokerError,
    default_cache_dir,
    default_pom,
    ensure_kafka_jars,
    jars_fetched,
    kafka_version,
    missing_tools,
    require_java,
    tail,
)
from statefun._kafka_local._probe import probe, probe_metadata

__all__ = [
    "CACHE_ENV",
    "DEFAULT_JVM_OPTIONS",
    "MIN_JAVA",
    "POM_ENV",
    "KafkaBroker",
    "KafkaBrokerError",
    "default_cache_dir",
    "default_pom",
    "ensure_kafka_jars",
    "jars_fetched",
    "kafka_version",
    "missing_tools",
    "probe",
]

_log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_JVM_OPTIONS = ("-Xms64m", "-XX:+UseSerialGC")
"""The broker JVM's options besides -Xmx: the serial GC keeps a small broker small (about
190 MB resident under the test suite with -Xmx512m, against over 300 MB with G1)."""

_CONTROLLER_PORT_FILE = "controller-port"  # in a kept data directory
_FORMAT_TIMEOUT = 120.0
_PORT_ATTEMPTS = 3

_LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class _PortInUseError(KafkaBrokerError):
    """The broker exited because another process took one of its ports first."""


# ------------------------------------------------------------------------------------- broker


class KafkaBroker:
    """A single-node Kafka broker and controller (KRaft) bound to 127.0.0.1 only.

    :meth:`start` fetches the jars if needed, writes ``server.properties`` into a fresh temp
    directory, formats the storage and launches the JVM, then waits (``startup_timeout``) until
    the broker answers a metadata request. :meth:`stop` (or leaving the ``with`` block, or the
    interpreter exiting) ends the JVM and removes the directory.

    ``port``/``controller_port`` of 0 pick free ports. ``properties`` are added to (and override)
    the generated ``server.properties``. ``jvm_options`` replace :data:`DEFAULT_JVM_OPTIONS`.
    ``data_dir``: keep the broker's files there (created if missing) instead of a temp
    directory that :meth:`stop` removes; a directory formatted by an earlier broker is used as
    it is, on the controller port it was formatted with.
    """

    def __init__(
        self,
        *,
        libs_dir: Path | None = None,
        port: int = 0,
        controller_port: int = 0,
        heap: str = "512m",
        startup_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        properties: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        log_level: str = "INFO",
        data_dir: Path | None = None,
    ) -> None:
        self._libs_dir = libs_dir
        self._wanted_port = port
        self._wanted_controller_port = controller_port
        self._heap = heap
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._properties = dict(properties or {})
        self._jvm_options = list(jvm_options)
        self._log_level = log_level
        self._kept_dir = None if data_dir is None else Path(data_dir).expanduser().resolve()
        self._external: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._data_dir: Path | None = None
        self._port = 0
        self._controller_port = 0
        self._finalizer: weakref.finalize[..., KafkaBroker] | None = None

    @classmethod
    def external(cls, bootstrap_servers: str, *, startup_timeout: float = 60.0) -> KafkaBroker:
        """A broker that is already running elsewhere: start() only checks that it answers."""
        broker = cls(startup_timeout=startup_timeout)
        broker._external = bootstrap_servers
        return broker

    # -- facts

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` (or the external broker's bootstrap servers)."""
        if self._external is not None:
            return self._external
        if self._process is None:
            raise KafkaBrokerError("the Kafka broker is not started")
        return f"{HOST}:{self._port}"

    @property
    def port(self) -> int:
        """The PLAINTEXT listener's port (0 before start)."""
        return self._port

    @property
    def controller_port(self) -> int:
        """The KRaft controller listener's port (0 before start)."""
        return self._controller_port

    @property
    def data_dir(self) -> Path | None:
        """The temp directory with server.properties, broker.log and the logs (None if stopped)."""
        return self._data_dir

    @property
    def log_file(self) -> Path | None:
        """The broker's own log (stdout and stderr of the JVM)."""
        return None if self._data_dir is None else self._data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return None if self._process is None else self._process.pid

    @property
    def is_running(self) -> bool:
        """Whether the JVM is alive (an external broker counts as running)."""
        if self._external is not None:
            return True
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the broker's log ("" if there is none)."""
        log_file = self.log_file
        if log_file is None:
            return ""
        try:
            return tail(log_file.read_bytes().decode("utf-8", "replace"), lines)
        except OSError:
            return ""

    # -- life cycle

    def start(self) -> Self:
        """Start the broker and wait until it answers a metadata request."""
        deadline = time.monotonic() + self._startup_timeout
        if self._external is not None:
            _wait_external(self._external, deadline, self._startup_timeout)
            return self
        if self._process is not None:
            raise KafkaBrokerError("the Kafka broker is already started")
        java = require_java()
        libs = self._libs_dir or ensure_kafka_jars()
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise KafkaBrokerError(f"no Kafka jars in {libs}")
        if self._kept_dir is not None:
            self._kept_dir.mkdir(parents=True, exist_ok=True)
            self._data_dir = self._kept_dir
        else:
            self._data_dir = Path(tempfile.mkdtemp(prefix="pystatefun-kafka-"))
        started = time.monotonic()
        try:
            attempts = 1 if self._wanted_port and self._wanted_controller_port else _PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                self._launch(java, libs)
                try:
                    self._wait_ready(deadline)
                except _PortInUseError:
                    if attempt == attempts:
                        raise
                    _log.info("a Kafka port was taken meanwhile; trying other ports")
                    self._kill()
                    continue
                break
        except BaseException:
            self._kill()
            self.stop()
            raise
        _log.info(
            "Kafka broker ready at %s in %.1f s (pid %d, data %s)",
            self.bootstrap_servers,
            time.monotonic() - started,
            self.pid,
            self._data_dir,
        )
        return self

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``stop_timeout``) and remove its data
        (unless it was given a ``data_dir`` to keep)."""
        if self._external is not None:
            return
        if self._finalizer is not None:
            self._finalizer()  # runs _shutdown once
        elif self._data_dir is not None and self._kept_dir is None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        self._finalizer = None
        self._process = None
        self._data_dir = None
        self._port = self._controller_port = 0

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self._external or (f"{HOST}:{self._port}" if self._process else "stopped")
        return f"KafkaBroker({where})"

    # -- internals

    def _launch(self, java: str, libs: Path) -> None:
        data_dir = self._data_dir
        assert data_dir is not None
        if self._finalizer is not None:  # a previous attempt: its JVM is gone by now
            self._finalizer.detach()
            self._finalizer = None
        log_dir = data_dir / "logs"
        formatted = self._kept_dir is not None and (log_dir / "meta.properties").is_file()
        controller_port = self._wanted_controller_port
        if formatted:  # KRaft keeps the controller's address: the same port again
            controller_port = _saved_controller_port(data_dir, controller_port)
        self._port, self._controller_port = _pick_ports(self._wanted_port, controller_port)
        if not formatted:
            shutil.rmtree(log_dir, ignore_errors=True)  # formatted anew for the new ports
        config = data_dir / "server.properties"
        config.write_text(
            _server_properties(self._port, self._controller_port, log_dir, self._properties),
            encoding="utf-8",
        )
        log4j = data_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2_PROPERTIES.format(level=self._log_level), encoding="utf-8")
        classpath = f"{libs}{os.sep}*"  # the JVM expands the wildcard itself
        common = ["-XX:-UsePerfData", f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not formatted:
            _format_storage(java, common, config)
            (data_dir / _CONTROLLER_PORT_FILE).write_text(
                f"{self._controller_port}\n", encoding="utf-8"
            )
        command = [
            java,
            f"-Xmx{self._heap}",
            "-Djava.awt.headless=true",
            *self._jvm_options,
            *common,
            "kafka.Kafka",
            str(config),
        ]
        _log.debug("starting Kafka: %s", command)
        with (data_dir / "broker.log").open("wb") as log_file:
            process = subprocess.Popen(
                command,
                cwd=data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the broker in order
            )
        self._process = process
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            process,
            None if self._kept_dir is not None else data_dir,
            self._stop_timeout,
        )

    def _wait_ready(self, deadline: float) -> None:
        process = self._process
        log_file = self.log_file
        assert process is not None and log_file is not None
        watcher = _LogWatcher(log_file)
        last_error: BaseException | None = None
        while True:
            code = process.poll()
            fatal = watcher.fatal()  # a failed broker can take many seconds to exit: don't wait
            if code is not None or fatal:
                self._kill()
                what = f"exited with code {code}" if code is not None else f"failed ({fatal})"
                error = _PortInUseError if watcher.port_in_use else KafkaBrokerError
                raise error(f"the Kafka broker {what} while starting{self._diagnosis()}")
            try:
                if probe_metadata(HOST, self._port, timeout=5.0) > 0:
                    return
            except (OSError, KafkaBrokerError) as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                self._kill()
                raise KafkaBrokerError(
                    f"the Kafka broker did not answer on {HOST}:{self._port} within "
                    f"{self._startup_timeout:g} s (last error: {last_error}){self._diagnosis()}"
                )
            time.sleep(0.2)

    def _diagnosis(self) -> str:
        """The log's errors and its last lines, for an exception message."""
        try:
            text = (self.log_file or Path()).read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""
        errors = _error_lines(text)
        found = f"\nerrors in {self.log_file}:\n{errors}" if errors else ""
        return f"{found}\nend of {self.log_file}:\n{tail(text)}"

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def _shutdown(process: subprocess.Popen[bytes], data_dir: Path | None, timeout: float) -> None:
    """Stop the JVM and remove its data, if any is to be removed (also run at interpreter exit
    if stop() was not)."""
    if process.poll() is None:
        _log.info("stopping Kafka broker (pid %d)", process.pid)
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _log.warning(
                "Kafka broker (pid %d) ignored SIGTERM for %.0f s; killing it", process.pid, timeout
            )
            process.kill()
            process.wait()
    if data_dir is not None:
        shutil.rmtree(data_dir, ignore_errors=True)


def _wait_external(bootstrap_servers: str, deadline: float, timeout: float) -> None:
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port_text = first.rpartition(":")
    if not host or not port_text.isdigit():
        raise KafkaBrokerError(f"bootstrap servers must be HOST:PORT[,...], not {first!r}")
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if probe_metadata(host.strip("[]"), int(port_text), timeout=5.0) > 0:
                _log.info("using the external Kafka broker at %s", bootstrap_servers)
                return
        except (OSError, KafkaBrokerError) as exc:
            last_error = exc
        time.sleep(0.5)
    raise KafkaBrokerError(
        f"the external Kafka broker {bootstrap_servers} did not answer within {timeout:.0f} s "
        f"(last error: {last_error})"
    )


def _saved_controller_port(data_dir: Path, wanted: int) -> int:
    """The controller port a kept data directory was formatted with (``wanted`` must match)."""
    try:
        saved = int((data_dir / _CONTROLLER_PORT_FILE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError) as exc:
        raise KafkaBrokerError(
            f"{data_dir} holds a formatted broker but no readable {_CONTROLLER_PORT_FILE}: {exc}"
        ) from exc
    if wanted and wanted != saved:
        raise KafkaBrokerError(
            f"{data_dir} was formatted for controller port {saved}, not {wanted}"
        )
    return saved


def _server_properties(
    port: int, controller_port: int, log_dir: Path, overrides: Mapping[str, str]
) -> str:
    properties = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Look for timed-out transactions every second (Kafka's default is 10 s): a clustered
        # worker killed while it commits holds back read_committed readers until then.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # Let workers choose a group session as short as 1 s (Kafka's minimum is 6 s): how
        # soon a dead worker's key groups move, on a broker meant for one machine.
        "group.min.session.timeout.ms": "1000",
        # Small files and few threads: a test broker on a small machine.
        "log.segment.bytes": str(16 * 1024 * 1024),
        "log.index.size.max.bytes": str(1024 * 1024),
        "metadata.log.segment.bytes": str(8 * 1024 * 1024),
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "2",
    }
    properties.update(overrides)
    lines = ["# Written by statefun._kafka_local.broker: a single-node KRaft broker."]
    lines += [f"{key}={value}" for key, value in properties.items()]
    return "\n".join(lines) + "\n"


def _format_storage(java: str, common: Sequence[str], config: Path) -> None:
    cluster_id = _random_cluster_id()
    command = [
        java,
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
        *common,
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(config),
        "--standalone",
    ]
    _log.debug("formatting Kafka storage: %s", command)
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=_FORMAT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaBrokerError(f"formatting Kafka's storage took over {_FORMAT_TIMEOUT} s") from exc
    if done.returncode != 0:
        raise KafkaBrokerError(
            f"formatting Kafka's storage failed ({done.returncode}):\n"
            + tail(done.stdout.decode("utf-8", "replace"))
        )


def _random_cluster_id() -> str:
    """A Kafka Uuid as Kafka prints it: url-safe base64 of 16 bytes, no padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):  # would read as a command-line flag
            return text


def _pick_ports(port: int, controller_port: int) -> tuple[int, int]:
    """The given ports (checked to be free), each 0 replaced by a distinct free port."""
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        for wanted in (port, controller_port):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            if wanted:  # as the broker binds: an earlier broker's TIME_WAIT does not count
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, wanted))
            except OSError as exc:
                raise KafkaBrokerError(f"port {wanted} on {HOST} is not free: {exc}") from exc
            chosen.append(sock.getsockname()[1])
        return chosen[0], chosen[1]


class _LogWatcher:
    """Reads what the broker appended to its log since last time, looking for a fatal error."""

    _FATAL = ("Exiting Kafka due to fatal exception", "Fatal error during")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._carry = ""
        self.port_in_use = False

    def fatal(self) -> str:
        """The first fatal line appended so far, or ""."""
        try:
            with self._path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return ""
        self._offset += len(chunk)
        text = self._carry + chunk.decode("utf-8", "replace")
        lines = text.split("\n")
        self._carry = lines.pop()  # an incomplete last line: read it again next time
        for line in lines:
            if "Address already in use" in line:
                self.port_in_use = True
            if any(marker in line for marker in self._FATAL):
                return line.strip()
        return ""


def _error_lines(text: str, limit: int = 12) -> str:
    """The log's ERROR lines and their causes, each once."""
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if (" ERROR " in line or " FATAL " in line or stripped.startswith("Caused by:")) and (
            stripped not in found
        ):
            found.append(stripped)
            if len(found) >= limit:
                break
    return "\n".join(found)
