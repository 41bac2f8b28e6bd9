"""What a clustered job can run yet: anything else is refused at start with one line.

A feature is refused rather than run half-right: a clustered job that silently lost exactly-once
or read a file on one machine only would be worse than one that does not start. Each entry says
what is refused and why, in the words the error line uses.
"""

from __future__ import annotations

import importlib.util

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings
from statefun.module._specs import (
    FileEgressSpec,
    FileIngressSpec,
    HttpIngressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    ModuleSpec,
)

__all__ = ["check_clusterable", "unsupported"]


def unsupported(module: ModuleSpec, settings: Settings, bootstrap: str = "") -> list[str]:
    """One line per part of ``module`` and ``settings`` a clustered job cannot run yet
    (``bootstrap``: the job's Kafka cluster, which its Kafka egresses must write to)."""
    found: list[str] = []
    for ingress in module.ingresses:
        where = f" ({ingress.source})" if ingress.source else ""
        if isinstance(ingress, KafkaIngressSpec):
            if bootstrap and ingress.address != bootstrap:
                found.append(
                    f"ingress {ingress.id}{where}: its address {ingress.address} is not the "
                    f"job's Kafka cluster ({bootstrap}); a clustered job's input offsets commit "
                    "in the worker's transaction, so they must be on the same cluster"
                )
            if ingress.startup_position not in ("earliest", "latest"):
                found.append(
                    f"ingress {ingress.id}{where}: startupPosition {ingress.startup_position} "
                    "cannot be used clustered yet (earliest or latest: where an input partition "
                    "no worker has read starts)"
                )
        elif isinstance(ingress, FileIngressSpec):
            found.append(
                f"ingress {ingress.id}{where}: a file ingress cannot run clustered (the file is "
                "on one machine); feed a clustered job through Kafka"
            )
    for egress in module.egresses:
        where = f" ({egress.source})" if egress.source else ""
        if isinstance(egress, KafkaEgressSpec) and bootstrap and egress.address != bootstrap:
            found.append(
                f"egress {egress.id}{where}: its address {egress.address} is not the job's "
                f"Kafka cluster ({bootstrap}); a clustered job's egress records commit in the "
                "worker's transaction, so they must go to the same cluster"
            )
        if isinstance(egress, FileEgressSpec):
            found.append(
                f"egress {egress.id}{where}: a file egress cannot run clustered (each worker "
                "would write its own file); use a Kafka egress"
            )
    has_http = any(isinstance(ingress, HttpIngressSpec) for ingress in module.ingresses)
    if has_http and settings.reply_release != "on-checkpoint":
        found.append(
            f"reply_release={settings.reply_release}: a clustered job releases an HTTP call's "
            "reply once the checkpoint that produced it committed (on-checkpoint) only"
        )
    if settings.state_backend == "rocksdb" and importlib.util.find_spec("rocksdict") is None:
        found.append(
            "state_backend=rocksdb needs rocksdict, which is not installed: "
            "pip install 'pystatefun[rocksdb]'"
        )
    return found


def check_clusterable(
    module: ModuleSpec, settings: Settings, from_savepoint: bool, bootstrap: str = ""
) -> None:
    """Raise a one-line ConfigurationError for the first thing a clustered job cannot run
    (``from_savepoint``: accepted, a savepoint seeds the job's changelog: ``_savepoints.py``)."""
    found = unsupported(module, settings, bootstrap)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigurationError(f"cluster: {found[0]}{more}")
