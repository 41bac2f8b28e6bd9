"""Durations written the way Apache Flink reads them (``10s``, ``2 min``, ``100ms``, ``1minute``).

The grammar: a non-negative whole number, optional blanks, then an optional unit label,
case-insensitive. A number without a unit means milliseconds; so does a bare YAML integer,
because StateFun reads the integer's text. Fractions (``1.5s``) and negative numbers are
not durations.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = ["DURATION_EXAMPLE", "UNIT_LABELS", "format_duration", "parse_duration"]

DURATION_EXAMPLE = "a duration such as '10s' or '2 min'"

# Unit label -> length in nanoseconds.
_NANOS = 1
_MICROS = 1_000
_MILLIS = 1_000_000
_SECONDS = 1_000_000_000
_MINUTES = 60 * _SECONDS
_HOURS = 60 * _MINUTES
_DAYS = 24 * _HOURS

UNIT_LABELS: dict[str, int] = {
    **dict.fromkeys(("d", "day", "days"), _DAYS),
    **dict.fromkeys(("h", "hour", "hours"), _HOURS),
    **dict.fromkeys(("min", "m", "minute", "minutes"), _MINUTES),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), _SECONDS),
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), _MILLIS),
    **dict.fromkeys(("µs", "micro", "micros", "microsecond", "microseconds"), _MICROS),
    **dict.fromkeys(("ns", "nano", "nanos", "nanosecond", "nanoseconds"), _NANOS),
}

_LONG_MAX = 2**63 - 1


def parse_duration(value: object) -> timedelta:
    """Parse ``value`` (a YAML string or integer) into a timedelta, or raise ValueError.

    Nanosecond precision is cut down to microseconds, the resolution of timedelta.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected {DURATION_EXAMPLE}, got {value!r}")
    text = str(value).strip()
    digits = len(text) - len(text.lstrip("0123456789"))
    number_text, unit = text[:digits], text[digits:].strip().lower()
    if not number_text or (unit and unit not in UNIT_LABELS):
        raise ValueError(f"expected {DURATION_EXAMPLE}, got {value!r}")
    number = int(number_text)
    if number > _LONG_MAX:
        raise ValueError(f"duration {value!r} is too large")
    nanos = number * UNIT_LABELS[unit or "ms"]
    try:
        return timedelta(microseconds=nanos // 1_000)
    except OverflowError:
        raise ValueError(f"duration {value!r} is too large") from None


def format_duration(duration: timedelta) -> str:
    """The shortest exact spelling of ``duration`` in the grammar above (``90s``, ``2min``)."""
    micros = duration // timedelta(microseconds=1)
    for label, nanos in (("d", _DAYS), ("h", _HOURS), ("min", _MINUTES), ("s", _SECONDS)):
        if micros and micros * 1_000 % nanos == 0:
            return f"{micros * 1_000 // nanos}{label}"
    if micros % 1_000 == 0:
        return f"{micros // 1_000}ms"
    return f"{micros}µs"
