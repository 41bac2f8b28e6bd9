"""Every command of the README, the examples' READMEs and the user guide runs as written.

Each document's shell and Python blocks run in order (see ``_markdown`` for the annotations a
document carries, ``_runner`` for how blocks run) against a wheel of this checkout installed
in a fresh virtualenv (``statefun``, ``python`` and ``pip`` on PATH are that virtualenv's).
The README and the examples' READMEs run in a copy of the repository with its ``.venv``, so
their ``make run`` and ``.venv/bin/statefun`` are the clone's; the guide runs in an empty
folder, as a user who installed the package has nothing else. Documents run one at a time:
they use the README's fixed ports (8000, 8090, 8091, 9092).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.docs._markdown import parse
from tests.docs._runner import DocumentRun, prepare_clone
from tests.docs.conftest import REPO, Installed

DOCUMENTS = sorted(
    [
        REPO / "README.md",
        *REPO.glob("examples/*/README.md"),
        *REPO.glob("docs/guide/*.md"),
    ]
)


def _default_workdir(path: Path) -> str:
    return "empty" if path.parent == REPO / "docs" / "guide" else "clone"


@pytest.mark.docs
@pytest.mark.timeout(1200)  # the first `statefun kafka start` may fetch Kafka from Maven Central
@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(REPO)) for p in DOCUMENTS])
def test_document_runs_as_written(path: Path, installed: Installed, tmp_path: Path) -> None:
    document = parse(path)
    workdir, scratch = tmp_path / "work", tmp_path / "scratch"
    scratch.mkdir()
    kind = document.options.get("workdir", _default_workdir(path))
    if kind == "clone":
        prepare_clone(REPO, workdir)
    elif kind == "empty":
        workdir.mkdir()
    else:
        raise AssertionError(f"{path}: workdir must be 'clone' or 'empty', not {kind!r}")
    for name in document.options.get("copy", "").split():
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, workdir / name, dirs_exist_ok=True)
        else:
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, workdir / name)
    display = str(path.relative_to(REPO))
    DocumentRun(document, workdir, scratch, installed.env(), display).run()


@pytest.mark.docs
def test_the_wheel_carries_the_compiled_hot_loops(installed: Installed) -> None:
    """A wheel built where a C compiler is (as this one) has the compiled hot loops, and the
    installed runtime uses them."""
    code = "from statefun._compiled import hot_loops; print(hot_loops is not None)"
    python = installed.venv / "bin" / "python"
    result = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        env=installed.env(),
        cwd=installed.venv,
        check=True,
    )
    assert result.stdout.strip() == "True", result.stderr
