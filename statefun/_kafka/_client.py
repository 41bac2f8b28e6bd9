"""kafka-python, imported on first use and made quieter; whether its private parts that the
fast paths use are there (``internals_unsupported``).

The Kafka fast paths (the ingress's batch reader, ``ingress/_kafka_fetch.py``; the egress's
bulk appends, ``egress/_kafka_append.py``) are written against private parts of kafka-python
3.0.x. Each checks them here when its client is made and falls back to kafka-python's
public API otherwise (slower, the same records), logging why once.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["import_kafka", "internals_unsupported"]

log = logging.getLogger(__name__)


def import_kafka() -> Any:
    """The ``kafka`` package (imported on first use: it takes ~0.1 s and most jobs need none)."""
    with warnings.catch_warnings():
        # kafka-python 3.0 reads its protocol schemas with importlib.resources.read_text/open_text
        warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
        import kafka
        import kafka.errors
        import kafka.structs
    global _QUIETED
    if not _QUIETED:
        _QUIETED = True
        cluster = logging.getLogger("kafka.cluster")
        cluster.addFilter(_drop_cancelled_refresh)
        logging.getLogger("kafka.net.transport").addFilter(_closed_socket_in_one_line)
        cluster.addFilter(_NewTopicFilter())
        library = logging.getLogger("kafka")
        if library.level == logging.NOTSET:  # its INFO lines (every connection) drown ours
            library.setLevel(logging.WARNING)
    return kafka


_QUIETED = False


def internals_unsupported(
    feature: str, checks: Iterable[tuple[str, Any, Iterable[str]]]
) -> str | None:
    """None if ``feature``, written against private parts of kafka-python 3.0.x, can use them:
    the version is 3.0.x and each (label, object, attribute names) of ``checks`` has those
    attributes; else why not (the egress's bulk appends and the ingress's batch reader)."""
    kafka = import_kafka()
    version = getattr(kafka, "__version__", "?")
    if not version.startswith("3.0."):
        return f"kafka-python {version} ({feature} is written for 3.0)"
    missing = [
        f"{label}{name}"
        for label, owner, names in checks
        for name in names
        if not hasattr(owner, name)
    ]
    if missing:
        return f"kafka-python has no {', '.join(missing)}"
    return None


def _drop_cancelled_refresh(record: logging.LogRecord) -> bool:
    """kafka-python logs an ERROR when a client closes during a metadata refresh: noise."""
    args = record.args
    return not (
        record.msg == "Metadata refresh: failed %s"
        and isinstance(args, tuple)
        and bool(args)
        and type(args[0]).__name__ == "Cancelled"
    )


def _closed_socket_in_one_line(record: logging.LogRecord) -> bool:
    """kafka-python logs a traceback when its network thread reads a socket that another
    thread closed in the meantime (a client closing during a rebalance): it then closes the
    connection and goes on. That one is logged as one line, the error named."""
    exc = record.exc_info[1] if record.exc_info else None
    if (
        isinstance(exc, AttributeError)
        and "'NoneType' object" in str(exc)
        and str(record.msg).startswith("%s: Error receiving network data")
    ):
        record.msg = f"{record.msg} (its socket was closed meanwhile: {exc})"
        record.exc_info = record.exc_text = None
    return True


class _NewTopicFilter(logging.Filter):
    """kafka-python logs an ERROR the first time it asks for a topic the broker does not know
    yet, also when the broker then creates it (``auto.create.topics.enable``): the first
    write to a new topic is a normal event. The first such line per topic is logged at DEBUG
    instead; a topic still missing at the next metadata refresh is an ERROR as before."""

    _MESSAGE = "Topic %s not found in cluster metadata"
    _LIMIT = 10_000  # topics remembered; past that, every line passes

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self._MESSAGE or not isinstance(record.args, tuple) or not record.args:
            return True
        topic = str(record.args[0])
        if topic in self._seen or len(self._seen) >= self._LIMIT:
            return True
        self._seen.add(topic)
        log.debug("topic %s is not in the cluster's metadata yet (the broker may create it)", topic)
        return False
