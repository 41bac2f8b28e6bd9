"""The local Kafka broker, under the name tests and benchmarks have long imported it by.

The code is ``statefun._kafka_local.broker`` (also what ``statefun kafka start`` runs).
"""

from statefun._kafka_local.broker import *  # noqa: F403
from statefun._kafka_local.broker import __all__ as __all__
from statefun._kafka_local.broker import _probe_metadata as _probe_metadata
