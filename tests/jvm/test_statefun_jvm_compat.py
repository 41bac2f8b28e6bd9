"""Both ways compatible with Apache StateFun: one module.yaml, two runtimes, the same results.

This SDK's functions, served by ``statefun serve`` (two processes: the greeter of
examples/greeter and the shopping cart of examples/shopping-cart-kafka, written with
``from statefun import *`` only), answer Apache StateFun 3.3.0's JVM runtime (Flink 1.16.2,
bench/peers/statefun-jvm/run.sh) and pystatefun's runtime (``statefun run``). Both runtimes
run the same tests/jvm/module.yaml - HTTP endpoints v2, a Kafka ingress with three topics, two
exactly-once Kafka egresses - with the broker address, ports, input topics and consumer group
filled in; the same records go in, and a read_committed reader must see the same records come
out of both, exactly the expected ones: state, function-to-function messages, a delayed message
re-armed and cancelled by token, egress through ``kafka_egress_message``.

The commands are fed in phases, each after the previous one's results are visible, so that the
expected output does not depend on timing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench._jvm_processes import (
    JvmPeer,
    Proc,
    Reader,
    create_topics,
    end_offsets,
    free_port,
    missing_jvm_tools,
    produce,
    pystatefun_status,
    start_pystatefun,
    start_serve,
    start_statefun_jvm,
)
from examples.greeter.functions import GREETINGS_TOPIC, greeting
from statefun._kafka_local.broker import KafkaBroker

_missing = missing_jvm_tools()

pytestmark = [
    pytest.mark.jvm,
    pytest.mark.kafka,
    pytest.mark.timeout(900),  # a first Maven build fetches ~300 MB (or waits for another)
    pytest.mark.skipif(_missing is not None, reason=_missing or ""),
]

HERE = Path(__file__).resolve().parent
EVENTS_TOPIC = "shop-events"  # examples/shopping-cart-kafka/functions.py
OUTPUTS = (GREETINGS_TOPIC, EVENTS_TOPIC)
NAMES = ["alice", "bob", "alice", "carol", "dave", "alice", "bob", "erin"] * 5
# How long a phase may wait for its results: StateFun's first checkpoint takes 6-9 s (its
# transactional producers start), and CI machines are slow.
PHASE_TIMEOUT = 120.0
# After the last expected record: one more checkpoint, to see records that should not exist.
LINGER = 2.5


def cmd(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def ev(event: str, **fields: object) -> str:
    return json.dumps({"event": event, **fields}, sort_keys=True, separators=(",", ":"))


def expected_greetings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in NAMES:
        out.setdefault(name, []).append(greeting(name, len(out.get(name, [])) + 1))
    return out


# Per key, in order. apple: 5 restocked, alice reserves 2, bob 1, bob's cart expires and
# releases 1. pear: 1 restocked, bob reserves it, carol finds none, bob's cart releases it.
# alice checks out before her cart expires (the delayed "expire" is cancelled); bob's cart is
# re-armed by his second reservation (cancel + send_after with the same token) and expires once.
EXPECTED_EVENTS = {
    "apple": [
        ev("stock", item="apple", stock=5, why="restock"),
        ev("stock", item="apple", stock=3, why="reserve"),
        ev("stock", item="apple", stock=2, why="reserve"),
        ev("stock", item="apple", stock=3, why="release"),
    ],
    "pear": [
        ev("stock", item="pear", stock=1, why="restock"),
        ev("stock", item="pear", stock=0, why="reserve"),
        ev("stock", item="pear", stock=1, why="release"),
    ],
    "alice": [
        ev("reserved", user="alice", item="apple"),
        ev("checkout", user="alice", items={"apple": 2}),
    ],
    "bob": [
        ev("reserved", user="bob", item="pear"),
        ev("reserved", user="bob", item="apple"),
        ev("expired", user="bob", items={"apple": 1, "pear": 1}),
    ],
    "carol": [ev("out-of-stock", user="carol", item="pear")],
}


@dataclass(frozen=True)
class Servers:
    greeter_port: int
    shop_port: int


@pytest.fixture(scope="module")
def function_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The two function servers, shared by both runtimes."""
    logs = tmp_path_factory.mktemp("function-servers")
    greeter_port, shop_port = free_port(), free_port()
    greeter = start_serve("examples.greeter.functions:functions", greeter_port, logs / "g.log")
    try:
        shop = start_serve(
            "examples/shopping-cart-kafka/functions.py:functions", shop_port, logs / "shop.log"
        )
        try:
            yield Servers(greeter_port, shop_port)
        finally:
            shop.stop()
    finally:
        greeter.stop()


def fill_in(bootstrap: str, servers: Servers, run: str) -> tuple[str, dict[str, str]]:
    """tests/jvm/module.yaml for this broker, these servers and fresh input topics."""
    topics = {name: f"compat-{run}-{name}" for name in ("names", "inventory", "carts")}
    text = (HERE / "module.yaml").read_text()
    text = (
        text.replace("127.0.0.1:9092", bootstrap)
        .replace("127.0.0.1:8000/", f"127.0.0.1:{servers.greeter_port}/")
        .replace("127.0.0.1:8001/", f"127.0.0.1:{servers.shop_port}/")
        .replace("consumerGroupId: compat", f"consumerGroupId: compat-{run}")
    )
    for name, topic in topics.items():
        text = text.replace(f"topic: compat-{name}\n", f"topic: {topic}\n")
    return text, topics


