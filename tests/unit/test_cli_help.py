"""The command line's self-description: --version, --help of every subcommand, `settings`,
and `plan`'s text output and checks."""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path

import pytest

from statefun._cli import COMMANDS, _build_parser, main
from statefun._settings import Settings


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"statefun {version('pystatefun')}\n"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parsers = []
    for name, sub in _subparsers(_build_parser()).items():
        parsers.append((name, sub))
        parsers += [(f"{name} {n}", p) for n, p in _subparsers(sub).items()]
    return parsers


@pytest.mark.parametrize(("name", "parser"), _all_parsers(), ids=lambda v: str(v))
def test_every_argument_has_help_and_a_shown_default(
    name: str, parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
            continue
        assert action.help, f"statefun {name}: {action.dest} has no help"
        default = action.default
        if (
            action.option_strings
            and default not in (None, argparse.SUPPRESS)
            and default is not False
            and default != []
        ):
            assert f"default: {default}" in text or "default" in action.help, (
                f"statefun {name} --help does not show the default of {action.dest}"
            )


def test_every_command_is_listed_in_the_main_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command.name in out


def test_specific_help_texts() -> None:
    parsers = dict(_all_parsers())
    plan = parsers["plan"].format_help()
    assert "file(s) to plan" in plan and "to run" not in plan
    assert "Graphviz DOT" in plan
    assert "statefun settings" in parsers["run"].format_help()
    assert "docs/settings.md" not in parsers["run"].format_help()
    assert "_metadata" in parsers["savepoint inspect"].format_help()
    assert "(default: 9092)" in parsers["kafka start"].format_help()
    assert "(default: 8000)" in parsers["serve"].format_help()


def test_settings_lists_every_setting_with_its_default_and_doc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    for name, doc, default in Settings.describe():
        shown = "(none)" if default in ("", None) else str(default)
        assert f"\n{name} = {shown}\n" in "\n" + out
        assert doc.split()[0] in out
    assert main(["settings", "checkpoint_dir"]) == 0
    assert capsys.readouterr().out.startswith("checkpoint_dir = (none)\n")
    assert main(["settings", "no_such_thing"]) == 2
    assert capsys.readouterr().err == (
        "statefun settings: error: no setting 'no_such_thing'; `statefun settings` lists them\n"
    )


def test_plan_text_has_no_escaped_newlines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: a/http\n  port: 8090\n"
        "---\nkind: io.pystatefun.stdout.v1/egress\nspec:\n  id: a/out\n"
    )
    assert main(["plan", str(module)]) == 0
    text = capsys.readouterr().out
    assert "\\n" not in text
    assert "http ingress a/http, 127.0.0.1:8090" in text
    assert "keyBy(address), 128 key groups" in text
    assert main(["plan", str(module), "--format", "dot"]) == 0
    assert 'label="http ingress a/http\\n127.0.0.1:8090"' in capsys.readouterr().out


def test_plan_rejects_a_missing_embedded_module_file_as_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: a/*\n"
        "  module: nope.py:functions\n"
    )
    assert main(["plan", str(module)]) == 2
    planned = capsys.readouterr()
    assert planned.out == ""
    assert main(["run", str(module)]) == 2
    ran = capsys.readouterr()
    why = f"spec.module: no such file {tmp_path / 'nope.py'} (from 'nope.py:functions')"
    assert planned.err.startswith("statefun plan: error: ") and why in planned.err
    assert planned.err.removeprefix("statefun plan") == ran.err.removeprefix("statefun run")
    assert planned.err.count("\n") == 1
