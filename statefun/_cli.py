"""The ``statefun`` command line.

Every subcommand is one ``Command``: a name, a one-line help, a function that adds its
arguments to its parser and a function that runs it and returns the exit code. Add one by
writing the two functions and appending a ``Command`` to ``COMMANDS``.

Exit codes: 0 success, 1 failure while running (also: a port in use, an unreachable Kafka),
2 wrong usage (arguments, settings, a bad TARGET or module file), 130 interrupted. Every
error is one line on standard error: ``statefun COMMAND: error: what is wrong, and where``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from statefun.checkpoint import verify as _verify
from statefun.runtime import _dead_letter_commands as _dead_letters
from statefun.runtime import _state_commands as _state

__all__ = ["COMMANDS", "Command", "UsageError", "main"]

log = logging.getLogger("statefun.cli")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"
LOG_LEVELS = ("debug", "info", "warning", "error")


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default, unless its help says it already or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or not (action.option_strings or action.nargs in ("?", "*"))
        ):
            return action.help
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help (and its subcommands' help) shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pystatefun")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class UsageError(Exception):
    """The command line asks for something that cannot work; exit code 2, one-line message."""


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _say(text: str) -> None:
    """User-facing output of a command (stdout)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _complain(command: str, text: str) -> None:
    """A one-line error message for the user (stderr)."""
    prefix = f"statefun {command}" if command else "statefun"
    sys.stderr.write(f"{prefix}: error: {text}\n")
    sys.stderr.flush()


