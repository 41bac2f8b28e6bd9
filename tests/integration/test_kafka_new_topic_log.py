"""The first record to a topic the broker creates on demand is a normal event: no ERROR."""

from __future__ import annotations

import logging
import uuid

import pytest

from statefun.egress.kafka import KafkaSink
from tests.integration.test_kafka_io import EGRESS, consume, kafka_record

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


@pytest.mark.parametrize("semantic", ["at-least-once", "exactly-once"])
async def test_first_write_to_an_auto_created_topic_logs_no_error(
    semantic: str, bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"created-on-demand-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(EGRESS, bootstrap, semantic)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="kafka")
    await sink.start()
    try:
        sink.write(kafka_record(topic, "first", key="k"))
        await sink.flush()
        if semantic == "exactly-once":
            sink.pre_commit(1)
            await sink.commit(1)
    finally:
        await sink.close()
    assert [r[1] for r in consume(bootstrap, topic, count=1)] == [b"first"]
    noisy = [r for r in caplog.records if r.name.startswith("kafka") and r.levelno >= logging.ERROR]
    assert noisy == [], [r.getMessage() for r in noisy]


def test_a_topic_still_missing_later_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """Only a topic's first "not found" is taken for one being created; later ones pass."""
    from statefun._kafka import import_kafka

    import_kafka()
    cluster = logging.getLogger("kafka.cluster")
    with caplog.at_level(logging.WARNING, logger="kafka.cluster"):
        for _ in range(3):
            cluster.error("Topic %s not found in cluster metadata", "never-created")
        cluster.error("Topic %s is not authorized for this client", "secret")
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages == [
        (logging.ERROR, "Topic never-created not found in cluster metadata"),
        (logging.ERROR, "Topic never-created not found in cluster metadata"),
        (logging.ERROR, "Topic secret is not authorized for this client"),
    ]
