"""A clustered job's internal topics on a real broker: made once, checked after."""

from __future__ import annotations

import uuid

import pytest

from statefun._exceptions import ConfigurationError
from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics

kafka = import_kafka()
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


def _config(bootstrap: str, job_id: str, partitions: int) -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": bootstrap,
            "cluster.job_id": job_id,
            "cluster.worker_id": "w0",
            "cluster.partitions": str(partitions),
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    return config


def test_topics_are_made_once_then_checked(bootstrap: str) -> None:
    config = _config(bootstrap, f"topics-{uuid.uuid4().hex[:8]}", 6)
    assert ensure_topics(config) == list(_names(config))
    assert ensure_topics(config) == []  # the next worker finds them
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = {t["name"]: t for t in admin.describe_topics(list(_names(config)))}
        assert {name: len(t["partitions"]) for name, t in described.items()} == {
            config.exchange_topic: 6,
            config.changelog_topic: 6,
            config.replies_topic: 6,
        }
        resource = kafka.admin.ConfigResource("TOPIC", config.changelog_topic, ["cleanup.policy"])
        found = admin.describe_configs([resource], config_filter="all")
        assert found["topic"][config.changelog_topic]["cleanup.policy"]["value"] == "compact"
    finally:
        admin.close()


def test_a_job_with_another_partition_count_is_refused(bootstrap: str) -> None:
    job_id = f"topics-{uuid.uuid4().hex[:8]}"
    ensure_topics(_config(bootstrap, job_id, 4))
    with pytest.raises(ConfigurationError) as caught:
        ensure_topics(_config(bootstrap, job_id, 8))
    assert str(caught.value) == (
        f"cluster: topic pystatefun.{job_id}.exchange has 4 partitions, the job's "
        "cluster_partitions is 8: set it to 4 (a job's partitions cannot change: its state is "
        "spread by them)"
    )


def test_a_changelog_that_is_not_compacted_is_refused(bootstrap: str) -> None:
    config = _config(bootstrap, f"topics-{uuid.uuid4().hex[:8]}", 2)
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {config.changelog_topic: {"num_partitions": 2, "replication_factor": 1}},
            wait_for_metadata=True,
        )
    finally:
        admin.close()
    with pytest.raises(ConfigurationError, match=r"has cleanup.policy=delete; a changelog must"):
        ensure_topics(config)


def _names(config: ClusterConfig) -> tuple[str, str, str]:
    return config.exchange_topic, config.changelog_topic, config.replies_topic
