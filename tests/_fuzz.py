"""Hypothesis profiles of the fuzz tests (``tests/*/test_fuzz_*.py``).

``ci`` (the default) keeps each fuzz test to a few seconds; ``long`` is the campaign recorded
in docs/fuzzing.md: ``pytest --hypothesis-profile=long tests/unit/test_fuzz_*.py ...``.
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
settings.register_profile("long", max_examples=1_000_000, **_COMMON)
settings.load_profile("ci")
