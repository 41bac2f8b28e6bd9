"""The runtime's subcommands of ``statefun``: run, plan, send."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statefun._exceptions import ConfigurationError, JobFailedError

if TYPE_CHECKING:  # (imported where used: the CLI starts fast)
    from statefun._settings import Settings
    from statefun.module._specs import ModuleSpec

__all__ = [
    "add_plan_arguments",
    "add_run_arguments",
    "add_savepoint_arguments",
    "add_send_arguments",
    "admin_request",
    "plan",
    "run",
    "savepoint",
    "send",
]

log = logging.getLogger("statefun.cli")


def _check_http_url(option: str, url: str) -> None:
    """A one-line ConfigurationError unless ``url`` is http(s)://host[:port]/..."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"{option} {url!r}: the port is not a number 0-65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise ConfigurationError(f"{option} {url!r} is not an http(s) URL such as {_EXAMPLE}")


_EXAMPLE = "http://127.0.0.1:8090"


def _settings_overrides(pairs: list[str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"--set expects name=value, got {pair!r}")
        overrides[name.strip()] = value.strip()
    return overrides


def _module_arguments(parser: argparse.ArgumentParser, what: str = "to run") -> None:
    parser.add_argument(
        "modules",
        metavar="MODULE_YAML",
        nargs="*",
        default=["module.yaml"],
        help=f"the module.yaml file(s) {what}, read together as one module "
        "(default: ./module.yaml)",
    )
    parser.add_argument(
        "--parallelism",
        type=int,
        default=None,
        help="dispatcher subtasks (default: the setting parallelism, 2)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a runtime setting; `statefun settings` lists them all; repeatable",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    _module_arguments(parser, "to run")
    parser.add_argument(
        "--from-savepoint",
        metavar="PATH",
        default=None,
        help="start from this savepoint (or checkpoint) folder; the parallelism may differ",
    )
    parser.add_argument(
        "--allow-dropping-state",
        action="store_true",
        help="start even if the savepoint holds state of function types the module lost",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="run N worker processes of a clustered job on Kafka, restarting one that dies "
        "(needs cluster.bootstrap_servers and cluster.job_id; docs/guide/cluster.md); "
        "default: one process without Kafka",
    )

    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        action="store_true",
        help="print a progress line to stderr every progress_interval_ms (10 s), even when "
        "stderr is not a terminal (on a terminal it is printed anyway)",
    )
    shown.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line, and log warnings and errors only (unless --log-level says)",
    )
    parser.add_argument(
        "--insecure-admin",
        action="store_true",
        help="let the admin server listen beyond loopback (admin_host) without admin_token",
    )


def admin_request(url: str, method: str = "GET") -> urllib.request.Request:
    """A request to a job's admin server, carrying the bearer token of the setting
    ``admin_token`` (``PYSTATEFUN_ADMIN_TOKEN``) when it is set."""
    request = urllib.request.Request(url, method=method)
    token = os.environ.get("PYSTATEFUN_ADMIN_TOKEN", "").strip()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    _module_arguments(parser, "to plan")
    parser.add_argument(
        "--format",
        choices=("text", "dot"),
        default="text",
        help="text to read, or Graphviz DOT to draw (statefun plan --format dot | dot -Tsvg)",
    )


def _load(args: argparse.Namespace) -> tuple[ModuleSpec, Settings]:
    from statefun._settings import Settings
    from statefun.module import load_module

    overrides = _settings_overrides(args.settings)
    if args.parallelism is not None:
        overrides["parallelism"] = str(args.parallelism)
    if getattr(args, "insecure_admin", False):
        overrides["admin_insecure"] = "true"
    settings = Settings.load(overrides)
    module = load_module(*[Path(m) for m in args.modules])
    return module, settings


def plan(args: argparse.Namespace) -> int:
    from statefun.runtime._functions import FunctionRegistry
    from statefun.runtime._plan import make_plan

    module, settings = _load(args)
    FunctionRegistry(module)  # embedded code is found, as by run
    job_plan = make_plan(module, settings)
    text = job_plan.to_dot() if args.format == "dot" else job_plan.to_text()
    sys.stdout.write(text + "\n")
    return 0


def _check_folders(settings: Settings) -> None:
    """The folders the job will write: each usable, or a one-line ConfigurationError."""
    from statefun._oserrors import usable_directory
    from statefun.checkpoint.storage import storage_path

    if settings.checkpoint_dir:
        usable_directory("checkpoint_dir", storage_path(settings.checkpoint_dir))
        for name in ("savepoint_dir", "http_wal_dir"):
            if getattr(settings, name):
                usable_directory(name, Path(getattr(settings, name)))
    if settings.state_backend == "rocksdb":
        usable_directory("state_dir", Path(settings.state_dir))


