"""Expired idempotency keys of a clustered job leave Kafka with no traffic: a worker's sweep
deletes them from its key groups' state, and its next checkpoint writes their tombstones to
the changelog (real broker, a ``statefun worker`` process, real HTTP)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from statefun._keygroups import key_group_for
from statefun.cluster._changelog import read_changelog
from statefun.cluster._keys import KEY_TYPENAME, key_id
from tests.integration.test_cluster_http import HttpCluster, keyed_post

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def _changelog_value(cluster: HttpCluster, key: str) -> tuple[bool, bytes | None]:
    """(whether the changelog has a record of the key's address, its latest value)."""
    config = cluster.config
    kid = key_id("chttp/http", key)
    key_group = key_group_for(KEY_TYPENAME, kid, config.max_parallelism)
    partition = config.partition_of(key_group)
    name = f"{partition}:s:{key_group}:{KEY_TYPENAME}\x1f{kid}".encode()
    latest, _ = read_changelog(config, [partition], client="test")
    return name in latest, latest.get(name)


def test_an_expired_key_is_deleted_from_the_changelog_with_no_request(
    tmp_path: Path, bootstrap: str
) -> None:
    cluster = HttpCluster(
        tmp_path, bootstrap, names=("w0",), extra={"http_idempotency_retention_s": "2"}
    )
    try:
        cluster.start("w0")
        cluster.wait_assigned()
        url = f"{cluster.url('w0')}/messages/chttp/record/m1"
        assert keyed_post(url, f"1:{cluster.output}", "k1") == (202, "accepted", False)
        started = time.monotonic()
        found, value = _changelog_value(cluster, "k1")
        while not found:  # (the commit's markers reach the partition just after the 202)
            assert time.monotonic() - started < 10, "the key was not recorded"
            time.sleep(0.1)
            found, value = _changelog_value(cluster, "k1")
        assert value  # recorded, committed with the message
        while value is not None:  # no request from now on
            assert time.monotonic() - started < 30, "the expired key was never deleted"
            time.sleep(0.5)
            _, value = _changelog_value(cluster, "k1")
        print(
            f"\nexpired key's tombstone in the changelog {time.monotonic() - started:.1f} s "
            "after its 202 (retention 2 s, sweep every 1 s)"
        )
        assert keyed_post(url, f"2:{cluster.output}", "k1") == (202, "accepted", False)
    finally:
        cluster.close()
    log = cluster.log("w0").read_text()
    assert "Traceback" not in log, log[-3000:]
