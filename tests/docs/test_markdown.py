"""The doc-test's reading of Markdown: blocks, annotations, and annotation mistakes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs._markdown import MarkdownError, parse

DOC = Path("doc.md")


def test_blocks_with_their_annotations() -> None:
    text = """# Title

<!-- doctest: document, workdir="empty", copy="examples" -->

```sh
statefun new hello
```

<!-- doctest: background, ready="job started", timeout="60" -->

```sh
statefun run module.yaml
```

<!-- doctest: stop="statefun run" -->
```python
print("hi")
```

```text
output
```

<!-- doctest: file="module.yaml" -->
```yaml
kind: x
```
"""
    document = parse(DOC, text)
    assert document.options == {"workdir": "empty", "copy": "examples"}
    sh, background, python, output, yaml = document.blocks
    assert (sh.language, sh.text, sh.line, sh.runnable) == ("sh", "statefun new hello\n", 5, True)
    assert background.words == {"background"}
    assert background.options == {"ready": "job started", "timeout": "60"}
    assert python.stop_before == ["statefun run"] and python.runnable
    assert not output.runnable
    assert yaml.runnable and yaml.options == {"file": "module.yaml"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- doctest: sometimes -->\n```sh\nls\n```\n", "doc.md:1: unknown doctest word"),
        ('<!-- doctest: colour="red" -->\n```sh\nls\n```\n', "unknown doctest option 'colour'"),
        ("<!-- doctest: background -->\n```sh\nls\n```\n", 'needs ready="..."'),
        ("<!-- doctest: skip -->\n```sh\nls\n```\n", 'needs reason="..."'),
        ('<!-- doctest: skip, reason="x" -->\ntext\n```sh\nls\n```\n', "right before a fenced"),
        ('<!-- doctest: skip, reason="x" -->\n', "doc.md:1: an annotation with no block"),
        ("```sh\nls\n", "doc.md:1: the fenced block is never closed"),
    ],
)
def test_annotation_mistakes_name_the_line(text: str, message: str) -> None:
    with pytest.raises(MarkdownError, match=re.escape(message)):
        parse(DOC, text)
