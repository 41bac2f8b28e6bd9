"""A clustered job's identity in Kafka: its topics, its group, its transactional ids, and how
key groups map onto the partitions of its internal topics.

A job runs clustered when ``cluster_bootstrap_servers`` is set. Every worker of the job (same
``cluster_job_id``) derives the same names from the job id, so the workers find each other
through Kafka alone:

* ``pystatefun.<job>.exchange``: the keyBy shuffle between workers. A message for a key group
  that another worker owns is produced here, to the key group's partition.
* ``pystatefun.<job>.changelog``: compacted; per partition, the durable state of its key groups
  (one record per address) and the checkpoint's cut of those key groups (messages in flight,
  pending delayed messages).
* ``pystatefun.<job>.replies``: replies of HTTP request-reply calls, to the worker holding the
  caller's connection (``_replies.py``).
* consumer group ``pystatefun.<job>``: membership; its assignment of the exchange's partitions
  says which worker owns which key groups.
* transactional ids ``pystatefun.<job>.<worker id>-<slot>``: stable per worker, so a restarted
  worker fences its previous incarnation and aborts the transaction it left open.

Key groups map onto partitions in contiguous ranges, as key groups onto dispatcher subtasks:
``partition = key_group * partitions // max_parallelism``. With ``cluster_partitions`` equal to
``max_parallelism`` (the default) a partition is a key group.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings

__all__ = ["ClusterConfig", "cluster_config", "transaction_timeout_ms"]

#: Kafka's legal topic characters; a job id becomes part of topic and group names
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
#: Kafka topic names are at most 249 characters; ".changelog" and the prefix take 21
_MAX_JOB_ID = 200
PREFIX = "pystatefun"


@dataclass(frozen=True)
class ClusterConfig:
    """The clustered job's settings and the names derived from them."""

    bootstrap_servers: str
    job_id: str
    worker_id: str
    partitions: int
    max_parallelism: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    transaction_timeout_ms: int
    replication_factor: int

    @property
    def exchange_topic(self) -> str:
        return f"{PREFIX}.{self.job_id}.exchange"

    @property
    def changelog_topic(self) -> str:
        return f"{PREFIX}.{self.job_id}.changelog"

    @property
    def replies_topic(self) -> str:
        """Replies of HTTP request-reply calls to the worker holding the caller's connection."""
        return f"{PREFIX}.{self.job_id}.replies"

    @property
    def group_id(self) -> str:
        return f"{PREFIX}.{self.job_id}"

    @property
    def transactional_base(self) -> str:
        """The worker's transactional ids are this with ``-0`` and ``-1`` (two producers,
        as the Kafka egress's, ``egress/kafka.py``)."""
        return f"{PREFIX}.{self.job_id}.{self.worker_id}"

    def partition_of(self, key_group: int) -> int:
        """The internal topics' partition that holds ``key_group``."""
        return key_group * self.partitions // self.max_parallelism

    def key_groups_of(self, partition: int) -> range:
        """The key groups partition ``partition`` holds (contiguous; inverse of
        ``partition_of``)."""
        p, max_p = self.partitions, self.max_parallelism
        return range(-(-partition * max_p // p), -(-(partition + 1) * max_p // p))


#: the shortest transaction timeout chosen for ``cluster_transaction_timeout_ms`` 0: a commit
#: that a loaded machine slows down must not be aborted (the worker would fail and restart)
_MIN_AUTO_TRANSACTION_TIMEOUT_MS = 5_000


def transaction_timeout_ms(settings: Settings) -> int:
    """A worker's transaction timeout: ``cluster_transaction_timeout_ms``, or for 0 three
    checkpoint intervals and at least 5 s. A worker produces its records at the cut, so its
    transaction is open only while a checkpoint commits; the timeout is how long a worker
    killed then holds back the readers of what it wrote, unless it restarts sooner."""
    chosen = settings.cluster_transaction_timeout_ms
    if chosen:
        return chosen
    return max(3 * settings.checkpoint_interval_ms, _MIN_AUTO_TRANSACTION_TIMEOUT_MS)


def cluster_config(settings: Settings, worker_id: str | None = None) -> ClusterConfig | None:
    """The cluster configuration ``settings`` ask for; None when the job runs in one process
    (``cluster_bootstrap_servers`` empty). Raises a one-line ConfigurationError naming the
    setting that is wrong."""
    servers = settings.cluster_bootstrap_servers.strip()
    if not servers:
        return None
    job_id = settings.cluster_job_id.strip()
    if not job_id:
        raise ConfigurationError(
            "cluster_job_id must be set when cluster_bootstrap_servers is (every worker of one "
            "job uses the same id)"
        )
    if not _LEGAL.fullmatch(job_id) or len(job_id) > _MAX_JOB_ID:
        raise ConfigurationError(
            f"cluster_job_id {job_id!r} must be 1-{_MAX_JOB_ID} characters of A-Z a-z 0-9 . _ - "
            "(it names Kafka topics)"
        )
    worker = (worker_id if worker_id is not None else settings.cluster_worker_id).strip()
    if not worker:  # the machine's name: stable across restarts of the one worker it runs
        worker = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "worker"
    if not worker or not _LEGAL.fullmatch(worker):
        raise ConfigurationError(
            f"cluster_worker_id {worker!r} must be 1 or more characters of A-Z a-z 0-9 . _ - "
            "(it names the worker's transactional ids)"
        )
    partitions = settings.cluster_partitions or settings.max_parallelism
    if partitions > settings.max_parallelism:
        raise ConfigurationError(
            f"cluster_partitions ({partitions}) must be at most max_parallelism "
            f"({settings.max_parallelism}): a partition holds one key group or more"
        )
    if settings.cluster_heartbeat_interval_ms * 3 > settings.cluster_session_timeout_ms:
        raise ConfigurationError(
            f"cluster_heartbeat_interval_ms ({settings.cluster_heartbeat_interval_ms}) must be "
            f"at most a third of cluster_session_timeout_ms "
            f"({settings.cluster_session_timeout_ms})"
        )
    transaction_timeout = transaction_timeout_ms(settings)
    if transaction_timeout <= settings.checkpoint_interval_ms:
        raise ConfigurationError(
            f"cluster_transaction_timeout_ms ({transaction_timeout}) must be longer than "
            f"checkpoint_interval_ms ({settings.checkpoint_interval_ms}): a worker's "
            "transaction would be aborted before its checkpoint commits"
        )
    return ClusterConfig(
        bootstrap_servers=servers,
        job_id=job_id,
        worker_id=worker,
        partitions=partitions,
        max_parallelism=settings.max_parallelism,
        session_timeout_ms=settings.cluster_session_timeout_ms,
        heartbeat_interval_ms=settings.cluster_heartbeat_interval_ms,
        transaction_timeout_ms=transaction_timeout,
        replication_factor=settings.cluster_replication_factor,
    )
