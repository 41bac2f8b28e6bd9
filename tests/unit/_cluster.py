"""What the clustered-job unit tests share: a small job's configuration (4 partitions of 8
key groups; its broker is never reached) and an int value."""

from __future__ import annotations

from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._config import ClusterConfig
from statefun.sdk._types import TypedValue

FN = "example/counter"


def small_settings(job_id: str = "unit") -> Settings:
    return Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:1",
            "cluster.job_id": job_id,
            "cluster.partitions": "4",
            "max_parallelism": "8",
        },
        environ={},
    )


def small_config(job_id: str = "unit") -> ClusterConfig:
    config = cluster_config(small_settings(job_id))
    assert config is not None
    return config


def int_value(n: int) -> TypedValue:
    """``n`` (0-127) as an ``io.statefun.types/int``."""
    return TypedValue("io.statefun.types/int", bytes([8, n]))
