"""`verispec` command line: a thin layer over the library, one file per command.

The Typer application is `app` (the `verispec` script). Each command lives in its own
module and is registered here, so adding a command is one file plus one line below.
"""

from __future__ import annotations

import typer

from .analyze import analyze
from .audit import audit
from .bench import bench
from .generate import generate
from .models import models_fetch, models_list
from .plan import plan
from .serve import serve

# Help is click's plain layout (rich_markup_mode=None): it wraps the help text under long
# option names and never cuts a name, at any terminal width (rich's tables cut them at
# 80 columns: `--repetition-pen…`); tests/test_cli_help.py checks every command.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Exact (lossless) speculative decoding, and the maths to know when it pays.")
models_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Fetch and list the registered models.")
app.add_typer(models_app, name="models")

app.command()(generate)
models_app.command("list")(models_list)
models_app.command("fetch")(models_fetch)
app.command()(analyze)
app.command()(bench)
app.command()(audit)
app.command()(plan)
app.command()(serve)


def main() -> None:  # pragma: no cover
    app()
