"""Run a document's blocks in order, as a reader would type them.

Shell blocks run in bash with ``-e -o pipefail`` (a failing command fails the block), each in
a process group of its own; the working directory a block ends in is where the next one
starts (so ``cd hello`` carries over, as in a terminal). Python blocks are fed to the Python
on ``PATH`` (``./.venv/bin/python`` where the current directory has one: a clone) on its
standard input, in the current directory. Background blocks run until
``stop`` or the end of the document; so does anything a block leaves running (``cmd &``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs._markdown import PYTHON, SHELL, Block, Document

__all__ = ["DocumentFailed", "DocumentRun"]

DEFAULT_TIMEOUT_S = 120.0
STOP_GRACE_S = 20.0

# A command that runs until stopped, at the start of a line and not sent to the background.
_LONG_RUNNING = re.compile(
    r"^\s*(?:\S*/)?(?:statefun\s+(?:run|serve|kafka\s+start)\b|make\s+run\b|\S*run\.sh\b)"
)


class DocumentFailed(AssertionError):
    """A block of a document failed: names the document, the line and shows the output."""


@dataclass
class _Group:
    """A process group started for a block (its leader may have exited already)."""

    pgid: int
    process: subprocess.Popen[bytes]
    label: str
    log: Path
    background: bool
    text: str


@dataclass
class DocumentRun:
    document: Document
    workdir: Path
    scratch: Path  # outside the working directory: logs, the current directory's record
    env: dict[str, str]
    display: str  # the document's name in messages
    groups: list[_Group] = field(default_factory=list)
    _count: int = 0

    def run(self) -> None:
        _blocks_hear_sigint()
        try:
            for block in self.document.blocks:
                for selector in block.stop_before:
                    self.stop(selector)
                if block.runnable:
                    self.run_block(block)
        except BaseException:
            self.stop(report=False)  # the first failure is the one to see
            raise
        self.stop()

    # -- blocks ------------------------------------------------------------------------------

    def _where(self, block: Block) -> str:
        return f"{self.display}:{block.line}"

    def _fail(self, block: Block, what: str, log: Path | None = None) -> DocumentFailed:
        output = ""
        if log is not None and log.exists():
            text = log.read_text(encoding="utf-8", errors="replace")
            output = "\n--- output ---\n" + text[-6000:]
        return DocumentFailed(
            f"{self._where(block)}: {what}\n--- block ---\n{block.text.rstrip()}{output}"
        )

    def run_block(self, block: Block) -> None:
        self._count += 1
        if "file" in block.options:
            target = self.workdir / block.options["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a" if "append" in block.words else "w", encoding="utf-8") as out:
                out.write(("\n\n" if "append" in block.words else "") + block.text)
            return
        timeout = float(block.options.get("timeout", DEFAULT_TIMEOUT_S))
        log = self.scratch / f"block-{self._count}.log"
        if block.language in PYTHON:
            # In a clone, the project's virtualenv (a plain Python there would import the
            # source folder statefun/ instead of the package); elsewhere the one on PATH.
            local = self.workdir / ".venv" / "bin" / "python"
            argv = [str(local) if local.exists() else "python", "-"]
            stdin_text: bytes | None = block.text.encode("utf-8")
        else:
            assert block.language in SHELL
            if "background" not in block.words:
                for line in block.text.splitlines():
                    if _LONG_RUNNING.match(line) and not line.rstrip().endswith("&"):
                        raise self._fail(
                            block,
                            "this command runs until stopped: annotate the block with "
                            '<!-- doctest: background, ready="..." -->',
                        )
            record = self.scratch / "cwd"
            script = block.text
            if "background" not in block.words:
                script += f'\npwd > "{record}"\n'
            argv = ["bash", "-e", "-o", "pipefail", "-c", script]
            stdin_text = None
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        background = "background" in block.words
        self.groups.append(
            _Group(process.pid, process, self._where(block), log, background, block.text)
        )
        if background:
            self._wait_ready(block, process, log, block.options["ready"], timeout)
            return
        try:
            if stdin_text is not None:
                assert process.stdin is not None
                process.stdin.write(stdin_text)
                process.stdin.close()
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal(process.pid, signal.SIGKILL)
            process.wait()
            raise self._fail(block, f"still running after {timeout:.0f} s", log) from None
        if code != 0:
            raise self._fail(block, f"exit code {code}", log)
        expected = block.options.get("expect")
        if expected is not None and expected not in log.read_text(errors="replace"):
            raise self._fail(block, f"the output does not show {expected!r}", log)
        if block.language in SHELL:
            record = self.scratch / "cwd"
            if record.exists():
                self.workdir = Path(record.read_text(encoding="utf-8").strip())

    def _wait_ready(
        self, block: Block, process: subprocess.Popen[bytes], log: Path, ready: str, timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = process.poll()  # before the log: all it wrote is in the log once it ended
            if ready in log.read_text(encoding="utf-8", errors="replace"):
                return
            if code is not None:
                raise self._fail(block, f"ended (exit code {code}) before showing {ready!r}", log)
            if time.monotonic() > deadline:
                raise self._fail(block, f"did not show {ready!r} within {timeout:.0f} s", log)
            time.sleep(0.1)

    # -- stopping ----------------------------------------------------------------------------

    @staticmethod
    def _signal(pgid: int, signum: int) -> bool:
        """Signal the group; False when no process of it is left."""
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:  # a zombie leader on some systems; the group is gone
            return False
        return True

    def stop(self, selector: str = "", report: bool = True) -> None:
        """Stop the process groups started so far whose block contains ``selector`` (all by
        default): SIGINT (a graceful stop), then SIGKILL after a grace period. ``report``: fail
        if a background block had ended by itself with an error."""
        groups = [g for g in self.groups if selector in g.text]
        self.groups = [g for g in self.groups if g not in groups]
        early = [g for g in groups if g.background and g.process.poll() not in (None, 0)]
        for group in groups:
            self._signal(group.pgid, signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_S
        for group in groups:
            while time.monotonic() < deadline:
                group.process.poll()  # reap the leader, so the group can vanish
                if not self._signal(group.pgid, 0):
                    break
                time.sleep(0.1)
            else:
                self._signal(group.pgid, signal.SIGKILL)
                group.process.wait()
        if early and report:
            group = early[0]
            text = group.log.read_text(encoding="utf-8", errors="replace")[-6000:]
            raise DocumentFailed(
                f"{group.label}: the background command ended by itself with exit code "
                f"{group.process.returncode}\n--- output ---\n{text}"
            )


def _blocks_hear_sigint() -> None:
    """A shell cannot trap a signal that was ignored when it started, and a command started
    in the background by a non-interactive shell (``make test &`` in a script) ignores SIGINT,
    as does everything it starts: a background block would not hear its graceful stop. So
    blocks inherit SIGINT's default instead (a handler set here is reset by ``exec``)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def prepare_clone(repo: Path, target: Path, with_venv: bool = True) -> None:
    """A copy of the repository's files (tracked and new, not ignored), with its .venv.

    The build inputs the Makefile checks get an old time, so that ``make`` finds the shared
    .venv up to date and never reinstalls it from the copy.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = repo / name
        if not source.is_file():
            continue  # deleted in the working tree
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    for path in (
        target / "pyproject.toml",
        target / "setup.py",
        *target.glob("sdk/_proto/*.proto"),
    ):
        if path.is_file():
            os.utime(path, (0, 0))
    if with_venv and (repo / ".venv" / ".installed").exists():
        (target / ".venv").symlink_to(repo / ".venv")
