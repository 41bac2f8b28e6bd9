"""``statefun state get|list``: the decoded state of an address, the ids of a function type.

Against a running job's admin server (``GET /state/...``, see ``_state_view.py``), or with
``--from PATH`` against a checkpoint or savepoint folder while no job runs (PATH may also be
a ``checkpoint_dir``: its latest complete checkpoint is read). Offline, the snapshot is read
by the backend that wrote it (``state/_registry.py``); ``get`` keeps only the key group of the
address, ``list`` reads the snapshot once and keeps only the ids of the type.

Output is the admin server's JSON, or with ``--format table`` one line per state value (or
per id).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from statefun._exceptions import ConfigurationError
from statefun._keygroups import key_group_for
from statefun.runtime._state_view import MAX_LIMIT, describe_address

__all__ = ["COMMAND", "add_arguments", "run"]


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer 1-{MAX_LIMIT}, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = actions.add_parser("get", help="the state of one address, decoded")
    get.add_argument("address", metavar="NAMESPACE/TYPE/ID", help="e.g. shop/cart/dave")
    listing = actions.add_parser("list", help="the ids of a function type that hold state")
    listing.add_argument("typename", metavar="NAMESPACE/TYPE", help="e.g. shop/cart")
    listing.add_argument("--after", default=None, help="start after this id (the last `next`)")
    listing.add_argument(
        "--limit", type=_limit, default=100, help="ids per page (default: %(default)s)"
    )
    for sub in (get, listing):
        source = sub.add_mutually_exclusive_group()
        source.add_argument(
            "--admin-url",
            default="http://127.0.0.1:8091",
            help="a running job's admin server (setting admin_port; default: %(default)s)",
        )
        source.add_argument(
            "--from",
            dest="from_path",
            metavar="PATH",
            default=None,
            help="read a checkpoint or savepoint folder (or a checkpoint_dir's latest) instead",
        )
        sub.add_argument(
            "--format", choices=("json", "table"), default="json", help="default: %(default)s"
        )


def _split(text: str, parts: int) -> tuple[str, str | None]:
    """(typename, id) of ``ns/type/id`` (parts 3) or (typename, None) of ``ns/type``."""
    pieces = text.split("/")
    if len(pieces) < parts or not all(pieces[-parts:]):
        shape = "NAMESPACE/TYPE/ID" if parts == 3 else "NAMESPACE/TYPE"
        raise ConfigurationError(f"expected {shape}, got {text!r}")
    if parts == 3:
        return "/".join(pieces[:-1]), pieces[-1]
    return text, None


def _url_path(typename: str, id_: str | None) -> str:
    namespace, _, name = typename.rpartition("/")
    segments = [namespace, name] + ([] if id_ is None else [id_])
    return "/".join(urllib.parse.quote(s, safe="") for s in segments)


def _fetch(args: argparse.Namespace, path: str) -> Any:
    """The JSON at ``path`` on the admin server; None for a 404 (no state)."""
    base = args.admin_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ConfigurationError(f"--admin-url must be an http:// URL, got {args.admin_url!r}")
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and path.startswith("/state/"):
            return None
        reason = exc.read().decode("utf-8", errors="replace").strip()
        raise ConfigurationError(f"{base}{path}: HTTP {exc.code}: {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigurationError(f"cannot reach the admin server {base}: {exc}") from None


def _snapshot(path_text: str) -> tuple[Path, dict[str, Any], int]:
    """(state folder, state manifest, max_parallelism) of a checkpoint or savepoint."""
    from statefun.checkpoint.storage import METADATA, CheckpointStorage, read_checkpoint

    path = Path(path_text)
    if not (path / METADATA).is_file() and path.is_dir():
        latest = CheckpointStorage(path).latest()
        if latest is None:
            raise ConfigurationError(f"{path} holds no complete checkpoint or savepoint")
        path = latest.path
    checkpoint = read_checkpoint(path)
    manifest = checkpoint.metadata.get("state")
    if not isinstance(manifest, dict):
        raise ConfigurationError(f"{path} holds no state")
    return checkpoint.path / "state", manifest, int(checkpoint.metadata["max_parallelism"])


def _get_offline(args: argparse.Namespace, typename: str, id_: str) -> Any:
    from statefun.state._registry import read_snapshot

    folder, manifest, max_p = _snapshot(args.from_path)
    key_group = key_group_for(typename, id_, max_p)
    for _group, key, values in read_snapshot(folder, manifest, [key_group]):
        if key == (typename, id_) and values:
            return describe_address(typename, id_, key_group, values)
    return None


def _list_offline(args: argparse.Namespace, typename: str) -> dict[str, Any]:
    from statefun.state._registry import read_snapshot

    folder, manifest, max_p = _snapshot(args.from_path)
    after = args.after
    start = (0, "") if after is None else (key_group_for(typename, after, max_p), after)
    # One pass over the snapshot (a reader per key group would read it whole each time).
    found = sorted(
        (key_group, key[1])
        for key_group, key, values in read_snapshot(folder, manifest, None)
        if key[0] == typename and values and (key_group, key[1]) > start
    )
    ids = [id_ for _group, id_ in found[: args.limit]]
    more = len(found) > args.limit
    return {"typename": typename, "ids": ids, "next": ids[-1] if more else None}


def _table_of_state(found: dict[str, Any]) -> str:
    lines = [f"{found['address']}  (key group {found['key_group']})"]
    for name, value in found["values"].items():
        expires = value.get("expires_at_ms")
        tail = "" if expires is None else f"  expires_at_ms={expires}"
        if value.get("expired"):
            tail += " (expired)"
        shown = json.dumps(value["value"], ensure_ascii=False)
        lines.append(f"  {name:<20} {shown}  [{value['typename']}, {value['encoding']}]{tail}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The command; a bad address, an unreachable server or an unreadable checkpoint is one
    line on stderr (exit code 2)."""
    try:
        return _run(args)
    except ConfigurationError as exc:
        sys.stderr.write(f"statefun state: error: {exc}\n")
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.action == "get":
        typename, id_ = _split(args.address, 3)
        assert id_ is not None
        if args.from_path is not None:
            found = _get_offline(args, typename, id_)
        else:
            found = _fetch(args, f"/state/{_url_path(typename, id_)}")
        if found is None:
            sys.stderr.write(f"statefun state: no state for {typename}/{id_}\n")
            return 1
        text = _table_of_state(found) if args.format == "table" else json.dumps(found, indent=2)
        sys.stdout.write(text + "\n")
        return 0
    typename = _split(args.typename, 2)[0]
    if args.from_path is not None:
        page = _list_offline(args, typename)
    else:
        query = urllib.parse.urlencode(
            {"limit": args.limit, **({} if args.after is None else {"after": args.after})}
        )
        page = _fetch(args, f"/state/{_url_path(typename, None)}?{query}")
    if args.format == "table":
        lines = list(page["ids"])
        if page["next"] is not None:
            lines.append(f"(more: --after {page['next']})")
        sys.stdout.write("".join(f"{line}\n" for line in lines))
    else:
        sys.stdout.write(json.dumps(page, indent=2) + "\n")
    return 0


COMMAND = (add_arguments, run)
