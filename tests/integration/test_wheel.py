"""The built wheel, installed on its own: what `pip install pystatefun` users get has the
local Kafka broker's pom, the package metadata `--version` reads, and a working `new`."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_installed_wheel_has_the_kafka_pom_and_the_cli_works(tmp_path: Path) -> None:
    dist, site = tmp_path / "dist", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (wheel,) = dist.glob("pystatefun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "statefun/_kafka_local/pom.xml" in names
    assert "statefun/sdk/_proto/request_reply_pb2.py" in names
    assert not any(name.startswith(("scripts/", "tests/", "examples/")) for name in names)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        check=True,
        timeout=120,
        capture_output=True,
    )
    # The installed copy comes first on the path (the dependencies are this interpreter's);
    # run from elsewhere, so that nothing of the repository is found by accident.
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PYSTATEFUN_KAFKA_POM", None)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import statefun; from statefun._kafka_local import broker; "
            "print(statefun.__file__); print(broker.default_pom()); print(broker.kafka_version())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert probe[0].startswith(str(site))
    assert probe[1] == str(site / "statefun" / "_kafka_local" / "pom.xml")
    assert probe[2].count(".") == 2

    def statefun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "statefun", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert statefun("--version").stdout == f"statefun {version('pystatefun')}\n"
    assert statefun("new", "proj").returncode == 0
    assert (tmp_path / "proj" / "test_functions.py").is_file()
    assert "checkpoint_dir = (none)" in statefun("settings").stdout
