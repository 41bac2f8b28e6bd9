"""Hypothesis profiles of the fuzz tests (``tests/*/test_fuzz_*.py``).

``ci`` (the default) keeps each fuzz test to a few seconds; ``long`` runs 2,000 examples per
test, the unit of the campaign that ``scripts/fuzz.py`` repeats with new seeds for a given
time (recorded in docs/fuzzing.md).
No example database: a failure prints the example, which becomes a regression test.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}

settings.register_profile("ci", max_examples=150, **_COMMON)
settings.register_profile("long", max_examples=2_000, **_COMMON)
settings.load_profile("ci")
