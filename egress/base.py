"""The egress (sink) interface, and how a typed value is shown to people.

A sink receives records from the dispatchers with ``write_many`` (a batch's records for it, in
order; by default ``write`` each; never blocking the event loop) and persists or publishes
them in ``flush``.

Transactional sinks (``transactional = True``: files, Kafka) take part in checkpoints with a
two-phase commit, so readers see every record exactly once:

1. ``pre_commit(checkpoint_id)`` is called at the checkpoint's cut (synchronously, no I/O):
   the records written since the previous cut become transaction ``checkpoint_id``; it
   returns what the checkpoint must store to finish that transaction after a crash.
2. When the checkpoint is complete (its metadata is durable), ``commit(checkpoint_id)`` makes
   the transaction visible.
3. After a restart from checkpoint N, ``recover(state)`` gets the stored state of transaction
   N back and commits it if it was not committed yet (idempotent); records written after the
   cut of N were not checkpointed and will be produced again.

A non-transactional sink (stdout; or a sink in at-least-once mode) writes on ``flush``.
"""

from __future__ import annotations

import abc
import base64
import json
from typing import Any

from statefun.sdk._proto import egress_pb2
from statefun.sdk._types import BUILTIN_TYPES

__all__ = ["EgressRecord", "Sink", "describe_typed_value"]

_KAFKA = "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"
_KINESIS = "type.googleapis.com/io.statefun.sdk.egress.KinesisEgressRecord"


class EgressRecord:
    """One record for an egress: the egress id and the typed value a function sent."""

    __slots__ = ("egress", "value")

    def __init__(self, egress: str, value: Any) -> None:
        self.egress = egress
        self.value = value

    def __repr__(self) -> str:
        return f"EgressRecord({self.egress!r}, {self.value!r})"


def _bytes_for_people(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
    try:
        return json.loads(text)
    except ValueError:
        return text


def describe_typed_value(typed: Any) -> dict[str, Any]:
    """A JSON-able view of a typed value: built-in types and Kafka/Kinesis records decoded."""
    typename = str(typed.typename)
    if not typed.has_value:
        return {"typename": typename, "value": None}
    data = bytes(typed.value)
    builtin = BUILTIN_TYPES.get(typename)
    if builtin is not None:
        value = builtin.serializer().deserialize(data)
        if isinstance(value, float) and value != value:  # NaN is not JSON
            value = str(value)
        return {"typename": typename, "value": value}
    if typename == _KAFKA:
        record = egress_pb2.KafkaProducerRecord.FromString(data)
        return {
            "typename": typename,
            "topic": record.topic,
            "key": record.key,
            "value": _bytes_for_people(record.value_bytes),
        }
    if typename == _KINESIS:
        kinesis = egress_pb2.KinesisEgressRecord.FromString(data)
        return {
            "typename": typename,
            "stream": kinesis.stream,
            "partition_key": kinesis.partition_key,
            "value": _bytes_for_people(kinesis.value_bytes),
        }
    return {"typename": typename, "value": _bytes_for_people(data)}


class Sink(abc.ABC):
    """An egress. ``write`` is synchronous and cheap; ``flush`` makes writes durable."""

    def __init__(self, egress_id: str) -> None:
        self.egress_id = egress_id

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections or files."""

    @abc.abstractmethod
    def write(self, record: EgressRecord) -> None:
        """Accept a record (buffered; must not block the event loop)."""

    def write_many(self, values: list[Any]) -> None:
        """Accept the typed values of some records for this egress, in order (what the
        runtime calls: a remote batch's records come together)."""
        for value in values:
            self.write(EgressRecord(self.egress_id, value))

    async def flush(self) -> None:  # noqa: B027 - optional hook
        """Push buffered records out (every 50 ms; a transactional sink may send them into
        its open transaction, never make them visible)."""

    async def close(self) -> None:
        """Flush and release resources."""
        await self.flush()

    def backlog(self) -> int:
        """Records accepted but not yet out (buffered, or waiting for their commit).

        The job stops its sources while a sink's backlog is past ``max_in_flight_messages``,
        so records waiting for a checkpoint cannot grow without bound.
        """
        return 0

    # -- two-phase commit (transactional sinks) -------------------------------------------

    #: Whether records wait for a checkpoint before they become visible.
    transactional: bool = False
    #: Whether ``recover`` also takes back what was committed after that checkpoint (a file is
    #: cut back to its length at the cut), so that restoring an older checkpoint than the last
    #: one committed (the newest was damaged) keeps every record exactly once.
    rewinds: bool = False

    def unsealed(self) -> int:
        """Records written since the last cut that the next ``pre_commit`` would seal (0 for a
        sink that is not transactional). The job checkpoints early when it goes idle with
        such records, so they need not wait for the next interval."""
        return 0

    def pre_commit(self, checkpoint_id: int) -> Any:
        """Seal the records since the last cut as transaction ``checkpoint_id``; its state."""
        return None

    async def commit(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Make transaction ``checkpoint_id`` visible (its checkpoint is complete)."""

    async def recover(self, state: Any) -> None:  # noqa: B027 - optional hook
        """After a restart: finish the transaction whose state ``pre_commit`` returned."""
