"""A test kit for stateful functions: run them in this process, deterministically, with a
virtual clock, and compare what they did as plain Python values.

    from statefun.testing import FunctionHarness

    harness = FunctionHarness(functions)
    outcome = harness.send("shop/cart", "dave", {"op": "add", "item": "apple", "qty": 2},
                           typename="shop/Command")
    harness.run_until_idle()
    harness.advance(timedelta(minutes=30))

``JobHarness("module.yaml", functions=...)`` runs a whole module with the real runtime, on the
same kind of virtual clock, with in-memory stand-ins for its ingresses and egresses, and
``crash_and_restore()`` to test functions under redelivery.

The pytest plugin (installed with the package) adds the ``statefun_harness`` fixture and
readable diffs of outcomes; see docs/guide/testing.md. The names are imported on first use,
so that loading the plugin costs every pytest run next to nothing.
"""

from importlib import import_module
from typing import TYPE_CHECKING

__all__ = [
    "Delayed",
    "EgressRecord",
    "EgressStandIn",
    "FunctionFailedError",
    "FunctionHarness",
    "IngressStandIn",
    "JobHarness",
    "KafkaRecord",
    "KinesisRecord",
    "Outcome",
    "Raw",
    "SdkProcess",
    "Sent",
    "assert_outcome",
    "assert_state",
]

if TYPE_CHECKING:
    from statefun._exceptions import FunctionFailedError
    from statefun.testing._assertions import assert_outcome, assert_state
    from statefun.testing._harness import FunctionHarness
    from statefun.testing._job_harness import JobHarness
    from statefun.testing._outcome import Delayed, EgressRecord, Outcome, Sent
    from statefun.testing._remote import SdkProcess
    from statefun.testing._standins import EgressStandIn, IngressStandIn
    from statefun.testing._values import KafkaRecord, KinesisRecord, Raw

_WHERE = {
    "Delayed": "statefun.testing._outcome",
    "EgressRecord": "statefun.testing._outcome",
    "EgressStandIn": "statefun.testing._standins",
    "FunctionFailedError": "statefun._exceptions",
    "FunctionHarness": "statefun.testing._harness",
    "IngressStandIn": "statefun.testing._standins",
    "JobHarness": "statefun.testing._job_harness",
    "KafkaRecord": "statefun.testing._values",
    "KinesisRecord": "statefun.testing._values",
    "Outcome": "statefun.testing._outcome",
    "Raw": "statefun.testing._values",
    "SdkProcess": "statefun.testing._remote",
    "Sent": "statefun.testing._outcome",
    "assert_outcome": "statefun.testing._assertions",
    "assert_state": "statefun.testing._assertions",
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'statefun.testing' has no attribute {name!r}")
    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
