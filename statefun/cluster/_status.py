"""``statefun status``: which worker owns which key groups and input partitions, from Kafka.

The answer comes from the job's consumer group (kafka-python's admin client describes its
members and their assignments), so it needs no worker to answer and works from any machine
that reaches the Kafka cluster. A worker's member is named by its client id,
``pystatefun-<worker id>``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from statefun._exceptions import ConfigurationError
from statefun.cluster._config import ClusterConfig
from statefun.cluster._kafka_admin import open_admin

__all__ = ["Ownership", "add_status_arguments", "describe", "group_ownership", "status"]

_CLIENT_PREFIX = "pystatefun-"


@dataclass
class Ownership:
    """One member of the job's group and what it was assigned."""

    worker: str
    host: str
    partitions: list[int] = field(default_factory=list)
    inputs: list[tuple[str, int]] = field(default_factory=list)
    #: the worker's admin server (``http://host:port``), if it serves one
    admin_url: str = ""


def group_ownership(config: ClusterConfig) -> tuple[str, list[Ownership]]:
    """The group's state and each member's assignment (blocking)."""
    admin = open_admin(config, "pystatefun-status")
    try:
        described = admin.describe_groups([config.group_id]).get(config.group_id) or {}
    finally:
        admin.close()
    owners: list[Ownership] = []
    for member in described.get("members") or []:
        client = str(member.get("client_id") or "")
        worker = (
            client.removeprefix(_CLIENT_PREFIX) if client.startswith(_CLIENT_PREFIX) else client
        )
        owner = Ownership(worker, str(member.get("client_host") or ""))
        owner.admin_url = _admin_url(member.get("member_metadata"))
        for topic, partitions in _assigned(member.get("member_assignment")):
            if topic == config.exchange_topic:
                owner.partitions.extend(sorted(partitions))
            else:
                owner.inputs.extend((topic, p) for p in sorted(partitions))
        owners.append(owner)
    owners.sort(key=lambda o: o.worker)
    return str(described.get("group_state") or "unknown"), owners


def _admin_url(subscription: Any) -> str:
    """The admin URL a worker published in its subscription's user data, else ""."""
    data = (
        subscription.get("user_data")
        if isinstance(subscription, dict)
        else getattr(subscription, "user_data", None)
    )
    if not isinstance(data, (bytes, str)) or not data:  # (the admin client makes it a str)
        return ""
    try:
        url = json.loads(data).get("admin_url")
    except (ValueError, AttributeError):
        return ""
    return url if isinstance(url, str) and url.startswith("http") else ""


def _assigned(assignment: Any) -> list[tuple[str, list[int]]]:
    """(topic, partitions) of a member's decoded assignment."""
    if not assignment:
        return []
    entries = (
        assignment.get("assigned_partitions") or assignment.get("partitions") or []
        if isinstance(assignment, dict)
        else getattr(assignment, "assignment", [])
    )
    found: list[tuple[str, list[int]]] = []
    for entry in entries:
        if isinstance(entry, dict):
            found.append((str(entry["topic"]), [int(p) for p in entry["partitions"]]))
        else:
            topic, partitions = entry
            found.append((str(topic), [int(p) for p in partitions]))
    return found


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return "none"
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def describe(config: ClusterConfig, state: str, owners: list[Ownership]) -> str:
    """The status as text, one line per worker."""
    lines = [
        f"job {config.job_id}: group {config.group_id} {state}, {len(owners)} worker(s), "
        f"{config.partitions} partitions of {config.max_parallelism} key groups"
    ]
    for owner in owners:
        groups = sorted(kg for p in owner.partitions for kg in config.key_groups_of(p))
        inputs = ", ".join(f"{t}:{p}" for t, p in owner.inputs) or "none"
        admin = f"; admin {owner.admin_url}" if owner.admin_url else ""
        lines.append(
            f"worker {owner.worker} ({owner.host}): partitions {_ranges(owner.partitions)} "
            f"(key groups {_ranges(groups)}); input partitions {inputs}{admin}"
        )
    return "\n".join(lines)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="cluster.bootstrap_servers and cluster.job_id of the job (and cluster.partitions "
        "if not the default); repeatable",
    )


def status(args: argparse.Namespace) -> int:
    import sys

    from statefun._settings import Settings
    from statefun.cluster._config import cluster_config
    from statefun.runtime._commands import _settings_overrides

    config = cluster_config(Settings.load(_settings_overrides(args.settings)), worker_id="status")
    if config is None:
        raise ConfigurationError(
            "statefun status needs --set cluster.bootstrap_servers=HOST:PORT and "
            "--set cluster.job_id=NAME"
        )
    state, owners = group_ownership(config)
    sys.stdout.write(describe(config, state, owners) + "\n")
    return 0
