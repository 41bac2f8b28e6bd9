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


# -- validation: every value is checked at load, with a one-line error naming it ------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"admin_port": "70000"}, r"admin_port must be a port number 0-65535, got 70000"),
        ({"admin_port": "-1"}, r"admin_port must be a port number 0-65535, got -1"),
        ({"remote_max_connections": "0"}, r"remote_max_connections must be at least 1, got 0"),
        ({"dispatcher_slice": "0"}, r"dispatcher_slice must be at least 1, got 0"),
        ({"restart_attempts": "-3"}, r"restart_attempts must be at least 0, got -3"),
        ({"restart_delay_ms": "-1"}, r"restart_delay_ms must be at least 0, got -1"),
        ({"max_response_bytes": "0"}, r"max_response_bytes must be at least 1, got 0"),
        (
            {"remote_retry_initial_backoff_ms": "-5"},
            r"remote_retry_initial_backoff_ms must be at least 0, got -5",
        ),
        (
            {"remote_retry_initial_backoff_ms": "900", "remote_retry_max_backoff_ms": "100"},
            r"remote_retry_max_backoff_ms \(100\) must be at least "
            r"remote_retry_initial_backoff_ms \(900\)",
        ),
        (
            {"checkpoint_interval_ms": str(10**12)},
            r"checkpoint_interval_ms must be at most 2147483647, got 1000000000000",
        ),
        ({"restart_delay_ms": str(10**15)}, r"restart_delay_ms must be at most"),
        ({"dead_letter_path": ""}, r"dead_letter_path must not be empty"),
        ({"state_dir": "  "}, r"state_dir must not be empty"),
    ],
)
def test_out_of_range_settings_are_named_with_their_value(
    overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        Settings.load(overrides, environ={})
    assert "\n" not in str(caught.value)


def test_a_setting_from_the_environment_is_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="admin_port must be a port number"):
        Settings.load(environ={"PYSTATEFUN_ADMIN_PORT": "99999"})


def test_a_misspelled_environment_variable_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.load(environ={"PYSTATEFUN_CHEKPOINT_DIR": "/tmp/c"})
    text = str(caught.value)
    assert "PYSTATEFUN_CHEKPOINT_DIR" in text and "\n" not in text
    assert "did you mean PYSTATEFUN_CHECKPOINT_DIR?" in text


def test_an_environment_variable_far_from_any_setting_lists_none() -> None:
    with pytest.raises(ConfigurationError, match="PYSTATEFUN_ZZZ matches no setting"):
        Settings.load(environ={"PYSTATEFUN_ZZZ": "1"})


def test_known_variables_that_are_not_settings_are_accepted() -> None:
    from statefun._settings import NON_SETTING_ENVIRONMENT

    assert "PYSTATEFUN_PEERS_DIR" in NON_SETTING_ENVIRONMENT
    environ = dict.fromkeys(NON_SETTING_ENVIRONMENT, "x")
    environ["PYSTATEFUN_PARALLELISM"] = "3"
    environ["OTHER_VARIABLE"] = "y"
    assert Settings.load(environ=environ).parallelism == 3


def test_every_variable_that_is_not_a_setting_is_documented() -> None:
    from statefun._settings import NON_SETTING_ENVIRONMENT

    text = DOCS.read_text()
    for name in NON_SETTING_ENVIRONMENT:
        assert f"`{name}`" in text, f"docs/settings.md lacks {name}"


def test_the_repository_uses_no_undeclared_variable() -> None:
    """Every ``PYSTATEFUN_<NAME>`` the code and tests read is a setting or declared apart."""
    import re

    from statefun._settings import NON_SETTING_ENVIRONMENT

    root = DOCS.parents[1]
    settings = {f"PYSTATEFUN_{name.upper()}" for name, _doc, _default in Settings.describe()}
    used: set[str] = set()
    for folder in ("statefun", "sdk", "ingress", "egress", "tests", "bench", "scripts"):
        for path in (root / folder).rglob("*.py"):
            if path.name in ("test_settings.py", "test_startup_errors.py"):
                continue  # they spell wrong names on purpose
            used.update(re.findall(r"PYSTATEFUN_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    used -= {"PYSTATEFUN_NAME"}  # how the docs spell the pattern
    assert used - settings - NON_SETTING_ENVIRONMENT == set()
