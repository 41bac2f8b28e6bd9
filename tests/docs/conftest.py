"""The documents' commands run against the package as a user installs it: a wheel built from
this checkout, installed with its dependencies into a fresh virtualenv (once per session)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs._runner import prepare_clone

REPO = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "docs: runs the commands of the README, the examples and the guide"
    )


@dataclass(frozen=True)
class Installed:
    """A virtualenv with the package installed from its wheel."""

    venv: Path
    wheels: Path  # the folder with the wheel (pip's find-links for the documents)

    def env(self) -> dict[str, str]:
        """The environment of a reader who activated that virtualenv.

        ``pip install`` finds the package in the wheel folder and nothing on an index, so a
        document's ``pip install pystatefun`` installs this checkout's wheel, never another.
        """
        inherited = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("PYSTATEFUN_", "PYTEST_", "PYTHON", "VIRTUAL_ENV", "PIP_"))
        }
        project_bin = (REPO / ".venv" / "bin").resolve()
        path = [
            entry
            for entry in inherited.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if entry and Path(entry).resolve() != project_bin
        ]
        return {
            **inherited,
            "PATH": os.pathsep.join([str(self.venv / "bin"), *path]),
            "VIRTUAL_ENV": str(self.venv),
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(self.wheels),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
        }


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise AssertionError(
            f"{what} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``pip wheel --no-deps`` of a copy of the checkout, installed in a new virtualenv."""
    root = tmp_path_factory.mktemp("pip-user")
    source, wheels, venv = root / "source", root / "wheels", root / "venv"
    prepare_clone(REPO, source, with_venv=False)
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        "building the wheel",
    )
    (wheel,) = wheels.glob("pystatefun-*.whl")
    _run([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv")
    # With its dependencies from the package index, as `pip install pystatefun` would; pytest
    # too, for the documents' `python -m pytest` (they say to install it).
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel), "pytest"],
        "installing the wheel",
    )
    return Installed(venv, wheels)
