"""Making a clustered job's internal topics, or checking the ones that exist.

Every worker calls ``ensure_topics`` at start: the first makes the exchange topic, the
compacted changelog topic and the replies topic (as many partitions as
``cluster_partitions``), the others find them made. Topics that exist with another
partition count cannot serve the job (a key group would map onto another partition than
its state's): that is one ``ConfigurationError`` naming the topic, never a silent
repartition. kafka-python's admin client is blocking: call this in a worker thread from the
event loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from statefun._exceptions import ConfigurationError, UnavailableError
from statefun._kafka import import_kafka
from statefun.cluster._config import ClusterConfig

__all__ = ["delete_retention_ms", "ensure_topics", "topic_configs"]

log = logging.getLogger(__name__)

#: the internal topics' configs. The changelog keeps one record per key (the latest state of
#: an address, the latest cut of a key group) for ever; the exchange is read once by the
#: owner of its partition and only needs to outlive a rebalance, a week by default.
_CHANGELOG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
_EXCHANGE = {"cleanup.policy": "delete"}
#: a reply is read within the call's reply timeout or never: an hour is plenty
_REPLIES = {"cleanup.policy": "delete", "retention.ms": "3600000"}
#: how long a topic found without partitions is described again
_METADATA_WAIT_S = 10.0


def topic_configs(config: ClusterConfig) -> dict[str, dict[str, str]]:
    """Topic name -> the configs ``ensure_topics`` makes it with."""
    return {
        config.exchange_topic: dict(_EXCHANGE),
        config.changelog_topic: dict(_CHANGELOG),
        config.replies_topic: dict(_REPLIES),
    }


def ensure_topics(config: ClusterConfig, timeout_ms: int = 30_000) -> list[str]:
    """Make the job's internal topics that do not exist; check those that do. The names of the
    topics this call made."""
    kafka = import_kafka()
    try:
        admin = kafka.KafkaAdminClient(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"pystatefun-{config.worker_id}",
            request_timeout_ms=timeout_ms,
        )
    except kafka.errors.KafkaError as exc:
        raise UnavailableError(
            f"cluster: cannot reach Kafka at {config.bootstrap_servers}: {exc}"
        ) from exc
    try:
        wanted = topic_configs(config)
        existing = set(admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        made: list[str] = []
        for name in missing:
            try:
                admin.create_topics(
                    {
                        name: {
                            "num_partitions": config.partitions,
                            "replication_factor": config.replication_factor,
                            "configs": wanted[name],
                        }
                    },
                    timeout_ms=timeout_ms,
                    wait_for_metadata=True,
                )
                made.append(name)
                log.info("cluster: made topic %s (%d partitions)", name, config.partitions)
            except kafka.errors.TopicAlreadyExistsError:  # another worker made it meanwhile
                pass
        _check_partitions(admin, config, list(wanted))
        _check_compacted(admin, kafka, config.changelog_topic)
        return made
    except kafka.errors.KafkaError as exc:
        raise UnavailableError(
            f"cluster: the job's topics at {config.bootstrap_servers}: {exc}"
        ) from exc
    finally:
        admin.close()


def _check_partitions(admin: Any, config: ClusterConfig, names: list[str]) -> None:
    # A topic another worker has just made may show no partitions for a moment.
    deadline = time.monotonic() + _METADATA_WAIT_S
    topics = admin.describe_topics(names)
    while time.monotonic() < deadline and any(not t.get("partitions") for t in topics):
        time.sleep(0.2)
        topics = admin.describe_topics(names)
    for topic in topics:
        count = len(topic.get("partitions") or ())
        if count != config.partitions:
            raise ConfigurationError(
                f"cluster: topic {topic['name']} has {count} partitions, the job's "
                f"cluster_partitions is {config.partitions}: set it to {count} (a job's "
                "partitions cannot change: its state is spread by them)"
            )


def _check_compacted(admin: Any, kafka: Any, topic: str) -> None:
    resource = kafka.admin.ConfigResource("TOPIC", topic, ["cleanup.policy"])
    found = admin.describe_configs([resource], config_filter="all")
    policy = _config_value(found, topic, "cleanup.policy")
    if policy is not None and "compact" not in policy.split(","):
        raise ConfigurationError(
            f"cluster: topic {topic} has cleanup.policy={policy}; a changelog must be "
            "compacted (cleanup.policy=compact), or old state is deleted"
        )


def delete_retention_ms(config: ClusterConfig, timeout_ms: int = 30_000) -> int | None:
    """How long compaction keeps the changelog's tombstones (its ``delete.retention.ms``, the
    broker's default when the topic does not set it); None when Kafka does not say (blocking:
    a worker thread)."""
    kafka = import_kafka()
    topic = config.changelog_topic
    try:
        admin = kafka.KafkaAdminClient(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"pystatefun-{config.worker_id}",
            request_timeout_ms=timeout_ms,
        )
        try:
            resource = kafka.admin.ConfigResource("TOPIC", topic, ["delete.retention.ms"])
            found = admin.describe_configs([resource], config_filter="all")
        finally:
            admin.close()
        value = _config_value(found, topic, "delete.retention.ms")
        return None if value is None else int(value)
    except (kafka.errors.KafkaError, ValueError) as exc:
        log.warning("cluster: delete.retention.ms of %s unknown: %s", topic, exc)
        return None


def _config_value(found: Any, topic: str, key: str) -> str | None:
    """A config's value in ``describe_configs``'s answer (None: not found)."""
    for resources in (found or {}).values():
        entries = resources.get(topic) if isinstance(resources, dict) else None
        if entries and key in entries:
            entry = entries[key]
            value = entry.get("value") if isinstance(entry, dict) else entry
            return None if value is None else str(value)
    return None
