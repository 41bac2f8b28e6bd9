"""`statefun new DIR`: the project it writes runs, answers and passes its own test at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import free_port
from tests.integration.test_examples import wait_http

pytestmark = pytest.mark.timeout(120)

STATEFUN = [sys.executable, "-m", "statefun"]


def new(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STATEFUN, "new", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_new_project_passes_its_test_and_answers_a_call(tmp_path: Path) -> None:
    made = new("hello", "--name", "demo/greeter", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "hello"
    assert sorted(p.name for p in project.iterdir()) == [
        "README.md",
        "functions.py",
        "module.yaml",
        "test_functions.py",
    ]
    assert "statefun send demo/greeter/Ada hi --call" in made.stdout
    assert "statefun send demo/greeter/Ada hi --call" in (project / "README.md").read_text()

    # Its test, as a user runs it (pytest's own defaults, not this repository's).
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null", "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "3 passed" in tested.stdout

    # The module, with the HTTP ingress moved to a free port; run from another folder.
    port = free_port()
    module = project / "module.yaml"
    module.write_text(module.read_text().replace("port: 8090", f"port: {port}"))
    runtime = subprocess.Popen(
        [*STATEFUN, "run", "hello/module.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        replies = [
            subprocess.run(
                [
                    *STATEFUN,
                    "send",
                    "demo/greeter/Ada",
                    "hi",
                    "--call",
                    "--url",
                    f"http://127.0.0.1:{port}",
                    "--timeout",
                    "20",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            for _ in range(3)
        ]
    finally:
        runtime.send_signal(signal.SIGTERM)
        out, err = runtime.communicate(timeout=30)
    assert [r.stdout for r in replies] == [
        "Hello Ada! Nice to meet you.\n",
        "Hello Ada for the 2nd time!\n",
        "Hello Ada for the 3rd time!\n",
    ], [r.stderr for r in replies]
    assert runtime.returncode == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["egress"] for r in records] == ["demo/greetings"] * 3
    assert records[2]["value"] == "Hello Ada for the 3rd time!"


def test_new_refuses_a_non_empty_folder_and_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    refused = new("taken", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr == "statefun new: error: taken is not empty; give a new or empty folder\n"
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]

    (tmp_path / "file").write_text("x")
    refused = new("file", cwd=tmp_path)
    assert refused.stderr == "statefun new: error: file is a file; give a new or empty folder\n"

    refused = new("fresh", "--name", "no-slash", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--name 'no-slash' is not NAMESPACE/TYPE" in refused.stderr
    assert not (tmp_path / "fresh").exists()

    (tmp_path / "empty").mkdir()
    assert new("empty", cwd=tmp_path).returncode == 0
    assert (tmp_path / "empty" / "functions.py").is_file()
