"""Runtime settings: declared once, typed, with defaults and what each one means.

Every setting can come from the command line (``statefun run --set name=value``) or from an
environment variable ``PYSTATEFUN_<NAME>`` (upper case); the command line wins.

Every value is checked when the settings are made (ports 0-65535, counts and sizes positive,
durations not negative and below ~24 days), and a ``PYSTATEFUN_*`` environment variable that
names no setting is an error (with the closest setting's name), except the variables listed
in ``NON_SETTING_ENVIRONMENT``, which other parts of the project read.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from statefun._exceptions import ConfigurationError

__all__ = ["NON_SETTING_ENVIRONMENT", "Settings"]

RemoteFailurePolicy = Literal["fail", "dead-letter"]

ENV_PREFIX = "PYSTATEFUN_"

#: ``PYSTATEFUN_*`` environment variables that are not settings (read by the test tooling);
#: any other ``PYSTATEFUN_*`` name must be a setting's. Listed in docs/settings.md too.
NON_SETTING_ENVIRONMENT = frozenset(
    {
        "PYSTATEFUN_PEERS_DIR",  # statefun._testing.peers: where peer SDK virtualenvs live
        "PYSTATEFUN_KAFKA_CACHE",  # statefun._testing.kafka_broker: the broker's jars
        "PYSTATEFUN_KAFKA_POM",  # statefun._testing.kafka_broker: the pom listing those jars
        "PYSTATEFUN_KAFKA_BOOTSTRAP",  # tests/kafka_fixture.py: use this broker instead
        "PYSTATEFUN_CRASH_SEED",  # tests/e2e: replay one crash-test run
        "PYSTATEFUN_NO_EXTENSIONS",  # statefun._compiled: the hot loops as Python, not compiled
    }
)


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class Settings:
    """All tunables of one runtime process."""

    parallelism: int = field(default=2, metadata=_doc("number of dispatcher subtasks"))
    max_parallelism: int = field(
        default=128,
        metadata=_doc("number of key groups; the upper bound of parallelism after a rescale"),
    )
    max_in_flight_messages: int = field(
        default=10_000,
        metadata=_doc(
            "messages to embedded functions inside the runtime (inboxes, feedback, batches) "
            "above which ingresses wait (backpressure)"
        ),
    )
    max_in_flight_remote_messages: int = field(
        default=30_000,
        metadata=_doc(
            "messages to remote functions inside the runtime (inboxes, mailboxes, batches "
            "waiting for a connection or in flight) above which ingresses wait; counted apart "
            "so that under a backlog over many keys each address's next batch can grow"
        ),
    )
    max_egress_backlog: int = field(
        default=100_000,
        metadata=_doc(
            "records an egress may hold (buffered, or in transactions its checkpoints have not "
            "committed yet) above which ingresses wait for a commit (backpressure)"
        ),
    )
    dispatcher_slice: int = field(
        default=512,
        metadata=_doc(
            "messages a dispatcher handles before yielding to the loop (at most 5 ms of them)"
        ),
    )
    remote_max_connections: int = field(
        default=256, metadata=_doc("connections in the pooled HTTP client for remote functions")
    )
    remote_retry_initial_backoff_ms: int = field(
        default=50, metadata=_doc("first delay before retrying a failed remote call")
    )
    remote_retry_max_backoff_ms: int = field(
        default=5_000, metadata=_doc("largest delay between retries of a remote call")
    )
    remote_failure_policy: RemoteFailurePolicy = field(
        default="fail",
        metadata=_doc(
            "what happens when a remote call still fails at its call timeout: 'fail' stops the "
            "job with the error (restarted from the last checkpoint where checkpoints are on); "
            "'dead-letter' logs the batch and writes it to the dead-letter file, then goes on"
        ),
    )
    dead_letter_path: str = field(
        default="dead-letters.jsonl",
        metadata=_doc("JSON lines file for messages that could not be delivered"),
    )
    max_response_bytes: int = field(
        default=64 << 20, metadata=_doc("largest response body accepted from a remote function")
    )
    checkpoint_dir: str = field(
        default="",
        metadata=_doc(
            "where checkpoints are written (a path or file:// URL); empty: checkpoints off. "
            "On start the latest complete checkpoint there is restored"
        ),
    )
    checkpoint_interval_ms: int = field(
        default=1_000, metadata=_doc("time between the start of two checkpoints")
    )
    checkpoints_retained: int = field(
        default=3,
        metadata=_doc(
            "complete checkpoints kept; older ones are deleted. A damaged newest checkpoint "
            "is skipped on restore for the next older one, so keep at least 2 (the HTTP "
            "ingress's WAL keeps what the oldest needs)"
        ),
    )
    savepoint_dir: str = field(
        default="",
        metadata=_doc("where savepoints go (default: <checkpoint_dir>/../savepoints)"),
    )
    reply_release: Literal["on-checkpoint", "immediate"] = field(
        default="on-checkpoint",
        metadata=_doc(
            "when the reply of an HTTP request-reply call is sent: 'on-checkpoint' once the "
            "checkpoint covering it is complete (a caller never sees an effect a crash could "
            "undo), 'immediate' at once (lower latency; may be recomputed after a crash). "
            "Without checkpoints replies are always immediate"
        ),
    )
    reply_checkpoint_delay_ms: int = field(
        default=5,
        metadata=_doc(
            "with reply_release=on-checkpoint: a checkpoint starts at most this long after a "
            "reply is held, sooner than checkpoint_interval_ms if need be (group commit: one "
            "checkpoint releases every reply held by then; under load they run back to back)"
        ),
    )
    reply_commit_when_idle: bool = field(
        default=True,
        metadata=_doc(
            "with reply_release=on-checkpoint: when every open call's reply is held and no "
            "message is in flight, the checkpoint starts at once instead of "
            "reply_checkpoint_delay_ms later (a lone caller waits for one checkpoint only); "
            "false: always the group-commit wait"
        ),
    )
    idle_checkpoint_delay_ms: int = field(
        default=50,
        metadata=_doc(
            "when the job has worked off everything in flight while an exactly-once egress "
            "holds records no checkpoint covers yet, a checkpoint starts this long after "
            "(group commit) instead of at the next checkpoint_interval_ms, so output becomes "
            "visible soon after the job catches up; 9x the CPU time the last checkpoint took "
            "passes between its end and such an early one (at most ~10% of a core). 0: off"
        ),
    )
    restart_strategy: Literal["none", "fixed-delay", "exponential", "failure-rate"] = field(
        default="failure-rate",
        metadata=_doc(
            "how `statefun run` restarts a failed job from its last checkpoint: "
            "'failure-rate' (Flink's: restarts until more than "
            "restart_failure_rate_max_failures failures fall within "
            "restart_failure_rate_interval_ms), 'exponential' (at most restart_attempts "
            "restarts in a row), 'fixed-delay' (at most restart_attempts restarts in the "
            "process's life, each after restart_delay_ms), 'none'"
        ),
    )
    restart_attempts: int = field(
        default=10,
        metadata=_doc(
            "restarts before `statefun run` gives up (0: never restart); with 'exponential' "
            "counted in a row (a healthy run starts again from 0), with 'fixed-delay' over the "
            "process's life"
        ),
    )
    restart_delay_ms: int = field(
        default=500, metadata=_doc("delay before the first restart (fixed, or doubling up to 60 s)")
    )
    restart_failure_rate_max_failures: int = field(
        default=5,
        metadata=_doc(
            "restart_strategy=failure-rate: the most failures restarted within "
            "restart_failure_rate_interval_ms; one more ends the process"
        ),
    )
    restart_failure_rate_interval_ms: int = field(
        default=60_000,
        metadata=_doc("restart_strategy=failure-rate: the sliding window failures are counted in"),
    )
    restart_backoff_reset_ms: int = field(
        default=30_000,
        metadata=_doc(
            "a job that ran this long before failing counts as healthy: the restart delay "
            "starts again from restart_delay_ms, and (exponential) the restarts in a row from 0"
        ),
    )
    quarantine_after_failures: int = field(
        default=3,
        metadata=_doc(
            "with remote_failure_policy=fail and checkpoints on: when a message's batch fails "
            "the job the same way for the this-many-th time (across restarts), the message "
            "goes to the dead letters instead and the job goes on; 0: never"
        ),
    )
    dead_letter_max_bytes: int = field(
        default=64 << 20,
        metadata=_doc(
            "once the dead-letter file is larger, it is renamed to <dead_letter_path>.1 "
            "(replacing the previous one) and a new file starts; 0: no limit"
        ),
    )
    state_backend: Literal["memory", "rocksdb"] = field(
        default="memory", metadata=_doc("where keyed state lives: 'memory' or 'rocksdb'")
    )
    state_dir: str = field(
        default=".statefun/state",
        metadata=_doc("working directory of the rocksdb state backend"),
    )
    http_wal_dir: str = field(
        default="",
        metadata=_doc(
            "write-ahead log of the HTTP ingress (default: <checkpoint_dir>/../http-wal); a "
            "message is acknowledged once it is fsynced there"
        ),
    )
    admin_port: int = field(
        default=0,
        metadata=_doc(
            "port of the admin HTTP server on admin_host (status, metrics, savepoints); 0: off"
        ),
    )
    http_idempotency_retention_s: int = field(
        default=86_400,
        metadata=_doc(
            "how long the HTTP ingress remembers an Idempotency-Key (and a /call's reply): a "
            "repeat within this time is answered with the first request's outcome instead of "
            "being processed again"
        ),
    )
    http_idempotency_max_keys: int = field(
        default=1_000_000,
        metadata=_doc(
            "Idempotency-Keys an HTTP ingress remembers at most (about 360 bytes of memory "
            "each for a 36-character key, plus a /call's reply); past it the oldest are "
            "forgotten first (a clustered job: per key group, this over max_parallelism)"
        ),
    )
    http_idempotency_max_reply_bytes: int = field(
        default=256 << 20,
        metadata=_doc(
            "bytes of /call replies an HTTP ingress keeps for repeated Idempotency-Keys; past "
            "it the oldest keys are forgotten first (a clustered job: per key group, this over "
            "max_parallelism)"
        ),
    )
    admin_savepoint_min_interval_ms: int = field(
        default=1_000,
        metadata=_doc(
            "the admin server takes at most one savepoint per this interval (and one at a "
            "time); more requests get 429 with Retry-After"
        ),
    )
    timeline_invocations: int = field(
        default=50,
        metadata=_doc(
            "invocations kept per address for GET /addresses/<ns>/<type>/<id>/timeline on the "
            "admin port, recorded from the address's first lookup on (kept only while "
            "admin_port is set); 0: no timeline is kept"
        ),
    )
    timeline_addresses: int = field(
        default=100,
        metadata=_doc(
            "addresses recorded for the timeline at once (the least recently looked up go)"
        ),
    )
    timeline_entries: int = field(
        default=0,
        metadata=_doc(
            "also keep the job's last this many invocations of every address, so that an "
            "address's first timeline lookup shows its recent past (costs the cheapest "
            "embedded functions 25-35% of their throughput); 0: only looked-up addresses"
        ),
    )
    http_head_timeout_ms: int = field(
        default=10_000,
        metadata=_doc(
            "HTTP servers of the runtime (ingress, admin): a request head must be complete "
            "this long after the connection opened or its first byte came; bytes trickling in "
            "do not extend it (408 and close)"
        ),
    )
    http_body_timeout_ms: int = field(
        default=10_000,
        metadata=_doc(
            "HTTP servers: a request body may take this long plus one second per "
            "http_min_body_rate bytes received (408 and close)"
        ),
    )
    http_min_body_rate: int = field(
        default=1_024,
        metadata=_doc("HTTP servers: the slowest body accepted, in bytes per second"),
    )
    http_keepalive_timeout_ms: int = field(
        default=75_000,
        metadata=_doc("HTTP servers: an idle kept-alive connection is closed after this long"),
    )
    http_max_connections: int = field(
        default=1_024,
        metadata=_doc(
            "HTTP servers: open connections in all; at the cap, the connection that has waited "
            "longest for a request head is closed to make room, or (none waiting) the new one "
            "gets 503 with Retry-After"
        ),
    )
    http_max_connections_per_client: int = field(
        default=512,
        metadata=_doc(
            "HTTP servers: open connections from one client address (as http_max_connections); "
            "raise it behind a proxy, whose connections all come from one address"
        ),
    )
    http_allowed_hosts: str = field(
        default="",
        metadata=_doc(
            "HTTP servers: comma-separated Host names requests may carry (any port; '*': any); "
            "empty: localhost, 127.0.0.1 and [::1] when bound to a loopback address, any name "
            "otherwise. Other names get 421 (DNS rebinding defence). An HTTP ingress's "
            "allowedHosts wins over this"
        ),
    )
    remote_probe_timeout_ms: int = field(
        default=1_000,
        metadata=_doc(
            "at job start, each remote endpoint (each origin of the module's HTTP endpoints) "
            "gets one TCP connect bounded by this; one that cannot be reached is one WARNING "
            "line, and the job starts anyway (0: no probe)"
        ),
    )
    remote_log_interval_ms: int = field(
        default=10_000,
        metadata=_doc(
            "failed attempts of remote calls are logged per endpoint: the first at once, "
            "then at most one line per this interval with the count and the last error"
        ),
    )
    metrics: bool = field(
        default=True,
        metadata=_doc(
            "serve GET /metrics (Prometheus text) on the admin port and time one in 16 embedded "
            "invocations; false: no /metrics, no timing, no event-loop lag probe"
        ),
    )
    admin_host: str = field(
        default="127.0.0.1",
        metadata=_doc(
            "interface the admin server binds; one beyond loopback needs admin_token (or "
            "admin_insecure)"
        ),
    )
    admin_token: str = field(
        default="",
        repr=False,
        metadata=_doc(
            "a bearer token every admin request must carry (Authorization: Bearer <token>; "
            "401 otherwise); the statefun commands that call the admin port send it; never logged"
        ),
    )
    admin_insecure: bool = field(
        default=False,
        metadata=_doc(
            "let the admin server bind beyond loopback without admin_token "
            "(statefun run --insecure-admin)"
        ),
    )
    progress_interval_ms: int = field(
        default=10_000,
        metadata=_doc("statefun run: one progress line to stderr per this interval"),
    )

    cluster_bootstrap_servers: str = field(
        default="",
        metadata=_doc(
            "Kafka bootstrap servers (HOST:PORT[,...]) of a clustered job: its workers share "
            "key groups, state and messages through Kafka (docs/guide/cluster.md); empty: one "
            "process, no Kafka needed"
        ),
    )
    cluster_job_id: str = field(
        default="",
        metadata=_doc("a clustered job's name; every worker of the job sets the same one"),
    )
    cluster_worker_id: str = field(
        default="",
        metadata=_doc(
            "this worker's name, stable across its restarts and unique in the job (it names "
            "its transactional ids); empty: the machine's host name"
        ),
    )
    cluster_partitions: int = field(
        default=0,
        metadata=_doc(
            "partitions of the job's exchange and changelog topics, each holding a contiguous "
            "range of key groups; the most workers that can share the job; 0: max_parallelism"
        ),
    )
    cluster_session_timeout_ms: int = field(
        default=10_000,
        metadata=_doc(
            "how long a silent worker keeps its key groups before the others take them over"
        ),
    )
    cluster_heartbeat_interval_ms: int = field(
        default=3_000,
        metadata=_doc("a worker's heartbeats to the group (at most a third of the session)"),
    )
    cluster_transaction_timeout_ms: int = field(
        default=0,
        metadata=_doc(
            "the broker aborts a worker's open transaction after this long: how long the key "
            "groups of a worker that died for good wait before another reads past its output; "
            "longer than checkpoint_interval_ms; 0: three checkpoint intervals, at least 5 s"
        ),
    )
    cluster_replication_factor: int = field(
        default=1,
        metadata=_doc("replicas of the job's exchange and changelog topics when they are made"),
    )
    cluster_port_offset: int = field(
        default=0,
        metadata=_doc(
            "added to the port of each HTTP ingress this worker serves (a port 0 stays 0); "
            "statefun run --workers N gives worker i the offset i"
        ),
    )
    cluster_http_wait_ms: int = field(
        default=30_000,
        metadata=_doc(
            "how long an HTTP ingress request waits to be handed to the worker's job while the "
            "job's group rebalances (or the job has no room) before a 503 with Retry-After; a "
            "call waits at most its replyTimeout"
        ),
    )

    def __post_init__(self) -> None:
        _check_values(self)
        _check_admin(self)
        if self.parallelism < 1:
            raise ConfigurationError(f"parallelism must be at least 1, got {self.parallelism}")
        if self.max_parallelism < self.parallelism:
            raise ConfigurationError(
                f"max_parallelism ({self.max_parallelism}) must be at least parallelism "
                f"({self.parallelism})"
            )
        if self.max_parallelism > 32768:
            raise ConfigurationError("max_parallelism can be at most 32768")
        if self.max_in_flight_messages < 1:
            raise ConfigurationError("max_in_flight_messages must be at least 1")
        if self.max_in_flight_remote_messages < 1:
            raise ConfigurationError("max_in_flight_remote_messages must be at least 1")
        if self.max_egress_backlog < 1:
            raise ConfigurationError("max_egress_backlog must be at least 1")
        if self.checkpoint_interval_ms < 10:
            raise ConfigurationError("checkpoint_interval_ms must be at least 10")
        if self.reply_checkpoint_delay_ms < 0:
            raise ConfigurationError("reply_checkpoint_delay_ms must be at least 0")
        if self.idle_checkpoint_delay_ms < 0:
            raise ConfigurationError("idle_checkpoint_delay_ms must be at least 0")
        if self.checkpoints_retained < 1:
            raise ConfigurationError("checkpoints_retained must be at least 1")
        for name in (
            "http_idempotency_retention_s",
            "http_idempotency_max_keys",
            "http_idempotency_max_reply_bytes",
            "http_head_timeout_ms",
            "http_body_timeout_ms",
            "http_min_body_rate",
            "http_keepalive_timeout_ms",
            "http_max_connections",
            "http_max_connections_per_client",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.admin_savepoint_min_interval_ms < 0:
            raise ConfigurationError("admin_savepoint_min_interval_ms must be at least 0")
        if self.timeline_invocations < 0:
            raise ConfigurationError("timeline_invocations must be at least 0")
        if self.timeline_addresses < 1:
            raise ConfigurationError(
                f"timeline_addresses must be at least 1, got {self.timeline_addresses}"
            )
        if self.timeline_entries < 0:
            raise ConfigurationError(
                f"timeline_entries must be at least 0, got {self.timeline_entries}"
            )
        for name, allowed in (
            ("reply_release", ("on-checkpoint", "immediate")),
            ("restart_strategy", ("none", "fixed-delay", "exponential", "failure-rate")),
            ("state_backend", ("memory", "rocksdb")),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigurationError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        for name in (
            "restart_failure_rate_max_failures",
            "restart_failure_rate_interval_ms",
            "restart_backoff_reset_ms",
            "quarantine_after_failures",
            "dead_letter_max_bytes",
        ):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.remote_failure_policy not in ("fail", "dead-letter"):
            raise ConfigurationError(
                f"remote_failure_policy must be 'fail' or 'dead-letter', "
                f"got {self.remote_failure_policy!r}"
            )

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any]]:
        """(name, doc, default) of every setting, for the CLI and the docs."""
        return [(f.name, f.metadata.get("doc", ""), f.default) for f in fields(cls)]

    @classmethod
    def load(
        cls, overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Defaults, then ``PYSTATEFUN_*`` environment variables, then ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        known = {f.name: f for f in fields(cls)}
        _check_environment_names(environ, known)
        for name, f in known.items():
            raw = environ.get(f"PYSTATEFUN_{name.upper()}")
            if raw is not None:
                values[name] = _convert(name, f, raw)
        for name, raw in (overrides or {}).items():
            key = name.replace("-", "_").replace(".", "_")  # cluster.job_id: cluster_job_id
            if key not in known:
                raise ConfigurationError(
                    f"unknown setting {name!r}; known settings: {', '.join(sorted(known))}"
                )
            values[key] = _convert(key, known[key], raw)
        return cls(**values)


def _convert(name: str, f: dataclasses.Field[Any], raw: str) -> Any:
    default = f.default
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError(f"setting {name}: expected true or false, got {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"setting {name}: expected an integer, got {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(f"setting {name}: expected a number, got {raw!r}") from None
    return raw


# -- value checks ---------------------------------------------------------------------------

_MAX_MS = 2**31 - 1  # ~24.8 days: every wait stays within what timers and sleeps accept
_MAX_INT = 2**63 - 1

#: settings whose lower bound is not the rule by name (``_bounds``)
_LOWER_BOUNDS: dict[str, int] = {
    "parallelism": 1,
    "max_parallelism": 1,
    "max_in_flight_messages": 1,
    "max_in_flight_remote_messages": 1,
    "max_egress_backlog": 1,
    "dispatcher_slice": 1,
    "remote_max_connections": 1,
    "max_response_bytes": 1,
    "checkpoint_interval_ms": 10,
    "checkpoints_retained": 1,
    "cluster_replication_factor": 1,
    "cluster_session_timeout_ms": 1,
    "cluster_heartbeat_interval_ms": 1,
    "progress_interval_ms": 100,
}

#: text settings that must not be empty (a file or folder that is always used)
_NON_EMPTY = ("dead_letter_path", "state_dir")


def _bounds(name: str) -> tuple[int, int]:
    """The allowed range of an integer setting: by the table, else by its name's suffix."""
    high = _MAX_MS if name.endswith("_ms") else _MAX_INT
    if name in _LOWER_BOUNDS:
        return _LOWER_BOUNDS[name], high
    if name.startswith("max_") or name.endswith(("_bytes", "_size", "_connections")):
        return 1, high
    return 0, high


