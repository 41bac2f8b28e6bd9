"""Recovery: put a job back where a checkpoint was cut, falling back past damaged ones.

``restore`` reverses one checkpoint's cut (before the job starts running): after checking
that the checkpoint fits the job (format, ``max_parallelism``) it verifies every file against
the checksum in the metadata (``verify.verify_files``), decodes the cut, then restores state
(keeping the key groups this process owns), registered remote specs, delayed messages
(absolute deadlines: overdue ones fire at once, in deadline order), messages re-sent through
keyBy in their original per-address order (a batch that was in flight is sent again, so a
remote function may see it twice; its state effects apply once), source positions, and
``recover`` of each sink's transaction N. Nothing of the job changes before the state is
restored, and a state restore that fails half-way is undone (``StateBackend.clear``), so a
damaged checkpoint leaves the job as it was.

``restore_latest`` restores the newest retained checkpoint that is intact. A damaged one - a
file missing, truncated or changed (checksum mismatch), metadata or data that do not decode -
is skipped with one log line naming its folder, the file and what is wrong, and the next older
one is tried; the line of the one restored names those skipped. If none is intact, it fails
with one ``CheckpointDamagedError`` listing them (never an empty start: that would lose all
state silently). What the skipped checkpoints covered is done again from the older cut:
sources replay from its positions (the HTTP ingress's WAL keeps what the oldest retained
checkpoint needs), and a file egress is cut back to its length at that cut; a Kafka egress
cannot take back transactions already committed, which is logged (see docs/architecture.md).
A savepoint given by name is restored with ``restore`` alone: damaged, it is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from statefun._exceptions import CheckpointDamagedError, ConfigurationError
from statefun.checkpoint._codec import decode_envelopes, decode_timers
from statefun.checkpoint.storage import (
    CUT_FILE,
    READABLE_FORMATS,
    CheckpointStorage,
    CompletedCheckpoint,
    read_checkpoint,
)
from statefun.checkpoint.verify import relative_reason, verify_files
from statefun.runtime._functions import RemoteFunction, StateSpec

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.egress.base import Sink
    from statefun.runtime._envelope import Envelope
    from statefun.runtime._functions import FunctionRegistry
    from statefun.runtime._timers import TimerService
    from statefun.state.base import StateBackend


class RestorableJob(Protocol):
    """What restoring a checkpoint needs of the job (``runtime/_job.py``'s ``Job``), before
    it runs: its parts to fill, and methods for what the job keeps of the checkpoint."""

    @property
    def settings(self) -> Settings: ...
    @property
    def state(self) -> StateBackend: ...
    @property
    def functions(self) -> FunctionRegistry: ...
    @property
    def timers(self) -> TimerService: ...
    @property
    def sinks(self) -> Mapping[str, Sink]: ...
    def send(self, envelope: Envelope) -> None: ...
    def restored(self, positions: dict[str, Any], sinks: dict[str, Any]) -> None:
        """The sources' positions and the sinks' transactions to resume from, per id."""

    def add_state_types(self, typenames: Iterable[str]) -> None:
        """Function types that hold state (listed in the next checkpoints)."""

    def drop_state_type(self, typename: str) -> None:
        """A function type whose state was dropped."""


__all__ = ["RestorableJob", "restore", "restore_latest"]

log = logging.getLogger(__name__)


def restore(
    job: RestorableJob, checkpoint: CompletedCheckpoint, allow_dropping_state: bool = False
) -> None:
    """Put ``job`` back where ``checkpoint`` was cut (before the job starts running).

    ConfigurationError if the checkpoint does not fit the job; CheckpointDamagedError (the
    job unchanged) if a file of it is missing, changed or does not decode. Sources and sinks
    are restored asynchronously by the job (positions, transactions).
    """
    metadata = checkpoint.metadata
    if metadata.get("format") not in READABLE_FORMATS:
        raise ConfigurationError(
            f"{checkpoint.path}: checkpoint format {metadata.get('format')!r} is not supported"
        )
    settings = job.settings
    if metadata.get("max_parallelism") != settings.max_parallelism:
        raise ConfigurationError(
            f"{checkpoint.path} was written with max_parallelism "
            f"{metadata.get('max_parallelism')}; restore it with the same max_parallelism "
            f"(now {settings.max_parallelism})"
        )
    verify_files(checkpoint)
    timers, messages, sinks = _read_cut(checkpoint.path)
    manifest = metadata.get("state")
    if not isinstance(manifest, dict):
        raise CheckpointDamagedError(str(checkpoint.path / "_metadata"), "lists no state")
    try:
        job.state.restore(checkpoint.path / "state", manifest, None)
    except Exception as exc:
        job.state.clear()
        if isinstance(exc, CheckpointDamagedError):
            raise
        raise CheckpointDamagedError(
            str(checkpoint.path / "state"), f"does not restore: {exc!r}"
        ) from exc
    _check_function_types(job, checkpoint, allow_dropping_state)
    for typename, specs in metadata.get("remote_specs", {}).items():
        function = job.functions.resolve(typename)
        if isinstance(function, RemoteFunction):
            for name, state_typename, mode, ttl_ms in specs:
                function.register(StateSpec(name, state_typename, int(mode), int(ttl_ms)))
    for deadline, sender, token, envelope in timers:
        job.timers.add(deadline, envelope, sender, token)
    for envelope in messages:
        job.send(envelope)
    job.restored(dict(metadata.get("positions", {})), sinks)
    log.info(
        "restored %s %d from %s: %d message(s) in flight, %d delayed message(s)",
        "savepoint" if checkpoint.is_savepoint else "checkpoint",
        checkpoint.id,
        checkpoint.path,
        len(messages),
        len(timers),
    )


def restore_latest(
    job: RestorableJob, storage: CheckpointStorage, allow_dropping_state: bool = False
) -> CompletedCheckpoint | None:
    """Restore the newest intact checkpoint in ``storage`` (None: there is none, start empty).

    Damaged checkpoints are skipped (one log line each) and remembered in
    ``storage.damaged``; CheckpointDamagedError if every one is damaged.
    """
    candidates = storage.candidates()
    if not candidates:
        log.info("no checkpoint in %s: starting empty", storage.root)
        return None
    skipped: list[tuple[Path, str]] = []
    for folder in candidates:
        try:
            checkpoint = read_checkpoint(folder)
            restore(job, checkpoint, allow_dropping_state)
        except CheckpointDamagedError as exc:
            reason = relative_reason(exc, folder)
            storage.damaged.add(folder.name)
            skipped.append((folder, reason))
            log.error(
                "checkpoint %s is damaged and is skipped: %s; trying the next older one",
                folder,
                reason,
            )
            continue
        if skipped:
            _report_fallback(job, checkpoint, skipped)
        return checkpoint
    raise CheckpointDamagedError(
        str(storage.root),
        "no retained checkpoint is intact ("
        + "; ".join(f"{folder.name}: {reason}" for folder, reason in skipped)
        + "): restore a savepoint (--from-savepoint), or move the folder aside to start empty",
    )


def _report_fallback(
    job: RestorableJob, checkpoint: CompletedCheckpoint, skipped: list[tuple[Path, str]]
) -> None:
    names = ", ".join(folder.name for folder, _ in skipped)
    log.warning(
        "restored checkpoint %d (%s) in place of the damaged %s: what was processed after "
        "its cut is processed again from there",
        checkpoint.id,
        checkpoint.path.name,
        names,
    )
    for egress_id, sink in sorted(job.sinks.items()):
        if sink.transactional and not sink.rewinds:
            log.warning(
                "egress %s cannot take back what it committed after checkpoint %d (skipped: "
                "%s): those records are written again, readers may see them twice",
                egress_id,
                checkpoint.id,
                names,
            )


def _read_cut(folder: Path) -> tuple[list[Any], list[Any], Any]:
    """(timers, messages, sink transactions) of a checkpoint's cut file, decoded."""
    path = folder / CUT_FILE
    try:
        cut = msgpack.unpackb(path.read_bytes(), raw=False)
        return decode_timers(cut["timers"]), decode_envelopes(cut["messages"]), cut["sinks"]
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:  # whatever the bytes make msgpack or the decoding raise
        raise CheckpointDamagedError(str(path), f"does not decode: {exc!r}") from exc


def _check_function_types(
    job: RestorableJob, checkpoint: CompletedCheckpoint, allow_dropping: bool
) -> None:
    """State of a function type the module no longer has: an error, or dropped if allowed.

    The checkpoint lists the function types that hold state, so the addresses are read only
    when one of them is gone.
    """
    listed = checkpoint.metadata.get("state_types")
    job.add_state_types(listed or ())
    if listed is not None and all(job.functions.resolve(t) is not None for t in listed):
        return
    state = job.state
    orphans: dict[str, int] = {}
    for key_group in state.key_groups():
        for (typename, id_), _values in state.items(key_group):
            if job.functions.resolve(typename) is None:
                orphans[typename] = orphans.get(typename, 0) + 1
                if allow_dropping:
                    state.put(key_group, (typename, id_), {})
    if orphans and not allow_dropping:
        names = ", ".join(f"{t} ({n} address(es))" for t, n in sorted(orphans.items()))
        raise ConfigurationError(
            f"{checkpoint.path} holds state of function types the module no longer has: "
            f"{names}; allow dropping it with --allow-dropping-state"
        )
    for typename, count in orphans.items():
        job.drop_state_type(typename)
        log.warning("dropped the state of %d address(es) of %s", count, typename)
