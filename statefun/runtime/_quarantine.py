"""Quarantine: a message that keeps failing the job the same way goes to the dead letters.

Under ``remote_failure_policy=fail`` a batch that fails for good stops the job, and the
restart replays it (from the checkpoint, the write-ahead log or Kafka): a message that always
fails would stop the job forever. So each such failure is remembered in a small journal next
to the checkpoints (``<checkpoint_dir>/quarantine.json``, written atomically before the job
stops):

* a failure's **signature** is the function type, the error class and its message with the
  numbers taken out (attempt counts, timings, ports differ from one run to the next);
* a message's **fingerprint** is a hash of its target address, caller, value typename and
  value bytes: the same message replayed after a restart has the same one, whatever batch it
  travels in;
* a new failure with the signature of a remembered one whose messages overlap counts as the
  same failure again, and narrows the suspects to the messages in both batches (batches are
  cut differently after a restart; the message behind the failure is in each of them).

When a failure is the ``quarantine_after_failures``-th of its kind, it no longer stops the
job. A single suspect in the failing batch goes to the dead letters, and the batch's other
messages are put back at the head of the address's mailbox (in order) to be sent again
without it. Several suspects (a batch cut the same way each time) are all put back, and each
suspect is then sent in a batch of its own (``Job.isolated``): the one that fails again fails
alone, and goes to the dead letters. Nothing else changes: a failed batch applied nothing,
so the dead-lettered messages leave no effect and the others take effect once, as if the
suspects had never been sent (exactly-once holds). Two identical messages (same address,
caller and bytes) cannot be told apart: each of them that fails the same way is quarantined.

A quarantined message stays in the journal (with at most ``MAX_SUSPECTS`` failures, the
oldest forgotten first): should the process crash before a checkpoint covers the quarantine,
the replayed message fails the same way and is quarantined at once, without stopping the job
again (its dead letter is then written twice, as any dead letter written after the last
checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statefun._files import write_atomically
from statefun.runtime._envelope import Envelope

__all__ = ["Quarantine", "fingerprint", "signature"]

log = logging.getLogger(__name__)

#: failures remembered at once (the oldest is forgotten first)
MAX_SUSPECTS = 16
_NUMBERS = re.compile(r"\d+")


def fingerprint(envelope: Envelope) -> str:
    """A hash of what makes a message itself: target, caller, value typename and bytes."""
    value = envelope.value
    raw = value.value if value.has_value else b""
    caller = envelope.caller
    digest = hashlib.blake2b(digest_size=16)
    for part in (
        envelope.typename,
        envelope.id,
        "" if caller is None else f"{caller.typename}/{caller.id}",
        str(value.typename),
    ):
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(4, "big"))
        digest.update(encoded)
    digest.update(bytes(raw or b""))
    return digest.hexdigest()


def signature(typename: str, error: BaseException) -> str:
    """How a batch failed, comparable across restarts."""
    text = _NUMBERS.sub("#", str(error))[:500]
    return f"{typename}: {type(error).__name__}: {text}"


class Quarantine:
    """The failure journal of one job (``path`` None: off, every failure stops the job)."""

    def __init__(self, path: Path | None, after: int) -> None:
        self.path = path
        self.after = after
        #: [{"signature": str, "failures": int, "messages": {fingerprint: count}}], oldest first
        self.suspects: list[dict[str, Any]] = []
        if path is not None and after > 0:
            self._load()

    @property
    def enabled(self) -> bool:
        return self.path is not None and self.after > 0

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_bytes())
            suspects = data["suspects"]
            for suspect in suspects:
                if not (
                    isinstance(suspect["signature"], str)
                    and isinstance(suspect["failures"], int)
                    and isinstance(suspect["messages"], dict)
                ):
                    raise ValueError("a suspect without signature, failures and messages")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the unreadable failure journal %s: %s", self.path, exc)
            return
        self.suspects = suspects[-MAX_SUSPECTS:]

    def _save(self) -> None:
        assert self.path is not None
        data = json.dumps({"suspects": self.suspects}, indent=1).encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, data)
        except OSError as exc:
            log.error("cannot write the failure journal %s: %s", self.path, exc)

    def failed(self, batch: Sequence[Envelope], how: str) -> list[Envelope]:
        """A batch failed with signature ``how`` and will stop the job unless quarantined:
        the messages of ``batch`` to quarantine now (empty: let the job stop; the failure is
        recorded durably first)."""
        if not self.enabled:
            return []
        prints = [fingerprint(envelope) for envelope in batch]
        counts = Counter(prints)
        match = None
        for suspect in self.suspects:
            if suspect["signature"] == how and any(p in suspect["messages"] for p in counts):
                match = suspect
                break
        if match is None:
            match = {"signature": how, "failures": 0, "messages": dict(counts)}
            self.suspects.append(match)
            del self.suspects[:-MAX_SUSPECTS]
        else:
            self.suspects.remove(match)
            self.suspects.append(match)
            match["messages"] = {
                p: min(n, counts[p]) for p, n in match["messages"].items() if p in counts
            }
        match["failures"] = min(self.after, match["failures"] + 1)
        if match["failures"] < self.after:
            self._save()
            return []
        suspected = match["messages"]
        chosen = [e for e, p in zip(batch, prints, strict=True) if p in suspected]
        if len(chosen) == 1:
            # Found. Kept: should a crash come before a checkpoint covers the quarantine, the
            # message is replayed, fails the same way, and is quarantined again at once.
            match["messages"] = {prints[batch.index(chosen[0])]: 1}
        self._save()
        return chosen
