"""Every relative link of the README, the examples' READMEs and the docs points at a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.conftest import REPO

DOCUMENTS = sorted(
    [REPO / "README.md", *REPO.glob("examples/*/README.md"), *REPO.glob("docs/**/*.md")]
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of the Markdown links outside fenced blocks."""
    found, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found.extend((number, target) for target in _LINK.findall(line))
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(REPO)) for p in DOCUMENTS])
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for number, target in links(path):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the same page
        file = (path.parent / target.split("#", 1)[0]).resolve()
        if not file.exists():
            broken.append(f"{path.relative_to(REPO)}:{number}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
