"""`python -m verispec.cli ...` runs the command line."""

from . import app

app()
