"""The Restate peer (bench/peers/restate/): install it, run it, stop it.

* :func:`install` puts the Restate server (the npm package ``@restatedev/restate-server``, a
  native binary per platform) and a virtualenv with the Python SDK ``restate-sdk`` and
  ``hypercorn`` into the peer cache (``<repo>/.cache/peers`` or ``$PYSTATEFUN_PEERS_DIR``, as
  statefun/_testing/peers.py): ``restate-server-<version>/`` and ``restate-sdk-<version>/``.
  A marker file written last says an install is complete; a lock file serializes processes
  that install the same thing at the same time.
* :func:`running` starts, in a fresh temporary folder, the server (every listener on
  127.0.0.1, free ports, its data in the folder, telemetry off) and the counter service
  (bench/peers/restate/counter.py under hypercorn), registers the service with the server's
  admin API and yields a :class:`Restate` once the ingress answers calls to the counter; on
  exit it stops both (SIGTERM, then SIGKILL) and deletes the folder.

    .venv/bin/python bench/_restate_processes.py    # install, run, print the URLs; Ctrl-C stops
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import http.client
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import free_port, progress  # noqa: E402
from statefun._testing.peers import peers_dir  # noqa: E402

PEER_DIR = ROOT / "bench" / "peers" / "restate"
SERVER_VERSION = "1.7.12"
SDK_VERSION = "1.3.0"
SERVER_PACKAGE = "@restatedev/restate-server"
SDK_REQUIREMENTS = (f"restate-sdk=={SDK_VERSION}", "hypercorn==0.18.0")
HOST = "127.0.0.1"
_MARKER = ".pystatefun-peer.json"
_INSTALL_TIMEOUT_S = 900.0
_PR_SET_PDEATHSIG = 1


class RestateUnavailableError(RuntimeError):
    """The Restate peer cannot be installed here (no npm, or a package is not to be had)."""


def missing_restate_tools() -> str | None:
    """Why the Restate peer cannot be installed here (None: npm is on PATH)."""
    if shutil.which("npm") is None:
        return "npm not on PATH: the Restate server is installed from the npm package"
    if platform.system() not in ("Linux", "Darwin"):
        return f"the npm package of the Restate server has no binary for {platform.system()}"
    return None


def _run(args: list[str], what: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
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
        raise RestateUnavailableError(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RestateUnavailableError(f"{what} failed with exit code {done.returncode}:\n{tail}")
    return done.stdout


def _complete(folder: Path, what: list[str]) -> bool:
    try:
        recorded = json.loads((folder / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("installed") == what


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    base = peers_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{name}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _mark(folder: Path, what: list[str]) -> None:
    partial = folder / (_MARKER + ".tmp")
    partial.write_text(json.dumps({"installed": what}), encoding="utf-8")
    os.replace(partial, folder / _MARKER)  # written last: the install is complete


def _server_binary(prefix: Path) -> Path:
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system(), "?")
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), "?"
    )
    package = f"restate-server-{system}-{machine}"
    return prefix / "node_modules" / "@restatedev" / package / "bin" / "restate-server"


def install_server() -> Path:
    """The Restate server binary from npm, installed into the peer cache if need be."""
    reason = missing_restate_tools()
    if reason is not None:
        raise RestateUnavailableError(reason)
    name = f"restate-server-{SERVER_VERSION}"
    prefix = peers_dir() / name
    what = [f"{SERVER_PACKAGE}@{SERVER_VERSION}"]
    if _complete(prefix, what) and _server_binary(prefix).exists():
        return _server_binary(prefix)
    with _locked(name):
        if not (_complete(prefix, what) and _server_binary(prefix).exists()):
            shutil.rmtree(prefix, ignore_errors=True)
            prefix.mkdir(parents=True)
            progress(f"  installing {what[0]} from npm into {prefix}")
            # --ignore-scripts: the package's only install script is a download counter
            _run(
                [
                    "npm",
                    "install",
                    "--prefix",
                    str(prefix),
                    "--no-audit",
                    "--no-fund",
                    "--ignore-scripts",
                    "--no-save",
                    what[0],
                ],
                "npm install",
                prefix,
            )
            if not _server_binary(prefix).exists():
                raise RestateUnavailableError(
                    f"npm installed no server binary for {platform.system()} "
                    f"{platform.machine()} (looked for {_server_binary(prefix)})"
                )
            _mark(prefix, what)
    return _server_binary(prefix)


def install_sdk() -> Path:
    """The python of a virtualenv with restate-sdk and hypercorn, built in the peer cache."""
    name = f"restate-sdk-{SDK_VERSION}"
    venv = peers_dir() / name
    python = venv / "bin" / "python"
    what = list(SDK_REQUIREMENTS)
    if _complete(venv, what) and python.exists():
        return python
    with _locked(name):
        if not (_complete(venv, what) and python.exists()):
            shutil.rmtree(venv, ignore_errors=True)
            venv.parent.mkdir(parents=True, exist_ok=True)
            progress(f"  installing {' '.join(what)} into {venv}")
            _run([sys.executable, "-m", "venv", str(venv)], "python -m venv", venv.parent)
            _run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-input",
                    *what,
                ],
                "pip install",
                venv.parent,
            )
            _run([str(python), "-I", "-c", "import restate, hypercorn"], "import check", venv)
            _mark(venv, what)
    return python


def install() -> tuple[Path, Path]:
    """Both parts of the peer: (the server binary, the SDK virtualenv's python)."""
    return install_server(), install_sdk()


def server_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


@dataclass
class Restate:
    """A running Restate server with the counter service registered."""

    ingress_url: str
    admin_url: str
    server_pid: int
    service_pid: int
    folder: Path


def _request(url: str, data: bytes | None = None, timeout: float = 5.0) -> bytes:
    """GET ``url``, or POST ``data`` (JSON; an empty body goes without a Content-Type)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if data else {}
        method = "GET" if data is None else "POST"
        connection.request(method, parts.path, body=data, headers=headers)
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    if answer.status >= 300:
        raise ValueError(f"{method} {url}: {answer.status} {body[:300]!r}")
    return body


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the process that started it dies, so
    that a killed benchmark leaves no server behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _start(command: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_")}
    env.pop("PYTHONPATH", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: hypercorn forks a worker
            preexec_fn=_die_with_parent if platform.system() == "Linux" else None,
        )


def _stop(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # a worker left behind


def _tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _until(what: str, check: Callable[[], bool], deadline_s: float, *logs: Path) -> None:
    deadline = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException, ValueError) as exc:
            last = exc
        time.sleep(0.1)
    tails = "\n".join(f"--- {log.name}:\n{_tail(log)}" for log in logs)
    raise RuntimeError(f"Restate: {what} within {deadline_s:.0f} s (last error: {last})\n{tails}")


def _server_config(folder: Path, node: int, admin: int, ingress: int) -> str:
    return (
        f'base-dir = "{folder / "data"}"\n'
        "disable-telemetry = true\n"
        "log-disable-ansi-codes = true\n"
        'listen-mode = "tcp"\n'
        f'bind-address = "{HOST}:{node}"\n'
        f'advertised-address = "http://{HOST}:{node}/"\n'
        "[admin]\n"
        f'bind-address = "{HOST}:{admin}"\n'
        f'advertised-admin-endpoint = "http://{HOST}:{admin}/"\n'
        "disable-web-ui = true\n"
        "[ingress]\n"
        f'bind-address = "{HOST}:{ingress}"\n'
        f'advertised-ingress-endpoint = "http://{HOST}:{ingress}/"\n'
    )


@contextlib.contextmanager
def running(server: Path, python: Path) -> Iterator[Restate]:
    """Start the server and the counter service in a fresh folder; see the module docstring."""
    folder = Path(tempfile.mkdtemp(prefix="restate-peer-"))
    node, admin, ingress, service = free_port(), free_port(), free_port(), free_port()
    config = folder / "restate.toml"
    config.write_text(_server_config(folder, node, admin, ingress), encoding="utf-8")
    server_log, service_log = folder / "restate-server.log", folder / "counter.log"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(
            _start([str(server), "--config-file", str(config), "--no-logo"], server_log, folder)
        )
        processes.append(
            _start(
                [
                    str(python),
                    "-m",
                    "hypercorn",
                    "--config",
                    str(PEER_DIR / "hypercorn.toml"),
                    "--bind",
                    f"{HOST}:{service}",
                    "counter:app",
                ],
                service_log,
                PEER_DIR,
            )
        )
        admin_url, ingress_url = f"http://{HOST}:{admin}", f"http://{HOST}:{ingress}"

        def alive() -> None:
            for process, log in zip(processes, (server_log, service_log), strict=True):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"Restate: {log.stem} exited with {process.returncode}:\n{_tail(log)}"
                    )

        def admin_up() -> bool:
            alive()
            return bool(_request(f"{admin_url}/health", timeout=1) is not None)

        _until("the admin API did not answer", admin_up, 60, server_log)
        registration = json.dumps({"uri": f"http://{HOST}:{service}"}).encode()

        def registered() -> bool:
            alive()
            return b"Counter" in _request(f"{admin_url}/deployments", registration)

        _until("the counter service was not registered", registered, 60, server_log, service_log)

        def callable_() -> bool:
            alive()
            body = _request(f"{ingress_url}/Counter/ready/get", b"", timeout=2)
            return body.strip() == b"0"

        _until("the ingress did not answer calls", callable_, 60, server_log, service_log)
        yield Restate(ingress_url, admin_url, processes[0].pid, processes[1].pid, folder)
    finally:
        for process in reversed(processes):
            _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    def stop(signum: int, frame: object) -> None:
        for name in (signal.SIGINT, signal.SIGTERM):  # a second one must not cut the clean-up
            signal.signal(name, signal.SIG_IGN)
        raise KeyboardInterrupt

    for name in (signal.SIGINT, signal.SIGTERM):  # the processes are stopped, data deleted
        signal.signal(name, stop)
    with contextlib.suppress(KeyboardInterrupt):
        server, python = install()
        progress(f"{server_version(server)}; restate-sdk {SDK_VERSION} in {python.parent.parent}")
        with running(server, python) as restate:
            print(f"ingress: {restate.ingress_url}  (POST /Counter/{{key}}/add, .../get)")
            print(f"admin:   {restate.admin_url}")
            print(f"data:    {restate.folder}  (deleted on exit)", flush=True)
            while True:
                signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
