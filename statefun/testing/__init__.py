"""A test kit for stateful functions: run them in this process, deterministically, with a
virtual clock, and compare what they did as plain Python values.

    from statefun.testing import FunctionHarness

    harness = FunctionHarness(functions)
    outcome = harness.send("shop/cart", "dave", {"op": "add", "item": "apple", "qty": 2},
                           typename="shop/Command")
    harness.run_until_idle()
    harness.advance(timedelta(minutes=30))

The pytest plugin (installed with the package) adds the ``statefun_harness`` fixture and
readable diffs of outcomes and state; see docs/guide/testing.md.
"""

from statefun._exceptions import FunctionFailedError
from statefun.testing._assertions import assert_outcome, assert_state
from statefun.testing._harness import FunctionHarness
from statefun.testing._outcome import Delayed, EgressRecord, Outcome, Sent
from statefun.testing._remote import SdkProcess
from statefun.testing._values import KafkaRecord, KinesisRecord, Raw

__all__ = [
    "Delayed",
    "EgressRecord",
    "FunctionFailedError",
    "FunctionHarness",
    "KafkaRecord",
    "KinesisRecord",
    "Outcome",
    "Raw",
    "SdkProcess",
    "Sent",
    "assert_outcome",
    "assert_state",
]
