"""The runnable parts of a Markdown document, and the annotations that say how to run them.

Fenced blocks of a shell language (``sh``, ``bash``, ``shell``) run in bash; ``python``
blocks run with the document's Python. Everything else (``text``, ``yaml``...) is shown to
the reader only, unless an annotation gives it a ``file`` to be written to.

An annotation is an HTML comment the reader does not see, on the lines just before a block
(blank lines between are fine)::

    <!-- doctest: background, ready="job started" -->

Words and ``key="value"`` pairs, separated by commas:

* ``background``: start the block and go on once its output shows ``ready`` (required; a
  piece of text, not a pattern); it is stopped (SIGINT, then SIGKILL) at ``stop`` or at the
  end of the document. ``timeout`` (seconds) bounds the wait.
* ``skip`` with ``reason``: do not run it (output shown as a command, a command that runs
  the tests themselves).
* ``file="NAME"``: write the block's text to NAME in the working directory instead of
  running it (how a document's ``functions.py`` or ``module.yaml`` becomes a file); with
  ``append``, add it to the end of that file (a file explained piece by piece).
* ``expect="TEXT"``: the block's output (stdout and stderr) must contain TEXT.
* ``timeout="SECONDS"`` for a foreground block (default 120).

Standalone annotations (not followed by a block):

* ``<!-- doctest: stop -->``: stop the background blocks started so far;
  ``stop="TEXT"`` only those whose text contains TEXT (``stop="statefun run"``).
* ``<!-- doctest: document, workdir="clone" -->`` (anywhere in the document): where its
  blocks run. ``clone``: a copy of the repository's files, with its ``.venv``; ``empty``: an
  empty folder (the default for documents of the guide); ``copy="examples module.yaml"``
  copies those paths of the repository into it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Document", "MarkdownError", "parse"]

SHELL = frozenset({"sh", "bash", "shell"})
PYTHON = frozenset({"python", "py"})

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_ANNOTATION = re.compile(r"^\s*<!--\s*doctest:(.*?)-->\s*$")
_PAIR = re.compile(r'\s*([a-z-]+)\s*(?:=\s*"((?:[^"\\]|\\.)*)")?\s*(?:,|$)')

_WORDS = frozenset({"background", "skip", "stop", "document", "append"})
_KEYS = frozenset({"ready", "reason", "timeout", "file", "expect", "workdir", "copy", "stop"})


class MarkdownError(ValueError):
    """A document's annotation cannot be understood (names the file and line)."""


@dataclass
class Block:
    """One fenced block and what its annotation says."""

    language: str
    text: str
    line: int  # of the opening fence, counted from 1
    options: dict[str, str] = field(default_factory=dict)
    words: frozenset[str] = frozenset()
    #: a ``stop`` annotation came since the previous block: what to stop ("" = everything)
    stop_before: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        if "skip" in self.words:
            return False
        return "file" in self.options or self.language in SHELL | PYTHON


@dataclass
class Document:
    path: Path
    blocks: list[Block]
    options: dict[str, str]


def _parse_annotation(body: str, where: str) -> tuple[frozenset[str], dict[str, str]]:
    words: set[str] = set()
    options: dict[str, str] = {}
    position = 0
    body = body.strip()
    while position < len(body):
        match = _PAIR.match(body, position)
        if match is None or match.end() == position:
            raise MarkdownError(f"{where}: cannot read the annotation at {body[position:]!r}")
        name, value = match.group(1), match.group(2)
        if value is None:
            if name not in _WORDS:
                raise MarkdownError(f"{where}: unknown doctest word {name!r}")
            words.add(name)
        else:
            if name not in _KEYS:
                raise MarkdownError(f"{where}: unknown doctest option {name!r}")
            options[name] = value.replace('\\"', '"').replace("\\\\", "\\")
        position = match.end()
    if "background" in words and "ready" not in options:
        raise MarkdownError(f'{where}: a background block needs ready="..."')
    if "append" in words and "file" not in options:
        raise MarkdownError(f'{where}: append needs file="..."')
    if "skip" in words and not options.get("reason"):
        raise MarkdownError(f'{where}: a skipped block needs reason="..."')
    return frozenset(words), options


def parse(path: Path, text: str | None = None) -> Document:
    """The blocks of the Markdown file ``path`` with their annotations."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    document_options: dict[str, str] = {}
    pending: tuple[frozenset[str], dict[str, str], int] | None = None
    stop: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        where = f"{path}:{index + 1}"
        annotation = _ANNOTATION.match(line)
        if annotation is not None:
            words, options = _parse_annotation(annotation.group(1), where)
            if "document" in words:
                document_options.update(options)
            elif "stop" in words or "stop" in options:
                stop.append(options.get("stop", ""))
            else:
                if pending is not None:
                    raise MarkdownError(f"{where}: two annotations before one block")
                pending = (words, options, index + 1)
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and pending is not None:
                raise MarkdownError(
                    f"{path}:{pending[2]}: an annotation must come right before a fenced block"
                )
            index += 1
            continue
        indent, marker, language = fence.group(1), fence.group(2), fence.group(3).lower()
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(marker):
            content = lines[index]
            body.append(content[len(indent) :] if content.startswith(indent) else content)
            index += 1
        if index >= len(lines):
            raise MarkdownError(f"{where}: the fenced block is never closed")
        index += 1  # the closing fence
        words, options = (pending[0], pending[1]) if pending is not None else (frozenset(), {})
        opening = int(where.rsplit(":", 1)[1])
        blocks.append(Block(language, "\n".join(body) + "\n", opening, options, words, stop))
        pending, stop = None, []
    if pending is not None:
        raise MarkdownError(f"{path}:{pending[2]}: an annotation with no block after it")
    return Document(path, blocks, document_options)
