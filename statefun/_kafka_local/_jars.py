"""The local broker's jars, fetched once from Maven Central with the pom beside this module,
and the Java that runs them (``broker.py`` starts the broker)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "MIN_JAVA",
    "POM_ENV",
    "KafkaBrokerError",
    "default_cache_dir",
    "default_pom",
    "ensure_kafka_jars",
    "jars_fetched",
    "java_executable",
    "java_major",
    "kafka_version",
    "missing_tools",
    "require_java",
    "tail",
]

_log = logging.getLogger("statefun._kafka_local.broker")

CACHE_ENV = "PYSTATEFUN_KAFKA_CACHE"
"""Environment variable: the directory that holds (or receives) the broker's jars."""

POM_ENV = "PYSTATEFUN_KAFKA_POM"
"""Environment variable: the pom to fetch the jars with, instead of the one beside this module."""

MIN_JAVA = 17  # Kafka 4.x brokers need Java 17+.
LOG_TAIL_LINES = 60

_MARKER = ".complete"  # written last into the jar directory: the fetch is done
_FETCH_TIMEOUT = 1800.0
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class KafkaBrokerError(RuntimeError):
    """The broker's jars could not be fetched, or the broker could not be started."""


# --------------------------------------------------------------------------------------- jars


def default_pom() -> Path:
    """The pom that lists the broker's jars: ``$PYSTATEFUN_KAFKA_POM`` or the package's own."""
    configured = os.environ.get(POM_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(__file__).resolve().parent / "pom.xml"


def kafka_version(pom: Path | None = None) -> str:
    """The Kafka version the pom fetches (its ``kafka.version`` property)."""
    pom = pom or default_pom()
    try:
        root = ElementTree.parse(pom).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise KafkaBrokerError(f"cannot read the Kafka pom {pom}: {exc}") from exc
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise KafkaBrokerError(f"{pom} has no <kafka.version> property")
    return (node.text or "").strip()


def default_cache_dir(version: str) -> Path:
    """``$PYSTATEFUN_KAFKA_CACHE``, else ``~/.cache/pystatefun/kafka-<version>/libs``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "pystatefun" / f"kafka-{version}" / "libs"


def ensure_kafka_jars(cache_dir: Path | None = None, *, pom: Path | None = None) -> Path:
    """Fetch the broker's jars from Maven Central once; return the directory that holds them.

    ``cache_dir`` defaults to :func:`default_cache_dir`. A marker file, written after the
    last jar, makes later calls return at once; it records a digest of the pom, so editing the
    pom (say, a new Kafka version) fetches again. Concurrent callers wait on a file lock.
    """
    pom = (pom or default_pom()).resolve()
    if not pom.is_file():
        raise KafkaBrokerError(
            f"Kafka pom not found at {pom}; reinstall pystatefun or set ${POM_ENV}"
        )
    version = kafka_version(pom)
    libs = (cache_dir or default_cache_dir(version)).expanduser().resolve()
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    if _fetched(libs, digest):
        return libs

    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaBrokerError(
            "mvn (Apache Maven) is not on PATH; it is needed once to fetch Kafka's jars from "
            "Maven Central (Debian: apt-get install maven)"
        )
    require_java()
    libs.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(libs.parent / f".{libs.name}.lock"):
        if _fetched(libs, digest):  # another process fetched them while we waited
            return libs
        _fetch(mvn, pom, version, libs, digest)
    return libs


def jars_fetched(cache_dir: Path | None = None, *, pom: Path | None = None) -> bool:
    """Whether :func:`ensure_kafka_jars` would return at once (no Maven needed)."""
    pom = (pom or default_pom()).resolve()
    try:
        digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    except OSError:
        return False
    libs = (cache_dir or default_cache_dir(kafka_version(pom))).expanduser().resolve()
    return _fetched(libs, digest)


def missing_tools(*, fetch: bool) -> list[str]:
    """What is missing to run a broker (and, with ``fetch``, to fetch its jars): "java",
    "Java 17+ (found Java N)" or "mvn"; empty when nothing is."""
    missing: list[str] = []
    java = java_executable()
    if java is None:
        missing.append("java")
    else:
        try:
            major = java_major(java)
        except KafkaBrokerError:
            major = 0
        if major < MIN_JAVA:
            missing.append(f"Java {MIN_JAVA}+ (found Java {major or '?'} at {java})")
    if fetch and shutil.which("mvn") is None:
        missing.append("mvn")
    return missing


def _fetched(libs: Path, digest: str) -> bool:
    try:
        return (libs / _MARKER).read_text(encoding="utf-8").strip() == digest
    except OSError:
        return False


def _fetch(mvn: str, pom: Path, version: str, libs: Path, digest: str) -> None:
    _log.info("fetching Kafka %s jars from Maven Central into %s (once)", version, libs)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{libs.name}.fetch-", dir=libs.parent))
    try:
        command = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        _log.debug("running %s", command)
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=_FETCH_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaBrokerError(
                f"mvn did not fetch Kafka's jars within {_FETCH_TIMEOUT:.0f} s"
            ) from exc
        output = done.stdout.decode("utf-8", "replace")
        if done.returncode != 0:
            raise KafkaBrokerError(
                f"mvn failed ({done.returncode}) to fetch Kafka {version}'s jars with {pom}:\n"
                + tail(output)
            )
        jars = sorted(staging.glob("*.jar"))
        if not any(jar.name == f"kafka_2.13-{version}.jar" for jar in jars):
            raise KafkaBrokerError(f"mvn fetched no kafka_2.13-{version}.jar into {staging}")
        libs.mkdir(parents=True, exist_ok=True)
        (libs / _MARKER).unlink(missing_ok=True)
        for old in libs.glob("*.jar"):  # only jars: the directory may be a user's choice
            old.unlink()
        for jar in jars:
            os.replace(jar, libs / jar.name)
        marker = libs / f"{_MARKER}.tmp"
        marker.write_text(digest + "\n", encoding="utf-8")
        os.replace(marker, libs / _MARKER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _log.info(
        "fetched %d Kafka %s jars in %.1f s into %s",
        len(jars),
        version,
        time.monotonic() - started,
        libs,
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------- java


def require_java() -> str:
    java = java_executable()
    if java is None:
        raise KafkaBrokerError(
            f"java is not on PATH (nor in $JAVA_HOME/bin); Kafka 4.x needs Java {MIN_JAVA}+ "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    major = java_major(java)
    if major < MIN_JAVA:
        raise KafkaBrokerError(f"{java} is Java {major}; Kafka 4.x needs Java {MIN_JAVA}+")
    return java


def java_executable() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


@lru_cache(maxsize=8)
def java_major(java: str) -> int:
    try:
        done = subprocess.run(
            [java, "-version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaBrokerError(f"cannot run {java} -version: {exc}") from exc
    text = (done.stderr + done.stdout).decode("utf-8", "replace")
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if found is None:
        raise KafkaBrokerError(f"cannot tell the Java version from `{java} -version`:\n{text}")
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0_392" is Java 8
        major = int(found.group(2))
    return major


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Maven's colours
    return "\n".join(text.rstrip().splitlines()[-lines:])
