"""Instructions per message around an embedded function: a deterministic measure (callgrind).

The work is bench/embedded_dispatch.py's, slice loop only: keyBy (``Job.send``) and the
dispatchers working off their inboxes ``dispatcher_slice`` messages at a time, around
bench/runtime_e2e.py's counter (one IntType state incremented, one egress record per message)
and its sink, over ``--keys`` keys (10,000: no two messages of a slice go to one address).
A worker process builds the ``Job`` (``Settings.load({"metrics": M, "max_in_flight_messages":
"100000"})``) and runs ``one_round`` N times (``PYTHONHASHSEED=0``, GC off) under

    valgrind --tool=callgrind --callgrind-out-file=/dev/null

once with ``--rounds`` LOW and once with HIGH rounds; the figure is
(instructions(HIGH) - instructions(LOW)) / ((HIGH - LOW) * keys): start-up, imports and the
first rounds (the state's dicts growing) cancel out. The same input gives the same count to
a few instructions per message, whatever else the machine runs, so one run of each side is
enough to compare two commits.

    .venv/bin/python bench/instructions.py                       # this checkout (~2 minutes)
    .venv/bin/python bench/instructions.py --compare ../base     # and another checkout: ratio
    .venv/bin/python bench/instructions.py --metrics false
    .venv/bin/python bench/instructions.py --smoke               # does it still run?

``--workload sdk-handler`` counts another path instead: the SDK's request handler
(``RequestReplyHandler.handle_sync``, no HTTP) on one request of ``--keys`` invocations (1,000
by default, a hot key's full batch) for one address of bench/_jvm_counter.py's counter, the
function server of bench/statefun_jvm_vs_pystatefun.py; per invocation.

``--workload submit`` sends the messages as a source does instead of through ``Job.send``:
``await context.submit(...)`` on the source's ``IngressContext`` (bench/runtime_e2e.py's
``SequenceSource``, the value made in the round), in a running event loop, then the slices.

``--workload kafka-ingress`` counts the slice loop's work behind the Kafka ingress instead
of ``Job.send``: per round, a polled batch of ``--keys`` records of one partition (an
``IntType`` value each, ``ConsumerRecord`` tuples made in the round, as kafka-python's client
gives them) goes through ``KafkaSource._route_all`` (the run of valid records: key decoded,
value checked; ``emit_many``; the positions), then the dispatchers' slices as above; per
record.

``--compare DIR`` runs DIR's ``statefun`` (with its sdk/, ingress/, egress/) and its
bench/embedded_dispatch.py in this virtualenv. Without valgrind (not installed) only
``--smoke`` runs: the same rounds, uncounted, and it says so. Progress goes to stderr; a
Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: callgrind's summary line on stderr: "==PID== Collected : N"
_COLLECTED = re.compile(r"==\d+== Collected : (\d+)")
_PACKAGES = {"statefun": "statefun", "statefun.sdk": "sdk", "statefun.ingress": "ingress"}
_PACKAGES["statefun.egress"] = "egress"


# -- the worker: runs in the checkout under test ------------------------------------------------


def _use_checkout(root: Path) -> None:
    """Import ``statefun`` (sdk/, ingress/, egress/ included) and ``bench`` from ``root``,
    whatever the virtualenv's editable install points at."""
    import importlib.abc
    import importlib.machinery
    import importlib.util

    class CheckoutFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: object, target: object = None) -> object:
            folder = _PACKAGES.get(fullname)
            if folder is None:
                return None
            init = root / folder / "__init__.py"
            return importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[str(init.parent)]
            )

    sys.path[0] = str(root)  # (this script's folder: bench/ of this checkout)
    sys.meta_path.insert(0, CheckoutFinder())


