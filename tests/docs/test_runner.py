"""The doc-test's runner: it fails when a block fails, and runs the rest as a reader would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs._markdown import parse
from tests.docs._runner import DocumentFailed, DocumentRun


def run(text: str, tmp_path: Path) -> Path:
    work, scratch = tmp_path / "work", tmp_path / "scratch"
    work.mkdir()
    scratch.mkdir()
    DocumentRun(parse(Path("doc.md"), text), work, scratch, dict(os.environ), "doc.md").run()
    return work


def test_blocks_run_in_order_and_carry_the_directory(tmp_path: Path) -> None:
    work = run(
        """
```sh
mkdir -p sub && cd sub
```

<!-- doctest: file="note.txt" -->
```text
written
```

<!-- doctest: file="note.txt", append -->
```text
more
```

```sh
cat note.txt > seen.txt
```

```python
from pathlib import Path
Path("from-python.txt").write_text("ok")
```
""",
        tmp_path,
    )
    assert (work / "sub" / "seen.txt").read_text() == "written\n\n\nmore\n"
    assert (work / "sub" / "from-python.txt").read_text() == "ok"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("```sh\ntrue\nfalse\ntrue\n```\n", "doc.md:1: exit code 1"),
        ("```python\nraise SystemExit(3)\n```\n", "doc.md:1: exit code 3"),
        ('<!-- doctest: expect="bye" -->\n```sh\necho hi\n```\n', "does not show 'bye'"),
        ("```sh\nstatefun run module.yaml\n```\n", "runs until stopped: annotate"),
        (
            '<!-- doctest: background, ready="never", timeout="1" -->\n```sh\nsleep 30\n```\n',
            "did not show 'never' within 1 s",
        ),
        (
            '<!-- doctest: background, ready="up" -->\n```sh\nexit 4\n```\n',
            "ended (exit code 4) before showing 'up'",
        ),
        (
            '<!-- doctest: background, ready="up" -->\n```sh\necho up; exit 5\n```\n'
            "```sh\nsleep 0.5\n```\n",
            "ended by itself with exit code 5",
        ),
        ('<!-- doctest: timeout="1" -->\n```sh\nsleep 30\n```\n', "still running after 1 s"),
    ],
)
def test_a_failing_block_fails_the_document(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(DocumentFailed, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(text, tmp_path)


def test_background_blocks_stop_at_stop_and_at_the_end(tmp_path: Path) -> None:
    work = run(
        """
<!-- doctest: background, ready="up" -->
```sh
trap 'echo stopped > first.txt; exit 0' INT; echo up; while true; do sleep 0.1; done
```

<!-- doctest: background, ready="up" -->
```sh
trap 'echo stopped > second.txt; exit 0' INT; echo up; while true; do sleep 0.1; done
```

<!-- doctest: stop="first.txt" -->
```sh
sleep 0.5; test -f first.txt; test ! -f second.txt
```
""",
        tmp_path,
    )
    assert (work / "second.txt").read_text() == "stopped\n"
