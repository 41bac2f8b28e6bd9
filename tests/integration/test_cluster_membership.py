"""A worker's group member (``Membership``) on a real broker: through a rebalance its group
leader starts because a subscribed topic got more partitions, with a join that outlasts the
leader's poll, the leader still takes its new assignment (it is not left out of the group,
polling on without partitions and without heartbeats); a member the group dropped hands its
partitions on as lost (never to be committed), then joins again."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, _membership, cluster_config, ensure_topics
from statefun.cluster._membership import Membership

kafka = import_kafka()
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def _config(bootstrap: str, job: str, worker: str) -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": bootstrap,
            "cluster.job_id": job,
            "cluster.worker_id": worker,
            "cluster.partitions": "2",
            "cluster.session_timeout_ms": "6000",
            "cluster.heartbeat_interval_ms": "1000",
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    return config


def _slow_range(user_data: bytes) -> Any:
    """The members' assignor, 0.3 s slower: the leader's join outlasts its 100 ms poll after
    the leader computed the assignment (deterministically, where it otherwise depends on when
    the poll's time runs out)."""
    assignor = _RANGE(user_data)
    assign = assignor.assign

    def slow(cluster: Any, members: Any) -> Any:
        time.sleep(0.3)
        return assign(cluster, members)

    assignor.assign = slow
    return assignor


_RANGE = _membership._range_assignor


class _Member:
    """A ``Membership`` whose assignments are recorded."""

    def __init__(self, config: ClusterConfig, source: str) -> None:
        #: (generation, exchange partitions, input partitions) of each assignment taken
        self.assignments: list[tuple[int, list[int], list[tuple[str, int]]]] = []
        #: (exchange partitions, lost) of each revocation
        self.revocations: list[tuple[list[int], bool]] = []
        self.membership = Membership(
            config,
            asyncio.get_running_loop(),
            self._assigned,
            self._revoked,
            self._deliver,
            {source: "earliest"},
        )

    async def _assigned(self, partitions: list[int], inputs: list[tuple[str, int]]) -> None:
        self.assignments.append((self.membership.generation, partitions, inputs))

    async def _revoked(self, partitions: list[int], lost: bool) -> None:
        self.revocations.append((partitions, lost))

    async def _deliver(self, records: list[Any]) -> None:
        pass

    def last(self) -> tuple[int, list[int], list[tuple[str, int]]]:
        return self.assignments[-1] if self.assignments else (-1, [], [])


async def _until(what: str, done: Any, seconds: float, members: list[_Member]) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        seen = {m.membership.config.worker_id: m.assignments for m in members}
        assert time.monotonic() < deadline, f"{what}: no such assignment within {seconds} s: {seen}"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _job(bootstrap: str, workers: list[str]) -> AsyncIterator[tuple[Any, str, list[_Member]]]:
    """A job with a 1-partition input topic and its topics made; a member per worker (not
    started), stopped and closed at the end: (admin client, input topic, members)."""
    job = f"membership-{uuid.uuid4().hex[:8]}"
    source = f"{job}-in"
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {source: {"num_partitions": 1, "replication_factor": 1}}, wait_for_metadata=True
        )
        configs = [_config(bootstrap, job, worker) for worker in workers]
        await asyncio.to_thread(ensure_topics, configs[0])
        members = [_Member(config, source) for config in configs]
        try:
            yield admin, source, members
        finally:
            for member in members:
                member.membership.stop_polling()
            await asyncio.sleep(0.3)
            for member in members:
                if member.membership._consumer is not None:
                    await asyncio.to_thread(member.membership.close)
    finally:
        admin.close()


async def test_the_leader_takes_its_assignment_when_a_rejoin_outlasts_its_poll(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_membership, "_range_assignor", _slow_range)
    async with _job(bootstrap, ["a", "b"]) as (admin, source, members):
        leader, other = members
        leader.membership.start()  # alone: the group's leader
        await _until("alone", lambda: leader.last()[1] == [0, 1], 30, members)
        other.membership.start()
        both = lambda: leader.last()[0] == other.last()[0] > 0 and other.last()[1]  # noqa: E731
        await _until("together", both, 30, members)
        generation = leader.last()[0]

        await asyncio.to_thread(admin.create_partitions, {source: 2})
        # (the leader's metadata would show the new partition within metadata.max.age.ms)
        await asyncio.to_thread(leader.membership._consumer.topics)
        inputs = lambda: sorted(leader.last()[2] + other.last()[2])  # noqa: E731
        await _until(
            "after the new partition",
            lambda: (
                leader.last()[0] == other.last()[0] > generation
                and inputs() == [(source, 0), (source, 1)]
            ),
            20,
            members,
        )


async def test_a_member_the_group_dropped_hands_its_partitions_on_as_lost(bootstrap: str) -> None:
    """When its consumer learns that the group dropped it (here: its generation reset, as
    kafka-python does when a heartbeat or a commit says the member is unknown), the member's
    partitions go out through the lost path, not the revoke that may commit, and the member
    joins again in a later generation."""
    async with _job(bootstrap, ["a"]) as (_, _, members):
        [member] = members
        member.membership.start()
        await _until("alone", lambda: member.last()[1] == [0, 1], 30, members)
        generation = member.last()[0]
        member.revocations.clear()  # (a first join may revoke an empty assignment)

        member.membership._consumer._coordinator.reset_generation()
        await _until("again", lambda: member.last()[0] > generation, 30, members)
        assert [(sorted(p), lost) for p, lost in member.revocations] == [([0, 1], True)]
        assert member.last()[1] == [0, 1]
