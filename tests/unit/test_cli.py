"""The command line as a user meets it: `--help` answers without importing torch, every subcommand has a
description and an example, every option says what it is, and the names the parser shows (kinds, formats,
engines) are the tables' own."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from draftsmith.train import cli


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_imports_no_torch():
    code = ("import sys; from draftsmith.train.cli import build_parser; build_parser().format_help(); "
            "[p.format_help() for p in __import__('test_cli').subcommands().values()]; print('torch' in "
            "sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/", 1)[0])
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(cli.EXAMPLES))
def test_every_subcommand_has_a_description_an_example_and_option_help(name):
    parser = subcommands()[name]
    assert parser.description and cli.EXAMPLES[name].startswith(f"draftsmith {name}")
    assert f"example:\n  {cli.EXAMPLES[name]}" in parser.format_help()
    for action in parser._actions:
        assert action.help, f"draftsmith {name}: {action.option_strings or action.dest} has no help"


def test_every_subcommand_is_in_the_examples():
    assert set(subcommands()) == set(cli.EXAMPLES)


def test_shown_names_are_the_tables():
    from draftsmith.eval.measure.engine import ENGINES

    assert cli.ENGINE_NAMES == list(ENGINES)


def test_kinds_lists_every_kind_and_format(capsys):
    from draftsmith.heads.registry import FORMATS, KINDS

    assert cli.main(["kinds"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}: " in out for name in KINDS)
    assert all(f"{name} (" in out for spec in KINDS.values() for name in spec.formats if name in FORMATS)


def test_a_bad_format_is_one_clear_error(tmp_path, capsys):
    assert cli.main(["export", "--run", str(tmp_path), "--format", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "error" in capsys.readouterr().err
