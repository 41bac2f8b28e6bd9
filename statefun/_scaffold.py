"""``statefun new DIR``: a project to start from, runnable and tested as it is.

It writes four files into a new (or empty) folder: ``functions.py`` (a greeter that counts
how often it greeted each id and replies to its caller), ``module.yaml`` (the function
embedded in the runtime, an HTTP ingress on 127.0.0.1:8090 and a stdout egress, so
``statefun run`` needs no other process), ``test_functions.py`` (pytest; runs the function
in-process with the test kit, ``statefun.testing.FunctionHarness``, as the runtime runs it)
and a ``README.md`` with the commands.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

__all__ = ["DEFAULT_NAME", "ScaffoldError", "add_arguments", "create", "next_steps"]

DEFAULT_NAME = "example/greeter"
_NAME = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")


class ScaffoldError(Exception):
    """The project cannot be written there, or with that name (a one-line reason)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", type=Path, help="a new or empty folder")
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        metavar="NAMESPACE/TYPE",
        help="the function's typename",
    )


def _split(name: str) -> tuple[str, str]:
    match = _NAME.match(name)
    if match is None:
        raise ScaffoldError(
            f"--name {name!r} is not NAMESPACE/TYPE (letters, digits, '.', '_', '-'; one '/')"
        )
    return match.group(1), match.group(2)


def create(directory: Path, name: str = DEFAULT_NAME) -> list[Path]:
    """Write the project into ``directory`` (new or empty); the files written."""
    namespace, type_ = _split(name)
    if directory.exists():
        if not directory.is_dir():
            raise ScaffoldError(f"{directory} is a file; give a new or empty folder")
        if any(directory.iterdir()):
            raise ScaffoldError(f"{directory} is not empty; give a new or empty folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for filename, template in _FILES.items():
            path = directory / filename
            text = template.replace("NAMESPACE", namespace).replace("TYPENAME", type_)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise ScaffoldError(f"cannot write into {directory}: {exc.strerror or exc}") from None
    return written


def next_steps(directory: Path, name: str = DEFAULT_NAME) -> str:
    """What to run next (printed by ``statefun new``)."""
    return (
        f"created {directory}/: {', '.join(_FILES)}\n"
        f"  statefun run {directory / 'module.yaml'}\n"
        f"  statefun send {name}/Ada hi --call      # from another terminal\n"
        f"  python -m pytest {directory}             # pip install pytest first"
    )


_FUNCTIONS = '''\
"""A stateful function: it greets each id it is called for and counts the greetings.

Every id of NAMESPACE/TYPENAME is its own instance with its own state (``seen``). A greeting
goes to the caller when there is one (``statefun send ... --call`` waits for it) and to the
egress NAMESPACE/greetings in any case. Only the names of StateFun's Python SDK are used, so
the file runs on Apache StateFun's SDK too.
"""

from statefun import *

functions = StatefulFunctions()


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def greeting(name: str, seen: int) -> str:
    if seen == 1:
        return f"Hello {name}! Nice to meet you."
    return f"Hello {name} for the {ordinal(seen)} time!"


@functions.bind(typename="NAMESPACE/TYPENAME", specs=[ValueSpec(name="seen", type=IntType)])
def greet(context: Context, message: Message) -> None:
    seen = (context.storage.seen or 0) + 1
    context.storage.seen = seen
    text = greeting(context.address.id, seen)
    if context.caller is not None:
        context.send(
            message_builder(
                target_typename=context.caller.typename,
                target_id=context.caller.id,
                str_value=text,
            )
        )
    context.send_egress(
        egress_message_builder(
            target_typename="NAMESPACE/greetings", value=text, value_type=StringType
        )
    )
'''

_MODULE = """\
# The function runs inside the runtime (embedded); messages come in over HTTP on
# 127.0.0.1:8090 (statefun send) and greetings are printed as JSON lines.
#   statefun run module.yaml
#   statefun send NAMESPACE/TYPENAME/Ada hi --call
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: NAMESPACE/*
  module: functions.py:functions
---
kind: io.pystatefun.http.v1/ingress
spec:
  id: NAMESPACE/http
  port: 8090
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: NAMESPACE/greetings
"""

_TEST = '''\
"""Tests of functions.py with the test kit (statefun.testing): the function runs in this
process as the runtime runs it, with no sockets and a virtual clock; what it did comes back
as plain Python values.
"""

from functions import functions

from statefun.testing import EgressRecord, FunctionHarness

GREETER = "NAMESPACE/TYPENAME"


def test_first_greeting_goes_to_the_caller_and_counts() -> None:
    harness = FunctionHarness(functions)
    outcome = harness.call(GREETER, "Ada", "hi")  # as `statefun send ... --call` does
    assert outcome.reply == "Hello Ada! Nice to meet you."
    assert harness.state(GREETER, "Ada") == {"seen": 1}


def test_later_greetings_use_ordinals(statefun_harness) -> None:
    harness = statefun_harness(functions)  # the pytest plugin's fixture
    harness.set_state(GREETER, "Ada", seen=2)
    assert harness.call(GREETER, "Ada", "hi").reply == "Hello Ada for the 3rd time!"
    harness.set_state(GREETER, "Ada", seen=10)
    assert harness.call(GREETER, "Ada", "hi").reply == "Hello Ada for the 11th time!"


def test_without_a_caller_the_greeting_goes_to_the_egress_only() -> None:
    outcome = FunctionHarness(functions).send(GREETER, "Bob", "hi")
    assert outcome.messages == [] and outcome.replies == []
    assert outcome.egress_records == [
        EgressRecord("NAMESPACE/greetings", "Hello Bob! Nice to meet you.")
    ]
'''

_README = """\
# NAMESPACE/TYPENAME

A stateful function made with `statefun new`: [`functions.py`](functions.py) greets each id
it is called for and counts how often it did (its state `seen`);
[`module.yaml`](module.yaml) runs it inside the runtime with an HTTP ingress on
127.0.0.1:8090 and prints every greeting.

Run it, from this folder:

```sh
statefun run module.yaml
```

Call it, from another terminal (the reply comes back at once):

```sh
statefun send NAMESPACE/TYPENAME/Ada hi --call
```

```text
Hello Ada! Nice to meet you.
```

Test it (`pip install pytest` first):

```sh
python -m pytest
```

The same `functions.py` can run as a remote function instead: `statefun serve
functions.py:functions --port 8000`, with an `io.statefun.endpoints.v2/http` endpoint in
module.yaml pointing at `http://127.0.0.1:8000/statefun`. `statefun settings` lists what
`statefun run --set NAME=VALUE` can change (checkpoints for exactly-once, the state backend).
"""

_FILES = {
    "functions.py": _FUNCTIONS,
    "module.yaml": _MODULE,
    "test_functions.py": _TEST,
    "README.md": _README,
}