def by_key(reader: Reader, topic: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for record in reader.snapshot()[topic]:
        out.setdefault(record.key or "", []).append(record.value.decode())
    return out


def drive(bootstrap: str, topics: dict[str, str], start: Callable[[], Proc]) -> Reader:
    """Feed the phases through the runtime that ``start`` starts; the reader holds the output."""
    starts = {topic: end_offsets(bootstrap, topic) for topic in OUTPUTS}
    # Phase 1, written before the runtime starts (its ingress reads from the earliest offset).
    produce(bootstrap, topics["names"], [(name, b"hi") for name in NAMES])
    produce(
        bootstrap,
        topics["inventory"],
        [("apple", cmd(op="restock", qty=5)), ("pear", cmd(op="restock", qty=1))],
    )
    proc = start()

    def events(reader: Reader) -> int:
        return reader.count(EVENTS_TOPIC)

    reader = Reader(bootstrap, OUTPUTS, starts)
    with reader:
        reader.wait_for(
            lambda r: r.count(GREETINGS_TOPIC) >= len(NAMES) and events(r) >= 2,
            PHASE_TIMEOUT,
            "the greetings and the restocks",
            proc,
        )
        # Phase 2: two carts reserve; each arms its delayed "expire".
        produce(
            bootstrap,
            topics["carts"],
            [
                ("alice", cmd(op="add", item="apple", qty=2)),
                ("bob", cmd(op="add", item="pear", qty=1)),
            ],
        )
        reader.wait_for(lambda r: events(r) >= 6, PHASE_TIMEOUT, "the reservations", proc)
        # Phase 3: carol finds no pear, bob re-arms his cart, alice checks out (cancels).
        produce(
            bootstrap,
            topics["carts"],
            [
                ("carol", cmd(op="add", item="pear", qty=1)),
                ("bob", cmd(op="add", item="apple", qty=1)),
                ("alice", cmd(op="checkout")),
            ],
        )
        total = sum(len(v) for v in EXPECTED_EVENTS.values())
        reader.wait_for(lambda r: events(r) >= total, PHASE_TIMEOUT, "bob's cart to expire", proc)
        time.sleep(LINGER)
    return reader


def check(reader: Reader, runtime: str) -> dict[str, dict[str, list[str]]]:
    results = {topic: by_key(reader, topic) for topic in OUTPUTS}
    assert results[GREETINGS_TOPIC] == expected_greetings(), runtime
    assert results[EVENTS_TOPIC] == EXPECTED_EVENTS, runtime
    return results


def test_same_module_same_results_on_statefun_jvm_and_pystatefun(
    kafka_broker: KafkaBroker, function_servers: Servers, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    create_topics(bootstrap, OUTPUTS)
    results = {}

    # Apache StateFun 3.3.0 on Flink 1.16.2 (MiniCluster), exactly-once checkpoints every 1 s.
    text, topics = fill_in(bootstrap, function_servers, f"jvm-{uuid.uuid4().hex[:8]}")
    module = tmp_path / "statefun-jvm" / "module.yaml"
    module.parent.mkdir()
    module.write_text(text)
    create_topics(bootstrap, topics.values())
    peers: list[JvmPeer] = []

    def start_jvm() -> Proc:
        peers.append(start_statefun_jvm(module, module.parent / "statefun-jvm.log"))
        return peers[0].proc

    try:
        reader = drive(bootstrap, topics, start_jvm)
        assert peers[0].failures() == [], "the StateFun job failed (and restarted)"
    finally:
        for peer in peers:
            peer.proc.stop()
    results["statefun-jvm"] = check(reader, "statefun-jvm")

    # pystatefun, exactly-once checkpoints every 1 s (the default interval).
    text, topics = fill_in(bootstrap, function_servers, f"py-{uuid.uuid4().hex[:8]}")
    module = tmp_path / "pystatefun" / "module.yaml"
    module.parent.mkdir()
    module.write_text(text)
    create_topics(bootstrap, topics.values())
    runs: list[tuple[Proc, int]] = []

    def start_py() -> Proc:
        settings = {"checkpoint_dir": module.parent / "checkpoints"}
        runs.append(start_pystatefun(module, module.parent / "pystatefun.log", settings=settings))
        return runs[0][0]

    try:
        reader = drive(bootstrap, topics, start_py)
        status = pystatefun_status(runs[0][1])
        assert status["dead_letters"] == 0, status
    finally:
        codes = [(proc.stop(), proc) for proc, _ in runs]
    for code, proc in codes:
        assert code == 0, f"statefun run exited with {code}:\n{proc.tail()}"
    results["pystatefun"] = check(reader, "pystatefun")

    assert results["statefun-jvm"] == results["pystatefun"]