def run(args: argparse.Namespace) -> int:
    from statefun.runtime._plan import build_job, make_plan

    module, settings = _load(args)
    if args.workers:
        from statefun.cluster._supervisor import supervise

        if args.from_savepoint:  # the job's changelog seeded once, before any worker runs
            from statefun.cluster._savepoints import seed_savepoint_argument

            seed_savepoint_argument(module, settings, args)
        pairs = list(args.settings)
        if args.parallelism is not None:
            pairs.append(f"parallelism={args.parallelism}")
        return supervise(module, settings, args.modules, pairs, args.workers)
    _check_folders(settings)
    if args.quiet and not hasattr(args, "log_level"):
        logging.getLogger().setLevel(logging.WARNING)
    progress = not args.quiet and (args.progress or sys.stderr.isatty())
    log.info(
        "module: %d endpoint(s), %d ingress(es), %d egress(es) from %s",
        len(module.endpoints),
        len(module.ingresses),
        len(module.egresses),
        ", ".join(str(p) for p in module.paths) or "-",
    )
    job_plan = make_plan(module, settings)
    log.info("plan: %s", job_plan.summary())
    for line in job_plan.functions:
        log.info("functions: %s", line)
    if settings.checkpoint_dir:
        log.info(
            "checkpoints: every %d ms to %s",
            settings.checkpoint_interval_ms,
            settings.checkpoint_dir,
        )
    else:
        log.info("checkpoints: off (set checkpoint_dir for exactly-once across restarts)")
    from_savepoint = Path(args.from_savepoint) if args.from_savepoint else None
    from statefun.runtime._restarts import RestartPolicy

    restarts = RestartPolicy(settings)
    while True:
        job = build_job(module, settings)
        job.restore_from = from_savepoint
        job.allow_dropping_state = args.allow_dropping_state
        restarts.started()
        try:
            asyncio.run(_run_until_signalled(job, progress))
            return 0
        except JobFailedError as exc:
            log.error("%s", exc)
            if not settings.checkpoint_dir or job.stopped_by_user:
                return 1
            delay, what = restarts.failed()
            if delay is None:
                log.error("not restarting: %s", what)
                return 1
        except asyncio.CancelledError:
            return 130
        log.warning("restart %s, in %.1f s, from the last checkpoint", what, delay)
        time.sleep(delay)
        from_savepoint = None  # restarts resume from the latest checkpoint


async def _print_progress(job: Any) -> None:
    """One progress line to stderr per ``progress_interval_ms`` (the CLI's output for people,
    not logging)."""
    from statefun.runtime import _progress

    interval = job.settings.progress_interval_ms / 1000
    before = _progress.take(job)
    while True:
        await asyncio.sleep(interval)
        now = _progress.take(job)
        sys.stderr.write(f"statefun: {_progress.line(before, now)}\n")
        sys.stderr.flush()
        before = now


async def _run_until_signalled(job: Any, progress: bool = False) -> None:
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        job.stopped_by_user = True
        if signals == 1:
            log.info("%s: stopping gracefully (again to stop at once)", signal.Signals(signum).name)
            job.stop()
        else:
            log.warning("stopping at once")
            for task in asyncio.all_tasks(loop):
                task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    printer = loop.create_task(_print_progress(job)) if progress else None
    try:
        await job.run()
    finally:
        if printer is not None:
            printer.cancel()


# -- savepoints ----------------------------------------------------------------------------


def add_savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="take a savepoint of a running job")
    create.add_argument(
        "--admin-url",
        default="http://127.0.0.1:8091",
        help="the job's admin server (setting admin_port; default: %(default)s); the bearer "
        "token of PYSTATEFUN_ADMIN_TOKEN is sent when set",
    )
    create.add_argument(
        "--cluster",
        action="store_true",
        help="instead: write the savepoint of a stopped clustered job from its Kafka topics "
        "(MODULE_YAML, --set cluster.bootstrap_servers=... --set cluster.job_id=...)",
    )
    _module_arguments(create, "of the clustered job (with --cluster)")
    create.add_argument(
        "--dir",
        metavar="DIR",
        default=None,
        help="with --cluster: where the savepoint goes (default: savepoint_dir, else "
        ".statefun/savepoints)",
    )
    listing = actions.add_parser(
        "list", help="list the savepoints and checkpoints in a folder and its subfolders"
    )
    listing.add_argument(
        "directory",
        metavar="DIR",
        help="a folder holding savepoints or checkpoints, e.g. .statefun or a checkpoint_dir",
    )
    inspect = actions.add_parser("inspect", help="describe one savepoint or checkpoint")
    inspect.add_argument(
        "path",
        metavar="PATH",
        help="a savepoint or checkpoint folder (one with a _metadata file), as `list` prints",
    )


