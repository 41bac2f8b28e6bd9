"""Scale-out on Kafka: one job on many worker processes and machines.

Kafka is the engine: the consumer group ``pystatefun.<job>`` assigns key groups (as the
partitions of the job's exchange topic) to workers, the exchange topic carries messages
between workers, transactions make each worker's checkpoint atomic with what it sent and
consumed, and a compacted changelog topic holds the state. See docs/architecture.md ("Scale
out on Kafka") and docs/guide/cluster.md.

This package is imported only by a clustered job: the single-process runtime never imports it.
"""

from statefun.cluster._config import ClusterConfig, cluster_config
from statefun.cluster._support import check_clusterable, unsupported
from statefun.cluster._topics import ensure_topics, topic_configs

__all__ = [
    "ClusterConfig",
    "check_clusterable",
    "cluster_config",
    "ensure_topics",
    "topic_configs",
    "unsupported",
]