def _check_values(settings: Settings) -> None:
    """Raise a one-line ConfigurationError naming the first setting out of its range."""
    for f in fields(settings):
        name, value = f.name, getattr(settings, f.name)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            if name.endswith("_port"):
                if not 0 <= value <= 65535:
                    raise ConfigurationError(f"{name} must be a port number 0-65535, got {value}")
                continue
            low, high = _bounds(name)
            if value < low:
                raise ConfigurationError(f"{name} must be at least {low}, got {value}")
            if value > high:
                raise ConfigurationError(f"{name} must be at most {high}, got {value}")
        elif isinstance(value, float):
            if not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be a number of 0 or more, got {value}")
        elif name in _NON_EMPTY and isinstance(value, str) and not value.strip():
            raise ConfigurationError(f"{name} must not be empty")
    if settings.remote_retry_max_backoff_ms < settings.remote_retry_initial_backoff_ms:
        raise ConfigurationError(
            f"remote_retry_max_backoff_ms ({settings.remote_retry_max_backoff_ms}) must be at "
            f"least remote_retry_initial_backoff_ms ({settings.remote_retry_initial_backoff_ms})"
        )


def _check_admin(settings: Settings) -> None:
    """The admin server beyond loopback needs a token, unless told it need not."""
    from statefun._http.defences import is_loopback

    token = settings.admin_token
    if token and not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigurationError("admin_token must be visible ASCII without spaces")
    if (
        settings.admin_port
        and not is_loopback(settings.admin_host)
        and not token
        and not settings.admin_insecure
    ):
        raise ConfigurationError(
            f"admin_host {settings.admin_host} is beyond this machine and admin_token is not "
            "set: set admin_token, or allow it with --insecure-admin (setting admin_insecure)"
        )


def _check_environment_names(
    environ: Mapping[str, str], known: Mapping[str, dataclasses.Field[Any]]
) -> None:
    """A ``PYSTATEFUN_*`` variable must name a setting (or be a known non-setting variable)."""
    names = {ENV_PREFIX + name.upper() for name in known}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable in names:
            continue
        if variable in NON_SETTING_ENVIRONMENT:
            continue
        close = difflib.get_close_matches(variable, sorted(names), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigurationError(
            f"environment variable {variable} matches no setting{hint}; settings are "
            f"{ENV_PREFIX}<NAME> for the names in docs/settings.md"
        )
