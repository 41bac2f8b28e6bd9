"""The side by side's ceiling: the function server driven alone (bench/_server_alone.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._jvm_processes import free_port, start_serve
from bench._server_alone import Alone, drive, hot_key_request
from bench.statefun_jvm_vs_pystatefun import FUNCTION, Phase, Run, ceiling
from statefun.sdk._proto import request_reply_pb2 as pb


def test_the_request_is_the_hot_keys_batch_with_its_state() -> None:
    request = pb.ToFunction.FromString(hot_key_request(3, topic="out", count=41))
    batch = request.invocation
    assert (batch.target.namespace, batch.target.type, batch.target.id) == (
        "bench",
        "counter",
        "hot",
    )
    assert [s.state_name for s in batch.state] == ["count"]
    assert batch.state[0].state_value.typename == "io.statefun.types/int"
    assert len(batch.invocations) == 3
    stamps = [i.argument.value for i in batch.invocations]
    assert all(s.startswith(b"out ") for s in stamps) and len(set(stamps)) == 3


def test_the_function_server_alone_answers_every_batch(tmp_path: Path) -> None:
    port = free_port()
    server = start_serve(FUNCTION, port, tmp_path / "serve.log")
    try:
        alone = drive(port, server.process.pid, 2_500, batch=1_000)
    finally:
        server.stop()
    assert alone.records == 2_000  # two whole batches
    assert alone.wall_s > 0 and alone.records_per_s == alone.records / alone.wall_s


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(500)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"nope")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def refusing_port() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_does_not_answer_200_fails_the_ceiling(refusing_port: int) -> None:
    with pytest.raises(ValueError, match="answered 500"):
        drive(refusing_port, 1, 1_000)


def test_the_report_gives_each_runtimes_share_and_the_most_any_could_show() -> None:
    def run(runtime: str, rate: float) -> Run:
        phase = Phase("one hot key, backlog", 1, 1000, None, backlog=True, outputs=1000)
        phase.records_per_s = rate
        return Run(runtime, "at-least-once", [phase])

    alone = [Alone(1000, 0.01, 0.009), Alone(1000, 0.0125, 0.01)]  # 100k and 80k records/s
    report = ceiling([run("pystatefun", 45_000.0), run("statefun-jvm", 40_000.0)], alone)
    assert report.splitlines() == [
        "- one hot key, backlog: the function server alone (no runtime, one batch of up to 1,000 "
        "in flight) 90,000 records/s (80,000-100,000), CPU: function server 0.85",
        "- at-least-once, pystatefun: 50% of it",
        "- at-least-once, statefun-jvm: 44% of it",
        "- at-least-once: no runtime could reach more than 2.25x StateFun's records/s in this "
        "phase here",
    ]
