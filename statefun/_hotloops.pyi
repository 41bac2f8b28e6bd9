from collections.abc import Callable
from typing import Any

def kafka_run(
    batch: list[Any],
    start: int,
    key_of: Callable[[Any], Any],
    value_of: Callable[[Any], Any],
    partition_of: Callable[[Any], Any],
    topic_of: Callable[[Any], Any],
    value_type: str,
    validate: Callable[[bytes], Any] | None,
    typed_cls: type,
    caught: tuple[type[BaseException], ...],
) -> list[tuple[str, Any]]: ...
def mailbox_run(
    append: Callable[[Any], Any],
    messages: list[Any],
    start: int,
    stop: int,
    id: str,
    typename: str,
    envelope_cls: type,
    encoding: tuple[str, list[bytes], int, Callable[[Any], bytes]],
    size: int,
    limit: int,
) -> tuple[int, int]: ...
def kafka_rows(
    values: list[Any], typename: str
) -> list[tuple[str, str | None, bytes, None]] | None: ...
def egress_groups(reply: bytes, typed_cls: type) -> dict[str, list[Any]] | None: ...
def invocation_wires(batch: list[Any], encode: Callable[[Any], bytes]) -> list[bytes]: ...
def produce_rows(
    produce: Callable[..., Any],
    rows: list[Any],
    start: int,
    refused: tuple[type[BaseException], ...],
) -> tuple[int, BaseException | None]: ...
