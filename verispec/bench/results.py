"""The benchmark's output directory: results.jsonl, meta.json, resume.

Files in the directory:

* ``results.jsonl``: one JSON object per (prompt, method) measurement, appended and
  flushed right after it finishes (fields: `run_bench`). A later row for the same
  (question_id, method) supersedes an earlier one (resume after an error).
* ``meta.json``: command, machine, versions, models and settings of the run, the methods
  and, after --resume, each resumed command.
* ``summary.json``, ``table.md``, ``speedup.png``: written from the two above
  (`verispec.bench.summary.write_report`).

Renamed fields are read both ways: rows written before the rename call α̂ (accepted /
drafted) ``acceptance_rate``; `load_results` returns them as ``draft_acceptance_rate``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..models.base import cpu_name, cpu_vector
from .measure import loadavg
from .methods import METHODS, BenchError

__all__ = ["RESULTS", "META", "SUMMARY", "TABLE", "PLOT", "RESUME_KEYS", "load_results", "upgrade_row",
           "latest_rows", "done_pairs", "read_meta", "collect_meta", "start_run", "append_row"]

RESULTS, META, SUMMARY, TABLE, PLOT = ("results.jsonl", "meta.json", "summary.json", "table.md",
                                       "speedup.png")
# settings that must agree between a run and its --resume, with their options
RESUME_KEYS = {"backend": "--backend", "target": "--target", "draft": "--draft",
               "max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "seed": "--seed"}
_RENAMED = {"acceptance_rate": "draft_acceptance_rate"}   # old row key -> current


def upgrade_row(row: dict) -> dict:
    """The row with renamed fields under their current names (in place; returned)."""
    for old, new in _RENAMED.items():
        if old in row and new not in row:
            row[new] = row.pop(old)
    return row


def load_results(out_dir: str | os.PathLike) -> list[dict]:
    """All rows of DIR/results.jsonl in file order ([] when there is none), `upgrade_row`-ed.

    A truncated last line (an interrupted write) is skipped.

    Raises:
        BenchError: for a malformed line before the last.
    """
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(upgrade_row(json.loads(line)))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                continue
            raise BenchError(f"{path}, line {i + 1}: not JSON ({e})") from e
    return rows


def latest_rows(rows: Iterable[dict]) -> list[dict]:
    """Keep the last row per (question_id, method), in first-appearance order."""
    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["question_id"], r["method"])] = r
    return list(latest.values())


def done_pairs(rows: Iterable[dict]) -> set[tuple[int | str, str]]:
    """(question_id, method) pairs with a successful measurement (latest row has no error)."""
    return {(r["question_id"], r["method"]) for r in latest_rows(rows) if not r.get("error")}


def read_meta(out_dir: str | os.PathLike) -> dict | None:
    """DIR/meta.json, or None when missing or unreadable."""
    try:
        return json.loads((Path(out_dir) / META).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None


def _llama_patch_level() -> int | None:
    """Which of verispec's llama.cpp edits the installed llama-cpp-python has, or None."""
    try:
        from ..models.llamacpp import patch_level
        return patch_level()
    except ImportError:
        return None


def collect_meta(**settings: Any) -> dict:
    """Command-independent facts about this machine and software, plus `settings`.

    Returns:
        {"date", "loadavg_at_start", "machine": {cpu, cpu_vector (the widest SIMD
         extension, `verispec.models.base.cpu_vector`: "avx512", "avx2", "neon" or ""), cores, usable_cores, torch_threads, gpu, platform},
         "versions": {python, torch, transformers, llama-cpp-python, llama-cpp-patch (verispec's
         llama.cpp edits built in, `verispec.models.llamacpp.patch_level`; None without
         llama-cpp-python), verispec}, **settings}.
    """
    import torch

    from .. import __version__

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "loadavg_at_start": loadavg(),
        "machine": {"cpu": cpu_name(), "cpu_vector": cpu_vector(),
                    "cores": os.cpu_count(), "usable_cores": usable,
                    "torch_threads": torch.get_num_threads(), "gpu": gpu,
                    "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": _version("transformers"),
                     "llama-cpp-python": _version("llama-cpp-python"),
                     "llama-cpp-patch": _llama_patch_level(),
                     "verispec": _version("verispec") or __version__},
        **settings,
    }


def start_run(out_dir: str | os.PathLike, settings: dict, methods: list[str], *, resume: bool = False,
              overwrite: bool = False, meta: dict | None = None) -> list[dict]:
    """Prepare DIR for a run: check it, write meta.json, return the rows a resume keeps.

    Args:
        out_dir: the output directory (created).
        settings: this run's values of `RESUME_KEYS` (backend, target, draft, ...).
        methods: the methods this run measures.
        resume: continue the run in DIR (its settings must match `settings`).
        overwrite: start over (results.jsonl is removed).
        meta: extra metadata (e.g. {"command": ...}); on resume it is recorded under
            "resumed" and the first run's metadata is kept.

    Returns:
        The previous rows (resume), else [].

    Raises:
        BenchError: naming --resume / --force when DIR holds results and neither is
            given, and naming the option whose value differs from the resumed run's.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = load_results(out)
    if existing and not resume and not overwrite:
        raise BenchError(f"--out {out} already holds {RESULTS}; pass --resume to continue that "
                         "run, --force to start over, or another --out")
    old_meta = read_meta(out) if resume else None
    if old_meta:
        for key, option in RESUME_KEYS.items():
            if key in old_meta and old_meta[key] != settings[key]:
                raise BenchError(f"--resume: {out} was run with {option} {old_meta[key]!r}, "
                                 f"not {settings[key]!r}; use the same settings or another --out")
    if not resume:
        (out / RESULTS).unlink(missing_ok=True)
    new_meta = collect_meta(**settings, **(meta or {}))
    new_meta["methods"] = list(dict.fromkeys((old_meta or {}).get("methods", []) + methods))
    # a resumed run keeps the descriptions its rows were made under (a method's meaning may have
    # changed since, e.g. verispec-auto's drafters); only methods new to it get today's
    described = (old_meta or {}).get("method_descriptions", {})
    new_meta["method_descriptions"] = {m: described[m] if m in described else
                                       METHODS[m].description if m in METHODS else
                                       (meta or {}).get("method_descriptions", {}).get(m, "")
                                       for m in new_meta["methods"]}
    new_meta["prompts"] = "first turn only"
    if old_meta:
        first = {k: v for k, v in old_meta.items() if k != "resumed"}
        new_meta = {**first, "methods": new_meta["methods"],
                    "method_descriptions": new_meta["method_descriptions"],
                    "resumed": old_meta.get("resumed", []) + [
                        {"date": new_meta["date"], "command": (meta or {}).get("command")}]}
    (out / META).write_text(json.dumps(new_meta, indent=2, default=str) + "\n", encoding="utf-8")
    return existing if resume else []


def append_row(file, row: dict) -> None:
    """Write one row to an open results.jsonl and flush it (it survives an interrupt)."""
    file.write(json.dumps(row, default=str) + "\n")
    file.flush()
