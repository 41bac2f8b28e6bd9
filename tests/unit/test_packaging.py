"""The package list in pyproject.toml names every package of the source tree.

setuptools installs only the packages listed; an editable install finds the rest anyway, so a
missing entry breaks only real installs (wheels). This test catches that early.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found: set[str] = set()
    for name, folder in config["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
                continue
            found.add(".".join((name, *relative.parts)) if relative.parts else name)
    # Sub-packages mapped to their own folder are found under that mapping, not twice.
    assert found == listed, f"missing: {sorted(found - listed)}, extra: {sorted(listed - found)}"


def test_metadata_has_project_urls() -> None:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert {"Homepage", "Documentation"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values()), urls


def test_installed_metadata_carries_the_urls() -> None:
    from importlib.metadata import metadata

    entries = metadata("pystatefun").get_all("Project-URL") or []
    assert any(entry.startswith("Homepage, https://") for entry in entries), entries
