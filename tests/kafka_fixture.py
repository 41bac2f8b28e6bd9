"""Session fixture: one real Kafka 4.x broker (KRaft, 127.0.0.1) for the whole test run.

Started by ``statefun._kafka_local.broker`` from Maven Central jars (fetched once and cached),
or, when ``$PYSTATEFUN_KAFKA_BOOTSTRAP`` is set (``HOST:PORT[,...]``), that broker instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from statefun._kafka_local.broker import KafkaBroker

BOOTSTRAP_ENV = "PYSTATEFUN_KAFKA_BOOTSTRAP"

#: The group session timeout of the clustered tests' workers. They wait out a killed or paused
#: worker's session, so a shorter one makes them quicker. Kafka's default minimum
#: (``group.min.session.timeout.ms``) is 6 s; the local broker allows 1 s. An external broker
#: keeps its own minimum, so the tests keep 6 s there.
SESSION_MS = 6000 if os.environ.get(BOOTSTRAP_ENV, "").strip() else 3000
#: The workers' heartbeat interval: a sixth of the session, two missed beats are no expiry.
HEARTBEAT_MS = SESSION_MS // 6
#: The session's broker is thrown away with its data: it gets little time for a clean stop.
_STOP_S = 3.0


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A running broker; use ``kafka_broker.bootstrap_servers``. Topics outlive tests: name
    them uniquely."""
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    broker = KafkaBroker.external(external) if external else KafkaBroker(stop_timeout=_STOP_S)
    with broker:
        yield broker


@pytest.fixture
def bootstrap(kafka_broker: KafkaBroker) -> str:
    """The session broker's ``bootstrap_servers``."""
    return kafka_broker.bootstrap_servers