def savepoint(args: argparse.Namespace) -> int:
    from statefun.checkpoint.storage import METADATA, read_checkpoint

    if args.action == "create" and args.cluster:  # from a stopped clustered job's topics
        from statefun.cluster._savepoint_export import export_command

        module, settings = _load(args)
        sys.stdout.write(f"{export_command(module, settings, args.dir)}\n")
        return 0
    if args.action == "create":
        _check_http_url("--admin-url", args.admin_url)
        request = admin_request(f"{args.admin_url.rstrip('/')}/savepoints", "POST")
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode("utf-8", errors="replace").strip()
            sys.stderr.write(f"statefun savepoint: HTTP {exc.code}: {reason}\n")
            return 1
        except (urllib.error.URLError, OSError) as exc:
            sys.stderr.write(f"statefun savepoint: cannot reach {args.admin_url}: {exc}\n")
            return 1
        sys.stdout.write(f"{answer['path']}\n")
        return 0
    if args.action == "list":
        root = Path(args.directory)
        if not root.is_dir():
            raise ConfigurationError(f"{root} is not a directory")
        found = _checkpoint_folders(root, METADATA)
        if not found:
            sys.stdout.write(f"no savepoints or checkpoints in {root} or its subfolders\n")
        for folder in found:
            meta = read_checkpoint(folder).metadata
            kind = "savepoint " if meta.get("savepoint") else "checkpoint"
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta["created_ms"] / 1000))
            sys.stdout.write(f"{kind} {meta['id']:>6}  {created}  {folder}\n")
        return 0
    checkpoint = read_checkpoint(Path(args.path))
    sys.stdout.write(json.dumps(_describe(checkpoint), indent=2) + "\n")
    return 0


def _checkpoint_folders(root: Path, metadata: str, depth: int = 4) -> list[Path]:
    """The complete checkpoint and savepoint folders in ``root`` or below it (up to ``depth``
    levels; a checkpoint's own subfolders are not searched), sorted by path."""
    if (root / metadata).is_file():
        return [root]
    if depth == 0:
        return []
    found: list[Path] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    for child in children:
        found.extend(_checkpoint_folders(child, metadata, depth - 1))
    return found


def _describe(checkpoint: Any) -> dict[str, Any]:
    """Metadata plus what the state holds, per function type."""
    from statefun.state.memory import MemoryStateBackend

    meta = dict(checkpoint.metadata)
    state = MemoryStateBackend()
    state.restore(checkpoint.path / "state", meta["state"], None)
    per_type: dict[str, int] = {}
    for key_group in state.key_groups():
        for (typename, _id), _values in state.items(key_group):
            per_type[typename] = per_type.get(typename, 0) + 1
    meta["addresses_with_state"] = dict(sorted(per_type.items()))
    meta["path"] = str(checkpoint.path)
    return meta


def add_send_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", metavar="ADDRESS", help="namespace/type/id of the function")
    parser.add_argument("value", metavar="VALUE", help="the message (text)")
    parser.add_argument(
        "--typename",
        default=None,
        help="the value's typename (default: io.statefun.types/string); a built-in type's "
        "text form is parsed, e.g. --typename io.statefun.types/int 42",
    )
    parser.add_argument(
        "--url", default="http://127.0.0.1:8090", help="the HTTP ingress (default: %(default)s)"
    )
    parser.add_argument(
        "--call", action="store_true", help="wait for the function's reply and print it"
    )
    parser.add_argument("--timeout", type=float, default=35.0, help="seconds to wait")
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        default=None,
        help="send an Idempotency-Key header: sending again with the same KEY is answered "
        "with the first outcome instead of being processed twice",
    )


def send(args: argparse.Namespace) -> int:
    parts = args.address.split("/")
    if len(parts) != 3 or not all(parts):
        raise ConfigurationError(f"ADDRESS {args.address!r} must look like namespace/type/id")
    _check_http_url("--url", args.url)
    quoted = "/".join(urllib.parse.quote(p, safe="") for p in parts)
    url = f"{args.url.rstrip('/')}/{'call' if args.call else 'messages'}/{quoted}"
    if args.typename:
        url += "?" + urllib.parse.urlencode({"typename": args.typename})
    request = urllib.request.Request(
        url,
        data=args.value.encode("utf-8"),
        headers={"Content-Type": "text/plain; charset=utf-8"},
        method="POST",
    )
    if args.idempotency_key is not None:
        request.add_header("Idempotency-Key", args.idempotency_key)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            body = response.read().decode("utf-8", errors="replace")
            sys.stdout.write((body if args.call else f"{response.status} {body.strip()}") + "\n")
            return 0
    except urllib.error.HTTPError as exc:
        reason = exc.read().decode("utf-8", errors="replace").strip()
        sys.stderr.write(f"statefun send: HTTP {exc.code}: {reason}\n")
        return 1
    except (urllib.error.URLError, OSError) as exc:
        sys.stderr.write(f"statefun send: cannot reach {args.url}: {exc}\n")
        return 1
