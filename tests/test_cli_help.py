"""Every command's --help fits an 80-column terminal with every option name whole
(no `--repetition-pen…`): the help users read first is never cut."""

import re

import pytest
import typer
from typer.testing import CliRunner

from verispec.cli import app

WIDTH = 80


def _commands(group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_every_command_is_checked():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"generate", "serve", "bench", "audit", "plan", "analyze", "models list"} <= names


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_fits_80_columns_with_every_option_name_whole(path, command):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)},
                                terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    names = [opt for param in command.params if not getattr(param, "hidden", False)
             for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-")]
    assert names
    for name in names:
        assert re.search(re.escape(name) + r"(?![\w-])", result.output), f"{name} is cut or missing"
