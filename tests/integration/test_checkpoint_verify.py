"""``statefun checkpoint verify PATH``: one line per checkpoint, exit code 1 if any is damaged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from statefun._cli import main
from statefun.checkpoint.storage import SELF_CHECKSUM, read_checkpoint
from tests.integration.test_checkpoints import embedded, make_job, write_input
from tests.integration.test_damaged_checkpoints import flip, truncate

pytestmark = pytest.mark.timeout(120)


async def checkpoints_of_a_run(tmp: Path, backend: str = "memory") -> list[Path]:
    write_input(tmp / "in.jsonl", ids=20, per_id=500)
    state = {"state_backend": backend, "state_dir": str(tmp / "state")}
    await make_job(tmp, embedded(), **state).run()
    folders = sorted((tmp / "checkpoints").glob("chk-*"))
    assert len(folders) >= 2
    return folders


def verify(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, list[str], str]:
    code = main(["checkpoint", "verify", *map(str, paths)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
async def test_intact_checkpoints_verify(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = await checkpoints_of_a_run(tmp_path, backend)
    code, lines, _ = verify(capsys, tmp_path / "checkpoints")
    assert code == 0
    assert len(lines) == len(folders)
    for folder, line in zip(folders, lines, strict=True):
        assert line.startswith(f"{folder}: ok (")
        assert "match their checksums" in line
    assert "20 address(es) with state" in lines[-1]


async def test_a_damaged_checkpoint_is_named_with_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = await checkpoints_of_a_run(tmp_path)
    flip(folders[-1] / "state" / "state.msgpack")
    truncate(folders[0] / "cut.msgpack")
    code, lines, _ = verify(capsys, tmp_path / "checkpoints")
    assert code == 1
    assert lines[0].startswith(f"{folders[0]}: damaged: cut.msgpack: ")
    assert "truncated or changed" in lines[0]
    assert lines[-1].startswith(f"{folders[-1]}: damaged: state/state.msgpack: checksum mismatch")
    assert all(": ok (" in line for line in lines[1:-1])
    # One folder on its own.
    code, lines, _ = verify(capsys, folders[-1])
    assert code == 1 and len(lines) == 1


async def test_a_checkpoint_without_checksums_is_checked_by_decoding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checkpoints written before checksums (format 2) still verify and restore."""
    folder = (await checkpoints_of_a_run(tmp_path))[-1]
    metadata = json.loads((folder / "_metadata").read_text())
    for key in ("files", "checksum", SELF_CHECKSUM):
        del metadata[key]
    metadata["format"] = 2
    (folder / "_metadata").write_text(json.dumps(metadata))
    code, lines, _ = verify(capsys, folder)
    assert code == 0 and "no checksums" in lines[0]
    state = folder / "state" / "state.msgpack"
    state.write_bytes(b"\xc1" * state.stat().st_size)  # the size the manifest says
    code, lines, _ = verify(capsys, folder)
    assert code == 1
    assert lines[0].startswith(f"{folder}: damaged: state/state.msgpack: does not decode")
    assert read_checkpoint(folder).metadata["format"] == 2


def test_nothing_to_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "chk-000007").mkdir()  # a checkpoint a crash left half-written
    code, lines, err = verify(capsys, tmp_path)
    assert code == 1
    assert lines == [f"{tmp_path / 'chk-000007'}: incomplete (no _metadata): never restored"]
    assert err == f"statefun checkpoint verify: no checkpoint or savepoint in {tmp_path}\n"
    code, lines, err = verify(capsys, tmp_path / "missing")
    assert code == 1 and err.count("\n") == 1 and "is not a directory" in err


async def test_the_command_line(tmp_path: Path) -> None:
    folders = await checkpoints_of_a_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "statefun", "checkpoint", "verify", str(folders[-1])],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{folders[-1]}: ok (")
