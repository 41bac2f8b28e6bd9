"""``statefun worker``: one worker of a clustered job (see docs/guide/cluster.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from statefun._exceptions import ConfigurationError, JobFailedError

__all__ = ["HELP", "add_worker_arguments", "worker"]

log = logging.getLogger("statefun.cli")

HELP = "run one worker of a clustered job (Kafka: --set cluster.bootstrap_servers=...)"


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    from statefun.runtime._commands import _module_arguments

    _module_arguments(parser, "to run (the same in every worker of the job)")
    _seed_arguments(parser)


def _seed_arguments(parser: argparse.ArgumentParser) -> None:
    """``statefun worker``'s savepoint options (``statefun run`` has its own, the same);
    ``_savepoints.py`` is imported only when one is given (a worker starts fast)."""
    parser.add_argument(
        "--from-savepoint",
        metavar="PATH",
        default=None,
        help="seed the job's state from this savepoint (or checkpoint) folder, once: a job "
        "with state of its own is refused; one seeded from the same savepoint goes on",
    )
    parser.add_argument(
        "--allow-dropping-state",
        action="store_true",
        help="seed even if the savepoint holds state of function types the module lost",
    )


def worker(args: argparse.Namespace) -> int:
    from statefun._settings import Settings
    from statefun.cluster._config import cluster_config
    from statefun.cluster._support import check_clusterable
    from statefun.cluster._worker import ClusterWorker
    from statefun.module import load_module
    from statefun.runtime._commands import _settings_overrides

    overrides = _settings_overrides(args.settings)
    if args.parallelism is not None:
        overrides["parallelism"] = str(args.parallelism)
    settings = Settings.load(overrides)
    config = cluster_config(settings)
    if config is None:
        raise ConfigurationError(
            "statefun worker needs --set cluster.bootstrap_servers=HOST:PORT and "
            "--set cluster.job_id=NAME (or PYSTATEFUN_CLUSTER_BOOTSTRAP_SERVERS and "
            "PYSTATEFUN_CLUSTER_JOB_ID)"
        )
    module = load_module(*[Path(m) for m in args.modules])
    check_clusterable(module, settings, from_savepoint=False, bootstrap=config.bootstrap_servers)
    log.info(
        "worker %s of job %s on Kafka %s: %d partition(s), checkpoints every %d ms",
        config.worker_id,
        config.job_id,
        config.bootstrap_servers,
        config.partitions,
        settings.checkpoint_interval_ms,
    )
    if args.from_savepoint:
        from statefun.cluster._savepoints import seed_savepoint_argument

        seed_savepoint_argument(module, settings, args)
    cluster_worker = ClusterWorker(module, settings, config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, cluster_worker.stop)
        await cluster_worker.run()

    try:
        asyncio.run(main())
    except JobFailedError as exc:
        log.error("%s", exc)
        return 1
    return 0
