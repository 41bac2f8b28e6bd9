"""The local Kafka broker, under the name tests and benchmarks have long imported it by.

The code is ``statefun._kafka_local.broker`` (also what ``statefun kafka start`` runs).
"""

from statefun._kafka_local._probe import probe_metadata as probe_metadata
from statefun._kafka_local.broker import *  # noqa: F403
from statefun._kafka_local.broker import __all__ as __all__
