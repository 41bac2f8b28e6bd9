"""Outputs of the job: egress sinks, replies to HTTP request-reply calls, dead letters.

* Egress records go to their sink (``write_many``: buffered, never blocking the loop); the job
  flushes the sinks every 50 ms and at shutdown (``flush_sinks``). Records for an egress the
  module lacks go to the dead letters (one error line per egress id).
* A reply (a message to ``_addresses.REPLY_TYPENAME``) completes the waiting request's future,
  at once or - with ``reply_release = on-checkpoint`` - once a checkpoint that saw it
  completes (``seal_replies`` at the cut, ``release_replies`` after).
* Dead letters are appended to the dead-letter file (JSON lines, ``_deadletters.py``), logged
  rate-limited; a request-reply caller waiting for a dead-lettered message hears why at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from statefun._addresses import REPLY_TYPENAME
from statefun._exceptions import ModuleError, UndeliverableError
from statefun._settings import Settings
from statefun.egress.base import Sink
from statefun.runtime._deadletters import DeadLetterFile
from statefun.runtime._envelope import Envelope

__all__ = ["Outputs"]

#: the job's logger: its dead-letter and egress lines read as the job's, as they always did
log = logging.getLogger("statefun.runtime._job")


class Outputs:
    """The sinks (per egress id), the replies awaited, and the dead letters of one job."""

    def __init__(self, settings: Settings, sinks: Iterable[Sink]) -> None:
        self.sinks: dict[str, Sink] = {}
        for sink in sinks:
            if sink.egress_id in self.sinks:
                raise ModuleError(f"two sinks for egress {sink.egress_id!r}")
            self.sinks[sink.egress_id] = sink
        #: request id -> the future its HTTP request-reply call waits on
        self.replies: dict[str, asyncio.Future[Any]] = {}
        self.dead_letters = 0
        #: per egress id (every sink's, from the start), the records written to it
        self._written: dict[str, int] = dict.fromkeys(self.sinks, 0)
        self.dead_letter_file = DeadLetterFile(
            settings.dead_letter_path, settings.dead_letter_max_bytes
        )
        self._missing_egress_logged: set[str] = set()
        #: set: replies are held until a checkpoint completes, and this asks for one
        self._request_checkpoint: Callable[[], None] | None = None
        self._unreleased_replies: list[tuple[str, Any]] = []
        #: set: told of a dead-lettered call whose caller waits elsewhere (a clustered worker
        #: sends the 422 to the worker holding the connection)
        self._undeliverable_call: Callable[[str, str], None] | None = None
        #: caller typename -> told (caller id, envelope, reason) of a dead letter it sent: a
        #: clustered job's idempotency key hears that the message it forwarded is one
        self._dead_letter_callers: dict[str, Callable[[str, Envelope, str], None]] = {}
        self._auto_commit = 0

    # -- egress ---------------------------------------------------------------------------

    def egress(self, egress_id: str, values: list[Any]) -> None:
        """Typed values (in order) for the egress ``egress_id``."""
        sink = self.sinks.get(egress_id)
        if sink is None:
            if egress_id not in self._missing_egress_logged:
                self._missing_egress_logged.add(egress_id)
                log.error(
                    "no egress %r in the module; its records go to the dead letters", egress_id
                )
            record = {"egress": egress_id, "reason": f"unknown egress {egress_id!r}"}
            self.write_dead_letters([(record, value) for value in values])
            return
        self._written[egress_id] += len(values)
        sink.write_many(values)

    @property
    def egress_records(self) -> dict[str, int]:
        """Per egress id, the records written to its sink."""
        return dict(self._written)

    # -- replies --------------------------------------------------------------------------

    def reply(self, envelope: Envelope) -> None:
        """A message to the reply typename: the reply to the request-reply call
        ``envelope.id``, released now or held until the next checkpoint completes."""
        if self._request_checkpoint is not None:
            if not self._unreleased_replies:
                self._request_checkpoint()
            self._unreleased_replies.append((envelope.id, envelope.value))
        else:
            self._release_reply(envelope.id, envelope.value)

    def _release_reply(self, request_id: str, value: Any) -> None:
        future = self.replies.pop(request_id, None)
        if future is None or future.done():
            log.warning("reply for request %s arrived after its caller left", request_id)
            return
        future.set_result(value)

    def seal_replies(self) -> list[tuple[str, Any]]:
        """At a checkpoint's cut: the replies produced since the last cut (released when the
        checkpoint completes). The dead letters written since are made durable here too: once
        the checkpoint completes their messages are not replayed."""
        self.dead_letter_file.sync()
        sealed, self._unreleased_replies = self._unreleased_replies, []
        return sealed

    def every_reply_held(self) -> bool:
        """Whether replies are held and every open call's reply is among them (no other
        reply can join the next checkpoint's group commit)."""
        held = self._unreleased_replies
        return bool(held) and len(held) >= len(self.replies)

    def held_replies(self) -> list[tuple[str, Any]]:
        """The replies produced since the last cut, still held (request id, value); read-only."""
        return list(self._unreleased_replies)

    def release_replies(self, replies: list[tuple[str, Any]]) -> None:
        for request_id, value in replies:
            self._release_reply(request_id, value)

    def hold_replies(self, request_checkpoint: Callable[[], None]) -> None:
        """Hold replies until a checkpoint that saw them completes (``reply_release =
        on-checkpoint``); ``request_checkpoint`` asks for one when the first is held."""
        self._request_checkpoint = request_checkpoint

    def on_undeliverable_call(self, tell: Callable[[str, str], None]) -> None:
        """``tell(request id, reason)`` for a dead-lettered call no caller here waits for."""
        self._undeliverable_call = tell

    def on_dead_letter_from(
        self, caller_typename: str, tell: Callable[[str, Envelope, str], None]
    ) -> None:
        """``tell(caller id, envelope, reason)`` for each dead letter whose caller is of
        ``caller_typename``."""
        self._dead_letter_callers[caller_typename] = tell

    # -- dead letters ---------------------------------------------------------------------

    def dead_letter(self, batch: list[Envelope], reason: str) -> None:
        """Messages that cannot be delivered: to the dead-letter file (one ERROR line each,
        rate limited); a request-reply caller waiting for one hears the reason at once."""
        records = []
        limiter = self.dead_letter_file.limiter
        for envelope in batch:
            if limiter.allow():
                log.error("dead letter to %s/%s: %s", envelope.typename, envelope.id, reason)
            caller = envelope.caller
            record = {
                "target": envelope.typename,
                "id": envelope.id,
                "caller": caller.typename + "/" + caller.id if caller else None,
                "reason": reason,
            }
            records.append((record, envelope.value))
        seqs = self.write_dead_letters(records)
        for envelope, seq in zip(batch, seqs, strict=True):
            caller = envelope.caller
            if caller is not None and caller.typename == REPLY_TYPENAME:
                future = self.replies.pop(caller.id, None)
                if future is not None and not future.done():
                    future.set_exception(UndeliverableError(f"dead letter {seq}: {reason}"))
                elif future is None and self._undeliverable_call is not None:
                    self._undeliverable_call(caller.id, f"dead letter {seq}: {reason}")
            elif caller is not None and self._dead_letter_callers:
                tell = self._dead_letter_callers.get(caller.typename)
                if tell is not None:
                    tell(caller.id, envelope, f"dead letter {seq}: {reason}")

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        """Something other than a message (an ingress record, a state value) that goes to
        the dead letters; ``fields`` say what and why (``reason``). Logged (rate limited)."""
        if self.dead_letter_file.limiter.allow():
            log.error("dead letter: %s", fields.get("reason"))
        self.write_dead_letters([(fields, value)])

    def write_dead_letters(self, records: list[tuple[dict[str, Any], Any]]) -> list[int]:
        """Append records (with their values) to the dead-letter file, in one open."""
        seqs = self.dead_letter_file.append(records)
        self.dead_letters += len(seqs)
        return seqs

    # -- sinks ------------------------------------------------------------------------------

    async def flush_sinks(self, checkpointing: bool) -> None:
        """Flush every sink; without checkpoints (``checkpointing`` false) a transactional
        sink commits what it has."""
        for sink in self.sinks.values():
            if not sink.transactional or checkpointing:
                # A transactional sink may send into its open transaction (Kafka does).
                await sink.flush()
            else:
                # No checkpoints: a transactional sink commits what it has at every flush.
                self._auto_commit += 1
                sink.pre_commit(self._auto_commit)
                await sink.commit(self._auto_commit)

    def unsealed(self) -> bool:
        """Whether an exactly-once egress holds records no cut sealed yet."""
        return any(sink.unsealed() for sink in self.sinks.values())

    def backlog_over(self, limit: int) -> bool:
        """Whether a sink holds more than ``limit`` records."""
        return any(sink.backlog() > limit for sink in self.sinks.values())

    def cancel_replies(self) -> None:
        """At the end of the job: callers still waiting for a reply hear none will come."""
        for future in self.replies.values():
            if not future.done():
                future.cancel()

    async def close(self) -> None:
        """At the end of the job: sinks closed, the dead letters made durable."""
        for sink in self.sinks.values():
            await sink.close()
        self.dead_letter_file.sync()
        self.dead_letter_file.limiter.flush()
