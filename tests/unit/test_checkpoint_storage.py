"""Checkpoint storage: metadata checksums, and pruning that skips damaged checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statefun._exceptions import CheckpointDamagedError, ConfigurationError
from statefun.checkpoint.storage import CheckpointStorage, read_checkpoint


def complete(storage: CheckpointStorage, checkpoint_id: int) -> Path:
    folder = storage.begin(checkpoint_id)
    storage.finish(folder, {"format": 3, "id": checkpoint_id, "files": {}})
    return folder


def test_pruning_keeps_the_retained_intact_checkpoints(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path, retained=2)
    storage.prepare()
    for checkpoint_id in (1, 2, 3):
        complete(storage, checkpoint_id)
    storage.damaged.add("chk-000003")  # found damaged at the last restore
    complete(storage, 4)
    storage.prune()
    # 2 and 4 are the intact ones kept; 3 is newer than 2, so it stays for now.
    assert [p.name for p in storage.candidates()] == ["chk-000004", "chk-000003", "chk-000002"]
    complete(storage, 5)
    storage.prune()
    assert [p.name for p in storage.candidates()] == ["chk-000005", "chk-000004"]
    assert storage.damaged == set()


def test_metadata_checks_itself(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    storage.prepare()
    folder = complete(storage, 1)
    assert read_checkpoint(folder).id == 1
    metadata = json.loads((folder / "_metadata").read_text())
    metadata["files"] = {"x": [1, 2]}
    (folder / "_metadata").write_text(json.dumps(metadata))
    with pytest.raises(CheckpointDamagedError, match=r"_metadata: checksum mismatch"):
        read_checkpoint(folder)
    (folder / "_metadata").write_bytes(b'{"id": 1')
    with pytest.raises(CheckpointDamagedError, match=r"_metadata: not valid JSON"):
        read_checkpoint(folder)
    with pytest.raises(ConfigurationError, match="not a complete checkpoint"):
        read_checkpoint(tmp_path / "chk-000009")
