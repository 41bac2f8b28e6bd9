"""`statefun run` with plainly bad input or an unusable environment: one line, no traceback.

Each test runs the real command in a process of its own and checks its standard error: the
last line is ``statefun run: error: ...`` naming what is wrong and where, nothing else is
printed at level error (and no traceback at all), and the exit code is the CLI's (2 wrong
usage: settings, module files; 1 failure while running: a port in use, an unreachable Kafka).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

HTTP_INGRESS = """
kind: io.pystatefun.http.v1/ingress
spec:
  id: app/http
  port: {port}
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: app/out
"""


def statefun(
    args: Sequence[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    log_level: str = "error",
    preexec: object = None,
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYSTATEFUN_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "statefun", "--log-level", log_level, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        preexec_fn=preexec,  # type: ignore[arg-type]
    )


def one_line_error(
    result: subprocess.CompletedProcess[str],
    code: int,
    *parts: str,
    others: str = "^$",
    command: str = "run",
) -> str:
    """The error line, after checking it is the only line (but for lines matching ``others``)
    and names every one of ``parts``."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not re.search(others, line)]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"statefun {command}: error: "), line
    for part in parts:
        assert part in line, (part, line)
    assert result.returncode == code, (result.returncode, result.stderr)
    return line


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "module.yaml"
    path.write_text(HTTP_INGRESS.format(port=0))
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- settings --------------------------------------------------------------------------------


def test_an_admin_port_out_of_range(module: Path) -> None:
    result = statefun(["run", str(module), "--set", "admin_port=70000"], module.parent)
    one_line_error(result, 2, "admin_port", "70000", "0-65535")


def test_a_misspelled_environment_variable(module: Path) -> None:
    result = statefun(["run", str(module)], module.parent, env={"PYSTATEFUN_CHEKPOINT_DIR": "chk"})
    one_line_error(result, 2, "PYSTATEFUN_CHEKPOINT_DIR", "did you mean PYSTATEFUN_CHECKPOINT_DIR")


def test_a_negative_count_from_the_environment(module: Path) -> None:
    result = statefun(
        ["run", str(module)], module.parent, env={"PYSTATEFUN_RESTART_ATTEMPTS": "-1"}
    )
    one_line_error(result, 2, "restart_attempts", "-1")


# -- checkpoint_dir --------------------------------------------------------------------------


def test_a_checkpoint_dir_that_is_a_file(module: Path) -> None:
    target = module.parent / "a-file"
    target.write_text("x")
    result = statefun(["run", str(module), "--set", f"checkpoint_dir={target}"], module.parent)
    one_line_error(result, 2, f"checkpoint_dir {str(target)!r}", "not a directory")


def test_a_checkpoint_dir_that_cannot_be_created(module: Path) -> None:
    blocker = module.parent / "blocker"
    blocker.write_text("x")
    target = blocker / "checkpoints"
    result = statefun(["run", str(module), "--set", f"checkpoint_dir={target}"], module.parent)
    one_line_error(result, 2, f"checkpoint_dir {str(target)!r}", "cannot be created")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_checkpoint_dir_that_is_not_writable(module: Path) -> None:
    target = module.parent / "read-only"
    target.mkdir()
    target.chmod(0o500)
    try:
        result = statefun(["run", str(module), "--set", f"checkpoint_dir={target}"], module.parent)
    finally:
        target.chmod(0o700)
    one_line_error(result, 2, f"checkpoint_dir {str(target)!r}", "not writable")


# -- ports in use ----------------------------------------------------------------------------


def test_the_http_ingress_port_in_use(module: Path, busy_port: int) -> None:
    module.write_text(HTTP_INGRESS.format(port=busy_port))
    result = statefun(["run", str(module)], module.parent)
    one_line_error(
        result, 1, f"cannot listen on 127.0.0.1:{busy_port}", "address already in use", "app/http"
    )


def test_the_admin_port_in_use(module: Path, busy_port: int) -> None:
    result = statefun(["run", str(module), "--set", f"admin_port={busy_port}"], module.parent)
    one_line_error(
        result, 1, f"cannot listen on 127.0.0.1:{busy_port}", "address already in use", "admin"
    )


# -- Kafka that nobody serves ----------------------------------------------------------------

