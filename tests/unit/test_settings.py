"""Settings: defaults, environment, overrides, validation, and the docs table kept in sync."""

from pathlib import Path

import pytest

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_defaults_are_valid() -> None:
    settings = Settings()
    assert settings.parallelism == 2 and settings.max_parallelism == 128
    assert settings.checkpoint_dir == ""


def test_environment_then_overrides() -> None:
    settings = Settings.load(
        {"parallelism": "4"},
        environ={"PYSTATEFUN_PARALLELISM": "3", "PYSTATEFUN_CHECKPOINT_DIR": "/tmp/c"},
    )
    assert settings.parallelism == 4 and settings.checkpoint_dir == "/tmp/c"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallelism": "0"}, "parallelism must be at least 1"),
        ({"parallelism": "x"}, "setting parallelism: expected an integer, got 'x'"),
        ({"nope": "1"}, "unknown setting 'nope'"),
        ({"parallelism": "8", "max_parallelism": "4"}, "must be at least parallelism"),
        ({"reply_release": "later"}, "reply_release must be one of on-checkpoint, immediate"),
        ({"remote_failure_policy": "ignore"}, "remote_failure_policy must be 'fail'"),
        ({"http_max_connections": "0"}, "http_max_connections must be at least 1, got 0"),
        ({"http_head_timeout_ms": "0"}, "http_head_timeout_ms must be at least 1"),
        ({"admin_savepoint_min_interval_ms": "-1"}, "admin_savepoint_min_interval_ms must be"),
    ],
)
def test_bad_settings_are_named(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.load(overrides, environ={})


def test_every_setting_is_documented_with_its_default() -> None:
    text = DOCS.read_text()
    for name, _doc, default in Settings.describe():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/settings.md lacks {name}"
        assert (f"`{default}`" if default != "" else "(empty)") in row, f"default of {name}"
