"""``statefun dead-letters list|show|replay``: look into the dead-letter file, send records back.

* ``list``: one line per record: id, time, target address, value typename, reason.
* ``show ID``: one record whole, as JSON; a value of a built-in type is decoded (``value``),
  any other stays base64 (``value_base64``).
* ``replay ID... | --all``: sends messages back into a running job through its HTTP ingress
  (``POST /messages/<namespace>/<type>/<id>`` with the value's bytes and its typename in
  ``X-Statefun-Typename``), as ``statefun send`` does: once the ingress answers 202 the message
  is durable and will be processed exactly once. Each request carries an ``Idempotency-Key``
  derived from the record, so where the ingress honours it a replay that is run again after
  an interruption sends no record twice. The original caller is not kept (the ingress sends
  from no caller). Records that are not messages (egress records, state values
  moved out of an address, Kafka records without a usable key) are skipped and listed. The
  file is not changed.

Records are named by their ``seq`` (``L<n>``: line ``n`` of a record written without one;
``R...``: in the rotated file ``<path>.1``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from statefun.runtime._deadletters import read_dead_letters

__all__ = ["COMMAND", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="one line per dead letter")
    show = actions.add_parser("show", help="one dead letter whole, its value decoded if built-in")
    show.add_argument("id", metavar="ID", help="a record id, as `list` shows it")
    replay = actions.add_parser(
        "replay", help="send dead letters back into a running job (its HTTP ingress)"
    )
    replay.add_argument("ids", metavar="ID", nargs="*", help="record ids (or --all)")
    replay.add_argument("--all", action="store_true", help="every message in the file")
    replay.add_argument(
        "--url", default="http://127.0.0.1:8090", help="the HTTP ingress (default: %(default)s)"
    )
    replay.add_argument("--timeout", type=float, default=35.0, help="seconds per request")
    for sub in (listing, show, replay):
        sub.add_argument(
            "--file",
            default=None,
            help="the dead-letter file (default: the setting dead_letter_path)",
        )


def _path(args: argparse.Namespace) -> str:
    if args.file:
        return str(args.file)
    from statefun._settings import Settings

    return Settings.load().dead_letter_path


def _error(text: str) -> int:
    sys.stderr.write(f"statefun dead-letters: error: {text}\n")
    return 1


def _when(record: dict[str, Any]) -> str:
    ms = record.get("time_ms")
    if not isinstance(ms, int):
        return "-" * 19
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _what(record: dict[str, Any]) -> str:
    if record.get("target"):
        where = f"{record['target']}/{record.get('id')}"
        return f"{where} state {record['state']!r}" if record.get("state") else where
    if record.get("egress"):
        return f"egress {record['egress']}"
    if record.get("topic") is not None:
        return f"kafka {record['topic']}/{record.get('partition')}@{record.get('offset')}"
    return "-"


def _decoded(record: dict[str, Any]) -> dict[str, Any]:
    from statefun.ingress._records import BUILTIN_TYPES

    shown = dict(record)
    builtin = BUILTIN_TYPES.get(str(record.get("type")))
    if builtin is not None and isinstance(record.get("value_base64"), str):
        try:
            raw = base64.b64decode(record["value_base64"], validate=True)
            shown["value"] = builtin.serializer().deserialize(raw) if raw else None
            del shown["value_base64"]
        except (ValueError, TypeError):
            pass  # not decodable: stays base64
    return shown


def run(args: argparse.Namespace) -> int:
    path = _path(args)
    try:
        records = list(read_dead_letters(path))
    except OSError as exc:
        return _error(f"cannot read {path}: {exc.strerror or exc}")
    if args.action == "list":
        for name, record in records:
            reason = " ".join(str(record.get("reason", "")).split())
            sys.stdout.write(
                f"{name:>6}  {_when(record)}  {_what(record)}  {record.get('type', '-')}  "
                f"{reason}\n"
            )
        return 0
    by_id = dict(records)
    if args.action == "show":
        found = by_id.get(args.id)
        if found is None:
            return _error(f"no dead letter {args.id!r} in {path}")
        sys.stdout.write(json.dumps(_decoded(found), indent=2, ensure_ascii=False) + "\n")
        return 0
    if args.all == bool(args.ids):
        return _error("replay takes record ids or --all (one of the two)")
    if args.all:
        chosen = records
    else:
        missing = [i for i in args.ids if i not in by_id]
        if missing:
            return _error(f"no dead letter {', '.join(missing)} in {path}")
        chosen = [(i, by_id[i]) for i in args.ids]
    return _replay(chosen, args.url, args.timeout)


def _idempotency_key(record: dict[str, Any]) -> str:
    """The same for one record each time it is replayed (its number and time are in it), so an
    ingress that honours ``Idempotency-Key`` takes a replay run again after an interruption
    only once; a new dead letter of the same message is another record, with another key."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()
    return f"dead-letter-{digest[:32]}"


def _replay(chosen: list[tuple[str, dict[str, Any]]], url: str, timeout: float) -> int:
    sent = skipped = 0
    for name, record in chosen:
        target, id_ = record.get("target"), record.get("id")
        parts = str(target or "").split("/")
        if record.get("state") or not id_ or len(parts) != 2 or not all(parts):
            sys.stdout.write(f"{name}: skipped, not a message ({_what(record)})\n")
            skipped += 1
            continue
        try:
            body = base64.b64decode(str(record.get("value_base64", "")), validate=True)
        except ValueError:
            sys.stdout.write(f"{name}: skipped, its value_base64 is not base64\n")
            skipped += 1
            continue
        quoted = "/".join(urllib.parse.quote(p, safe="") for p in (*parts, str(id_)))
        request = urllib.request.Request(
            f"{url.rstrip('/')}/messages/{quoted}",
            data=body,
            headers={
                "Content-Type": "application/octet-stream",
                "X-Statefun-Typename": str(record.get("type", "")),
                "Idempotency-Key": _idempotency_key(record),
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode("utf-8", errors="replace").strip()
            return _error(
                f"{name}: HTTP {exc.code}: {reason} ({sent} replayed before it, {skipped} skipped)"
            )
        except (urllib.error.URLError, OSError) as exc:
            return _error(f"cannot reach {url}: {exc} ({sent} replayed, {skipped} skipped)")
        sent += 1
    sys.stdout.write(f"replayed {sent}, skipped {skipped}\n")
    return 0


#: the arguments and the action of ``statefun dead-letters`` (for the command registry)
COMMAND = (add_arguments, run)