KAFKA_INGRESS = """
kind: io.statefun.kafka.v1/ingress
spec:
  id: app/orders
  address: 127.0.0.1:{port}
  properties:
    - bootstrap.timeout.ms: 1500
  topics:
    - topic: orders
      valueType: app/Order
      targets: [app/f]
---
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: app/*
  module: fns.py:functions
"""
KAFKA_EGRESS = """
kind: io.statefun.kafka.v1/egress
spec:
  id: app/receipts
  address: 127.0.0.1:{port}
  properties:
    - bootstrap.timeout.ms: 1500
  deliverySemantic:
    type: exactly-once
    transactionTimeout: 1min
"""
FNS = "from statefun import *\nfunctions = StatefulFunctions()\n"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("text", "component"),
    [(KAFKA_INGRESS, "ingress app/orders"), (KAFKA_EGRESS, "egress app/receipts")],
)
def test_an_unreachable_kafka(tmp_path: Path, text: str, component: str) -> None:
    port = closed_port()
    (tmp_path / "module.yaml").write_text(text.format(port=port))
    (tmp_path / "fns.py").write_text(FNS)
    result = statefun(["run", "module.yaml"], tmp_path)
    kafka_python = r"^\d\d:\d\d:\d\d (ERROR|WARNING) +kafka\."  # the client's own log lines
    line = one_line_error(
        result, 1, component, f"127.0.0.1:{port}", "cannot reach Kafka", others=kafka_python
    )
    assert len(line) < 400


# -- module files ----------------------------------------------------------------------------

BAD_MODULES = [
    ("kind: [\n", r"module.yaml, line 2, column 1: invalid YAML"),
    ("kind: a\nspec: \x01\n", r"module.yaml, line 2, column 7: invalid YAML: character U\+0001"),
    ("- 1\n- 2\n", r"document 1: expected a mapping with 'kind' and 'spec', got a list"),
    ("kind: x/y\nspec: {}\n", r"kind: unknown kind 'x/y'"),
    ("kind: io.pystatefun.http.v1/ingress\n", r"spec: missing"),
    ("kind: io.pystatefun.http.v1/ingress\nspec: []\n", r"spec: expected a mapping, got a list"),
    (
        "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/b, port: 99999}\n",
        r"spec.port: expected an integer from 0 to 65535, got 99999",
    ),
    (
        "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/b, port: '80'}\n",
        r"spec.port: expected an integer from 0 to 65535, got '80'",
    ),
    (
        "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/b, replyTimeout: -1s}\n",
        r"spec.replyTimeout: expected a duration",
    ),
    (
        "kind: io.statefun.endpoints.v2/http\n"
        "spec: {functions: a/*, urlPathTemplate: 'http://localhost:99999/f'}\n",
        r"spec.urlPathTemplate: port 99999 of 'http://localhost:99999/f' is out of range 1-65535",
    ),
    (
        "kind: io.statefun.endpoints.v2/http\n"
        "spec: {functions: a/*, urlPathTemplate: 'http://:8000/f'}\n",
        r"spec.urlPathTemplate: 'http://:8000/f' has no host",
    ),
    (
        "kind: io.statefun.endpoints.v2/http\n"
        "spec: {functions: a/*, urlPathTemplate: 'http://localhost:80x/f'}\n",
        r"spec.urlPathTemplate: port '80x' of 'http://localhost:80x/f' is not a number",
    ),
    (
        "kind: io.statefun.endpoints.v2/http\n"
        "spec: {functions: a/*, urlPathTemplate: 'ftp://localhost/f'}\n",
        r"spec.urlPathTemplate: expected an http\(s\) URL",
    ),
    (
        "kind: io.statefun.kafka.v1/ingress\nspec: {id: a/b, address: k:9092, topics: 5}\n",
        r"spec.topics: expected a list of topics",
    ),
    (
        "kind: io.pystatefun.file.v1/ingress\nspec: {id: a/b, path: {x: 1}}\n",
        r"spec.path: expected a file path, got a mapping",
    ),
    ("kind: io.pystatefun.stdout.v1/egress\nspec: {id: nons}\n", r"spec.id: expected a typename"),
]


@pytest.mark.parametrize(("text", "message"), BAD_MODULES)
def test_a_bad_module_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "module.yaml").write_text(text)
    result = statefun(["run", "module.yaml"], tmp_path)
    line = one_line_error(result, 2, "module.yaml")
    assert re.search(message, line), line


def test_a_module_file_that_is_a_folder_without_one(tmp_path: Path) -> None:
    result = statefun(["run", str(tmp_path)], tmp_path)
    one_line_error(result, 2, "module.yaml: module file not found")


