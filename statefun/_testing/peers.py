"""Virtualenvs holding peer StateFun SDKs, for wire-compatibility tests and benchmarks.

A *peer* is another Python SDK for StateFun's request-reply protocol, installed from PyPI into
a virtualenv of its own (its protobuf pin may clash with ours):

- ``statefun-3.3.0``: the official ``apache-flink-statefun==3.3.0``. It pins ``protobuf<4``;
  protobuf 3.20.3 is the last such release and installs on Python 3.11 as its pure-Python
  wheel (no C extension is built for 3.11, which the SDK does not need).
- ``flink-statefun-3.5.0``: ``flink-statefun==3.5.0``, a fork of the official SDK whose
  generated code runs on current protobuf (the upb C implementation).

``ensure_peer_venv(name)`` builds the virtualenv once and returns its python executable.
Virtualenvs are cached under ``<repo>/.cache/peers/<name>/`` (or ``$PYSTATEFUN_PEERS_DIR/<name>/``).
A marker file, written last, says a virtualenv is complete and with which requirements; a lock
file serializes processes that build the same peer at the same time.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["PEERS", "PeerError", "ensure_peer_venv", "peers_dir"]

logger = logging.getLogger(__name__)

#: name -> pip requirements of the peer's virtualenv.
PEERS: dict[str, tuple[str, ...]] = {
    "statefun-3.3.0": ("apache-flink-statefun==3.3.0", "protobuf==3.20.3", "aiohttp>=3.9"),
    "flink-statefun-3.5.0": ("flink-statefun==3.5.0", "aiohttp>=3.9"),
}

_MARKER = ".pystatefun-peer.json"
_INSTALL_TIMEOUT_S = 900.0
_IMPORT_CHECK = (
    "import aiohttp, statefun, statefun.request_reply_pb2; "
    "statefun.RequestReplyHandler(statefun.StatefulFunctions)"
)


class PeerError(RuntimeError):
    """A peer virtualenv could not be built."""


def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def peers_dir() -> Path:
    """Where peer virtualenvs are cached."""
    configured = os.environ.get("PYSTATEFUN_PEERS_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    root = _repo_root()
    if root is not None:
        return root / ".cache" / "peers"
    return Path.home() / ".cache" / "pystatefun" / "peers"


def _python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _marker_matches(venv: Path, requirements: tuple[str, ...]) -> bool:
    marker = venv / _MARKER
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("requirements") == list(requirements)
        and _python_of(venv).exists()
    )


def _run(args: list[str], what: str, cwd: Path) -> None:
    # Run from the cache folder with PYTHONPATH unset, so that this project's own `statefun`
    # package (on sys.path through the current folder) can never shadow the peer's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_INSTALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerError(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise PeerError(f"{what} failed with exit code {done.returncode}:\n{tail}")
    logger.info("%s: done in %.1f s", what, time.monotonic() - started)


def _build(name: str, venv: Path, requirements: tuple[str, ...]) -> None:
    if venv.exists():
        logger.info("peer %s: removing the incomplete virtualenv %s", name, venv)
        shutil.rmtree(venv)
    logger.info("peer %s: creating a virtualenv in %s", name, venv)
    cwd = venv.parent
    _run([sys.executable, "-m", "venv", str(venv)], f"peer {name}: python -m venv", cwd)
    python = str(_python_of(venv))
    logger.info("peer %s: installing %s", name, " ".join(requirements))
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            *requirements,
        ],
        f"peer {name}: pip install",
        cwd,
    )
    _run(
        [python, "-I", "-c", _IMPORT_CHECK],
        f"peer {name}: import check",
        cwd,
    )
    marker = venv / _MARKER
    partial = marker.with_suffix(".tmp")
    partial.write_text(
        json.dumps({"name": name, "requirements": list(requirements)}), encoding="utf-8"
    )
    os.replace(partial, marker)  # written last: the virtualenv is complete


def ensure_peer_venv(name: str) -> Path:
    """Return the python executable of the cached virtualenv of peer ``name``, built if needed."""
    try:
        requirements = PEERS[name]
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {sorted(PEERS)}") from None
    base = peers_dir()
    venv = base / name
    if _marker_matches(venv, requirements):
        return _python_of(venv)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{name}.lock", "a+b") as lock:
        logger.info("peer %s: waiting for the lock %s", name, lock.name)
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            # Another process may have built it while this one waited.
            if not _marker_matches(venv, requirements):
                _build(name, venv, requirements)
            else:
                logger.info("peer %s: built meanwhile by another process", name)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    logger.info("peer %s: ready at %s", name, venv)
    return _python_of(venv)