def _counter_job(metrics: str) -> tuple[Any, Any]:
    """A ``Job`` with bench/runtime_e2e.py's counter embedded and no sources, and its sink
    (imported from the checkout in use: call after ``_use_checkout``)."""
    from bench.runtime_e2e import FUNCTION_TARGET, TimingSink
    from statefun._settings import Settings
    from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec
    from statefun.runtime import Job

    settings = Settings.load({"metrics": metrics, "max_in_flight_messages": "100000"}, environ={})
    endpoint = EmbeddedEndpointSpec(FunctionTarget("bench", "counter"), FUNCTION_TARGET)
    sink = TimingSink()
    return Job(ModuleSpec(endpoints=(endpoint,)), settings, sources=[], sinks=[sink]), sink


def _run_slices(job: Any) -> None:
    """Every dispatcher works off its inbox, slice by slice."""
    slice_size = job.settings.dispatcher_slice
    for dispatcher in job.dispatchers:
        inbox = dispatcher.inbox
        while inbox:
            dispatcher._run_slice(inbox, slice_size)


def _check(root: Path, job: Any, sink: Any, sent: int) -> None:
    """Exit unless the sink saw each of the ``sent`` messages once and none is pending."""
    if len(sink.seqs) != sent or job.pending:
        raise SystemExit(f"{root}: the sink saw {len(sink.seqs)} records of {sent}")
    if sorted(sink.seqs) != list(range(sent)):
        raise SystemExit(f"{root}: the sink's records are not each message once")
    print(f"ok {sent}")


def worker(root: Path, rounds: int, keys: int, metrics: str) -> None:
    """Run ``rounds`` rounds of ``keys`` messages through the slice loop; check the counts."""
    _use_checkout(root)
    import gc

    from bench.embedded_dispatch import one_round

    job, sink = _counter_job(metrics)
    ids = [f"key-{i}" for i in range(keys)]
    gc.disable()
    for round_ in range(rounds):
        one_round(job, ids, round_ * keys, True)
    _check(root, job, sink, rounds * keys)


def submit_worker(root: Path, rounds: int, keys: int, metrics: str) -> None:
    """Submit ``rounds`` rounds of ``keys`` messages as a source does (``await
    context.submit(...)``, bench/runtime_e2e.py's ``SequenceSource``), then run the slices."""
    _use_checkout(root)
    import asyncio
    import gc

    from bench.runtime_e2e import COUNTER, INT_TYPENAME
    from bench.runtime_e2e import _serialize_int as serialize
    from statefun.runtime._ingress_port import IngressPort
    from statefun.sdk import TypedValue

    ids = [f"key-{i}" for i in range(keys)]

    async def main() -> tuple[Any, Any]:
        job, sink = _counter_job(metrics)
        submit = IngressPort(job, job.router).submit
        for round_ in range(rounds):
            first = round_ * keys
            for i, id_ in enumerate(ids):  # (with room for all, no submit waits)
                await submit(COUNTER, id_, TypedValue(INT_TYPENAME, serialize(first + i)))
            _run_slices(job)
        return job, sink

    gc.disable()
    job, sink = asyncio.run(main())
    _check(root, job, sink, rounds * keys)


def kafka_worker(root: Path, rounds: int, keys: int, metrics: str) -> None:
    """Route ``rounds`` polled batches of ``keys`` records through the Kafka ingress (its
    ``_route_all``: the run of valid records, ``emit_many``) and the slice loop."""
    _use_checkout(root)
    import gc

    from bench.runtime_e2e import INT_TYPENAME, _serialize_int
    from statefun._kafka import import_kafka
    from statefun.ingress.kafka import KafkaSource, _Route
    from statefun.module._specs import KafkaTopicSpec
    from statefun.runtime._ingress_port import IngressPort

    import_kafka()
    from kafka.consumer.fetcher import ConsumerRecord

    job, sink = _counter_job(metrics)
    topic = KafkaTopicSpec("in", INT_TYPENAME, ("bench/counter",))
    source = KafkaSource("bench/in", "127.0.0.1:1", [topic])
    port = IngressPort(job, job.router)
    routes = {"in": _Route(topic, port)}
    ids = [f"key-{i}".encode() for i in range(keys)]
    gc.disable()
    for round_ in range(rounds):
        first = round_ * keys
        batch = [  # (ConsumerRecord's fields as the client fills them)
            tuple.__new__(
                ConsumerRecord,
                ("in", 0, 0, first + i, 0, 0, id_, _serialize_int(first + i), [], None, -1, -1, -1),
            )
            for i, id_ in enumerate(ids)
        ]
        routing = source._route_all(batch, routes, port)
        try:
            routing.send(None)  # (with room for all, it never waits)
        except StopIteration:
            pass
        else:
            raise SystemExit(f"{root}: the Kafka ingress waited for room")
        _run_slices(job)
    _check(root, job, sink, rounds * keys)