# -- shared argument helpers ---------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def byte_size(text: str) -> int:
    """A positive number of bytes: ``1048576``, ``512k``, ``32MiB``, ``1g`` (binary units)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 1048576, 32MiB)")
    size = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if size <= 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return size


def port_number(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0-65535")
    return port


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError("the number of seconds must be 0 or more")
    return seconds


def count_at_least_one(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def load_object(target: str) -> Any:
    """The object named by ``package.module:attribute`` or ``file.py:attribute``."""
    from statefun._imports import ImportTargetError
    from statefun._imports import load_object as load

    try:
        return load(target)
    except ImportTargetError as exc:
        raise UsageError(str(exc)) from None


# -- statefun serve ------------------------------------------------------------------------


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="package.module:attribute naming a StatefulFunctions or a RequestReplyHandler",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=port_number, default=8000, help="0 picks a free port (default: %(default)s)"
    )
    parser.add_argument(
        "--path", default="/statefun", help="URL path of the functions (default: %(default)s)"
    )
    parser.add_argument(
        "--max-body-size",
        type=byte_size,
        default=None,
        metavar="BYTES",
        help="largest request body accepted, e.g. 1048576 or 32MiB (default: 32MiB)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight requests may still run (default: 30)",
    )
    _serve_defence_arguments(parser)


def _serve_defence_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on every request but GET /health (else "
        "401); prefer --token-file or the environment variable STATEFUN_SERVE_TOKEN, which "
        "other users of the machine cannot read off the process list",
    )
    parser.add_argument(
        "--token-file", default=None, metavar="PATH", help="read the bearer token from a file"
    )
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS: certificate")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's key")
    parser.add_argument(
        "--tls-client-ca",
        default=None,
        metavar="PEM",
        help="require client certificates signed by a CA in this file (mutual TLS)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a Host name requests may carry (repeatable; '*': any). Default: loopback names "
        "when bound to a loopback address, any name otherwise",
    )
    parser.add_argument(
        "--max-connections",
        type=count_at_least_one,
        default=None,
        metavar="N",
        help="open connections in all (default: 1024)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=count_at_least_one,
        default=None,
        metavar="N",
        help="open connections from one client address (default: 512)",
    )


def _serve_defences(args: argparse.Namespace) -> dict[str, Any]:
    """The token, TLS context and server options the serve flags ask for."""
    import os

    from statefun._http.defences import ServerOptions, read_token, server_tls_context

    options: dict[str, Any] = {}
    try:
        if args.token is not None and args.token_file is not None:
            raise ValueError("--token and --token-file: give one")
        if args.token_file is not None:
            options["token"] = read_token(file=args.token_file, where="--token-file")
        elif args.token is not None or os.environ.get("STATEFUN_SERVE_TOKEN"):
            token = args.token if args.token is not None else os.environ["STATEFUN_SERVE_TOKEN"]
            options["token"] = token.strip()
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if args.tls_client_ca is not None and args.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        if args.tls_cert is not None:
            options["tls"] = server_tls_context(
                args.tls_cert, args.tls_key, args.tls_client_ca, where="serve"
            )
        options["options"] = ServerOptions().with_(
            allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
            max_connections=args.max_connections,
            max_connections_per_client=args.max_connections_per_client,
            token=options.get("token"),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return options


def _serve(args: argparse.Namespace) -> int:
    from statefun import RequestReplyHandler, StatefulFunctions
    from statefun.sdk import _serve

    target = load_object(args.target)
    if not isinstance(target, (StatefulFunctions, RequestReplyHandler)):
        raise UsageError(
            f"{args.target!r} is a {type(target).__name__}, "
            "expected a StatefulFunctions or a RequestReplyHandler"
        )
    if not args.path.startswith("/") or args.path == _serve.HEALTH_PATH:
        raise UsageError(f"--path must start with '/' and not be {_serve.HEALTH_PATH}")
    options: dict[str, Any] = {}
    if args.max_body_size is not None:
        options["max_body_bytes"] = args.max_body_size
    if args.shutdown_timeout is not None:
        options["shutdown_timeout"] = args.shutdown_timeout
    options.update(_serve_defences(args))
    try:
        _serve.serve(target, args.host, args.port, args.path, **options)
    except OSError as exc:
        _complain("serve", f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    return 0


# -- statefun new, settings, kafka ---------------------------------------------------------


def _new_arguments(parser: argparse.ArgumentParser) -> None:
    from statefun import _scaffold

    _scaffold.add_arguments(parser)


def _new(args: argparse.Namespace) -> int:
    from statefun import _scaffold

    try:
        _scaffold.create(args.directory, args.name)
    except _scaffold.ScaffoldError as exc:
        raise UsageError(str(exc)) from None
    _say(_scaffold.next_steps(args.directory, args.name))
    return 0


def _settings_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names", metavar="NAME", nargs="*", help="only these settings (default: all)"
    )


def _settings(args: argparse.Namespace) -> int:
    from statefun._settings import Settings

    described = Settings.describe()
    known = {name for name, _doc, _default in described}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        raise UsageError(
            f"no setting {', '.join(map(repr, unknown))}; `statefun settings` lists them"
        )
    for name, doc, default in described:
        if args.names and name not in args.names:
            continue
        shown = "(none)" if default in ("", None) else str(default)
        _say(f"{name} = {shown}")
        _say(textwrap.fill(doc, width=92, initial_indent="    ", subsequent_indent="    "))
    return 0


def _kafka_arguments(parser: argparse.ArgumentParser) -> None:
    from statefun._kafka_local import _command

    _command.add_arguments(parser)


def _kafka(args: argparse.Namespace) -> int:
    from statefun._kafka_local import _command

    return _command.run(args)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    from statefun.cluster import _command

    _command.add_worker_arguments(parser)


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    from statefun.cluster import _status

    _status.add_status_arguments(parser)


# -- the registry and main -----------------------------------------------------------------


def _runtime_command(
    name: str, module: str = "statefun.runtime._commands"
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        from statefun._exceptions import ConfigurationError, UnavailableError

        try:
            result: int = getattr(importlib.import_module(module), name)(args)
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
        except UnavailableError as exc:
            _complain(name, str(exc))
            return 1
        except OSError as exc:  # the machine refused: a full disk, a file too large...
            from statefun._oserrors import describe

            log.debug("%s", exc, exc_info=exc)
            _complain(name, describe(exc))
            return 1
        return result

    return run


def _runtime_arguments(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(parser: argparse.ArgumentParser) -> None:
        from statefun.runtime import _commands

        getattr(_commands, f"add_{name}_arguments")(parser)

    return add


COMMANDS: list[Command] = [
    Command(
        "run",
        "run a module (module.yaml) until stopped",
        _runtime_arguments("run"),
        _runtime_command("run"),
    ),
    Command(
        "plan",
        "print the job plan of a module, as text or Graphviz DOT",
        _runtime_arguments("plan"),
        _runtime_command("plan"),
    ),
    Command(
        "send",
        "send a message to a function over the HTTP ingress",
        _runtime_arguments("send"),
        _runtime_command("send"),
    ),
    Command(
        "savepoint",
        "create, list or inspect savepoints",
        _runtime_arguments("savepoint"),
        _runtime_command("savepoint"),
    ),
    Command(
        "serve", "serve functions over HTTP (StateFun request-reply)", _serve_arguments, _serve
    ),
    Command("checkpoint", _verify.HELP, _verify.add_arguments, _verify.run),
    Command(
        "new",
        "create a project to start from: a function, its module.yaml, a test, a README",
        _new_arguments,
        _new,
    ),
    Command(
        "settings",
        "list the runtime settings (statefun run --set NAME=VALUE) with defaults",
        _settings_arguments,
        _settings,
    ),
    Command(
        "kafka",
        "a local Kafka broker for development (Java 17+ and Maven needed)",
        _kafka_arguments,
        _kafka,
    ),
    Command("dead-letters", "list, show or replay dead letters", *_dead_letters.COMMAND),
    Command(
        "worker",
        "run one worker of a clustered job on Kafka (docs/guide/cluster.md)",
        _worker_arguments,
        _runtime_command("worker", "statefun.cluster._command"),
    ),
    Command(
        "status",
        "which worker of a clustered job owns which key groups and input partitions",
        _status_arguments,
        _runtime_command("status", "statefun.cluster._status"),
    ),
    Command("state", "the decoded state of an address, the ids of a type", *_state.COMMAND),
]


def _build_parser() -> argparse.ArgumentParser:
    # --log-level works before and after the subcommand; SUPPRESS keeps the subcommand's
    # parser from overwriting a value given before it.
    common = _Parser(add_help=False)
    common.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="log level (default: info)",
    )
    parser = _Parser(
        prog="statefun",
        description="Stateful functions in Python, compatible with Apache Flink StateFun.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"statefun {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name, help=command.help, description=command.help, parents=[common]
        )
        command.add_arguments(sub)
        sub.set_defaults(_command=command)
    return parser


def _configure_logging(level_name: str) -> None:
    level = getattr(logging, level_name.upper())
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    if level > logging.DEBUG:
        # One line per HTTP request is too much unless debugging.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or wrong arguments (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    _configure_logging(getattr(args, "log_level", "info"))
    try:
        return command.run(args)
    except UsageError as exc:
        _complain(command.name, str(exc))
        return 2
    except KeyboardInterrupt:
        _complain(command.name, "interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