def test_a_module_file_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_bytes(b"kind: \xff\xfe\n")
    result = statefun(["run", "module.yaml"], tmp_path)
    one_line_error(result, 2, "module.yaml: cannot read module file")


def test_an_embedded_module_that_does_not_import(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec: {functions: a/*, module: nope.py:fns}\n"
    )
    result = statefun(["run", "module.yaml"], tmp_path)
    one_line_error(result, 2, "nope.py")


def test_an_embedded_module_that_raises_on_import(tmp_path: Path) -> None:
    (tmp_path / "fns.py").write_text("raise RuntimeError('broken at import')\n")
    (tmp_path / "module.yaml").write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec: {functions: a/*, module: fns.py:fns}\n"
    )
    result = statefun(["run", "module.yaml"], tmp_path)
    one_line_error(result, 2, "fns.py", "broken at import")


def test_a_file_ingress_without_its_file(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(
        "kind: io.pystatefun.file.v1/ingress\nspec: {id: a/in, path: missing.jsonl}\n"
    )
    result = statefun(["run", "module.yaml"], tmp_path)
    one_line_error(result, 2, "ingress a/in", "missing.jsonl")


# -- files too large (RLIMIT_FSIZE: the kernel refuses to grow a file past it) ----------------

ECHO_FNS = """
from statefun import *
functions = StatefulFunctions()

@functions.bind("app/echo")
def echo(context, message):
    context.send_egress(egress_message_builder("app/out", "x" * 200, StringType))
"""
FILE_PIPELINE = """
kind: io.pystatefun.endpoints.v1/embedded
spec: {{functions: app/*, module: fns.py:functions}}
---
kind: io.pystatefun.file.v1/ingress
spec: {{id: app/in, path: in.jsonl}}
---
kind: io.pystatefun.file.v1/egress
spec: {{id: app/out, path: out/out.jsonl, deliverySemantic: {semantic}}}
"""


def limit_file_size(size: int) -> object:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def file_pipeline(tmp: Path, semantic: str, lines: int) -> None:
    (tmp / "fns.py").write_text(ECHO_FNS)
    (tmp / "module.yaml").write_text(FILE_PIPELINE.format(semantic=semantic))
    records = (f'{{"target": "app/echo", "id": "{i}", "value": "v"}}\n' for i in range(lines))
    (tmp / "in.jsonl").write_text("".join(records))


def test_a_file_egress_past_the_file_size_limit(tmp_path: Path) -> None:
    file_pipeline(tmp_path, "at-least-once", 200)
    result = statefun(["run", "module.yaml"], tmp_path, preexec=limit_file_size(8192))
    one_line_error(
        result, 1, "egress app/out", f"cannot write {tmp_path / 'out' / 'out.jsonl'}", "too large"
    )


def test_a_checkpoint_past_the_file_size_limit(tmp_path: Path) -> None:
    """The exactly-once egress's records ride in the checkpoint, whose file grows too large."""
    file_pipeline(tmp_path, "exactly-once", 2000)
    result = statefun(
        ["run", "module.yaml", "--set", "checkpoint_dir=chk", "--set", "restart_strategy=none"],
        tmp_path,
        preexec=limit_file_size(65536),
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    # one line per event: the job's error (and why it stopped), or the command's error
    assert lines and all(
        " ERROR " in line or line.startswith("statefun run: error: ") for line in lines
    ), lines
    assert re.search(r"file too large: chk/chk-\d+/\S+\.msgpack", result.stderr), lines


# -- other commands and hosts ----------------------------------------------------------------


def test_an_ingress_host_that_does_not_resolve(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(
        "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/h, port: 0, host: nowhere.invalid}\n"
    )
    result = statefun(["run", "module.yaml"], tmp_path)
    one_line_error(result, 1, "ingress a/h: cannot listen on nowhere.invalid:0")


@pytest.mark.parametrize(
    ("args", "command", "message"),
    [
        (["send", "a/b/c", "x", "--url", "notaurl"], "send", "--url 'notaurl' is not an http"),
        (
            ["send", "a/b/c", "x", "--url", "http://127.0.0.1:99999"],
            "send",
            "--url 'http://127.0.0.1:99999': the port is not a number 0-65535",
        ),
        (
            ["savepoint", "create", "--admin-url", "notaurl"],
            "savepoint",
            "--admin-url 'notaurl' is not an http",
        ),
    ],
)
def test_a_bad_url_option(tmp_path: Path, args: list[str], command: str, message: str) -> None:
    result = statefun(args, tmp_path)
    one_line_error(result, 2, message, command=command)