def sdk_worker(root: Path, rounds: int, batch: int) -> None:
    """Handle one request of ``batch`` invocations ``rounds`` times; check the reply."""
    _use_checkout(root)
    import gc
    import importlib.util

    from statefun.sdk import IntType
    from statefun.sdk._handler import RequestReplyHandler
    from statefun.sdk._proto import request_reply_pb2 as pb

    spec = importlib.util.spec_from_file_location("_jvm_counter", root / "bench/_jvm_counter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    request = pb.ToFunction()
    invocations = request.invocation
    invocations.target.namespace, invocations.target.type = "bench", "counter"
    invocations.target.id = "hot"
    count = pb.TypedValue(typename=IntType.typename, has_value=True)
    count.value = IntType.serializer().serialize(5)
    invocations.state.add(state_name="count", state_value=count)
    for n in range(batch):
        argument = invocations.invocations.add().argument
        argument.typename, argument.has_value = "bench/stamp", True
        argument.value = b"out-topic %d" % (1_700_000_000_000_000_000 + n)
    data = request.SerializeToString()
    handler = RequestReplyHandler(module.functions)
    gc.disable()
    for _ in range(rounds):
        reply = pb.FromFunction.FromString(handler.handle_sync(data)).invocation_result
    if len(reply.outgoing_egresses) != batch or len(reply.state_mutations) != 1:
        raise SystemExit(f"{root}: the reply holds {len(reply.outgoing_egresses)} records")
    if reply.state_mutations[0].state_value.value != IntType.serializer().serialize(5 + batch):
        raise SystemExit(f"{root}: the count is not {5 + batch}")
    print(f"ok {rounds * batch}")


# -- the driver ----------------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "PYTHONHASHSEED": "0"}


def _command(root: Path, rounds: int, keys: int, metrics: str, workload: str) -> list[str]:
    script = str(Path(__file__).resolve())
    return [
        sys.executable,
        script,
        "--worker",
        str(root),
        str(rounds),
        str(keys),
        metrics,
        workload,
    ]


def run_worker(
    root: Path, rounds: int, keys: int, metrics: str, valgrind: str | None, workload: str
) -> int:
    """Instructions of one worker run under callgrind (0 without ``valgrind``)."""
    command = _command(root, rounds, keys, metrics, workload)
    if valgrind:
        command = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(
        command, cwd=root, env=_environment(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.startswith("ok "):
        raise SystemExit(
            f"worker {root} ({rounds} rounds) exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    if not valgrind:
        return 0
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def _generated_files(root: Path, progress: Callable[[str], None]) -> None:
    """Give ``root`` the protobuf modules it lacks (build products, not in git) from this
    checkout, where its .proto file is the same; fail where it differs."""
    for proto in sorted((root / "sdk" / "_proto").glob("*.proto")):
        generated = proto.with_name(proto.stem + "_pb2.py")
        if generated.is_file():
            continue
        ours = ROOT / "sdk" / "_proto" / proto.name
        if not ours.is_file() or ours.read_bytes() != proto.read_bytes():
            raise SystemExit(f"{generated} is missing (and {proto.name} differs from ours)")
        progress(f"{generated}: copied from {ours.parent} (the same {proto.name})")
        shutil.copyfile(ours.with_name(generated.name), generated)


def _commit(root: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:  # (no git)
        return "?"
    return done.stdout.strip() or "?"


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":
        _, _, root, rounds, keys, metrics, workload = sys.argv
        if workload == "sdk-handler":
            sdk_worker(Path(root), int(rounds), int(keys))
        elif workload == "submit":
            submit_worker(Path(root), int(rounds), int(keys), metrics)
        elif workload == "kafka-ingress":
            kafka_worker(Path(root), int(rounds), int(keys), metrics)
        else:
            worker(Path(root), int(rounds), int(keys), metrics)
        return 0
    # (the driver's imports: the worker's come from the checkout it measures)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench._common import SMOKE_HELP, progress, smoke_banner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload",
        choices=("slice-loop", "submit", "kafka-ingress", "sdk-handler"),
        default="slice-loop",
        help="the path",
    )
    parser.add_argument(
        "--keys", type=int, help="keys (slice-loop: 10,000) or invocations per request (1,000)"
    )
    parser.add_argument(
        "--rounds", default="2,4", help="LOW,HIGH: the rounds of the two runs (default 2,4)"
    )
    parser.add_argument("--metrics", default="true", help="the setting metrics (true|false)")
    parser.add_argument(
        "--compare", type=Path, help="another checkout to measure in the same run (A = it)"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    low, high = (int(part) for part in args.rounds.split(","))
    if args.keys is None:
        args.keys = 1_000 if args.workload == "sdk-handler" else 10_000
    if args.smoke:
        low, high, args.keys = 1, 2, 300
    if not 0 <= low < high:
        parser.error(f"--rounds {args.rounds}: needs LOW < HIGH")
    valgrind = shutil.which("valgrind")
    if valgrind is None and not args.smoke:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    roots = [args.compare.resolve(), ROOT] if args.compare else [ROOT]
    for root in roots:
        if not (root / "bench" / "embedded_dispatch.py").is_file():
            raise SystemExit(f"--compare {root}: no bench/embedded_dispatch.py there")
        _generated_files(root, progress)
    # a first run without valgrind checks each side quickly and compiles its bytecode (so
    # that both counted runs find the same cached files)
    for root in roots:
        progress(f"{root}: a check run without valgrind")
        run_worker(root, 1, min(args.keys, 1000), args.metrics, None, args.workload)
    runs = [(root, rounds) for root in roots for rounds in (low, high)]
    what = "under callgrind" if valgrind else "WITHOUT valgrind (not installed): not counted"
    progress(f"{len(runs)} runs {what}, 2 at a time ...")
    with ThreadPoolExecutor(2) as pool:
        counts = list(
            pool.map(
                lambda run: run_worker(*run, args.keys, args.metrics, valgrind, args.workload),
                runs,
            )
        )
    if args.smoke:
        smoke_banner()
        if valgrind is None:
            print("valgrind is not installed: the rounds ran without it, nothing was counted")
            print()
    messages = (high - low) * args.keys
    unit = "invocation" if args.workload == "sdk-handler" else "message"
    print(f"| checkout | commit | instructions, {low} rounds | {high} rounds | per {unit} |")
    print("| --- | --- | ---: | ---: | ---: |")
    per_message = []
    for index, root in enumerate(roots):
        a, b = counts[2 * index], counts[2 * index + 1]
        per_message.append((b - a) / messages)
        figures = f"{a:,} | {b:,} | {per_message[-1]:,.0f}" if valgrind else "- | - | -"
        print(f"| {root} | {_commit(root)} | {figures} |")
    if len(roots) == 2 and per_message[0]:
        before, after = per_message
        print()
        print(
            f"- {ROOT.name} / {roots[0].name}: {after / before:.4f} "
            f"({after - before:+,.0f} instructions per {unit}, {after / before - 1:+.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
