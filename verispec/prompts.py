"""Benchmark prompts: one loader for `verispec analyze` and `verispec bench`.

Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference:
A Comprehensive Survey of Speculative Decoding", Findings of ACL; its ``question.jsonl``)
holds 480 rows: 80 each of translation, summarization, qa, math_reasoning and rag, and
MT-Bench's 80 questions (eight categories of ten), which Spec-Bench reports together as
one "multi-turn conversation" column. A row is ``{"question_id", "category", "turns"}``;
only its FIRST turn is used (multi-turn rows are not continued).

Selection, `load_prompts(path, categories, per_category)`:

* a reported category is one of Spec-Bench's five, ``multi-turn`` (the eight MT-Bench
  categories together) or any raw category of the file (e.g. ``coding`` on its own);
* a plain category takes its first N rows in file order;
* ``multi-turn`` takes them round-robin over its sub-categories in file order
  (writing #1, roleplay #1, ..., humanities #1, writing #2, ...), so N <= 8 rows come
  from N different sub-categories;
* N = ``per_category``; 0 takes every row;
* ``categories=None`` takes every category of the file (MT-Bench's grouped as
  ``multi-turn``, or kept apart with ``raw_categories=True``);
* a row picked by two categories (``multi-turn`` and ``coding``) is returned once,
  with both in `Prompt.groups`.

A category listed in `CATEGORY_FILES` is read from its own JSON-lines file (a prompt set
shipped with the package: ``code-edit``, copy-heavy code editing, `benchmarks/data/README.md`)
instead of the Spec-Bench file;
its rows have the same three fields and their ids must not collide with the main
file's. A plain text file (one prompt a line) is one category, ``prompts``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Sequence

__all__ = [
    "ENV_VAR", "SPEC_BENCH_CATEGORIES", "MT_BENCH_CATEGORIES", "MULTI_TURN", "DEFAULT_CATEGORIES",
    "PLAIN_CATEGORY", "CATEGORY_FILES", "Prompt", "PromptError", "dataset_path", "read_prompt_file",
    "canonical_category", "load_prompts",
]

ENV_VAR = "VERISPEC_SPEC_BENCH"
SPEC_BENCH_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                       "humanities")
MULTI_TURN = "multi-turn"
DEFAULT_CATEGORIES = (*SPEC_BENCH_CATEGORIES, MULTI_TURN)   # Spec-Bench's six columns
PLAIN_CATEGORY = "prompts"                                   # every line of a plain text file
# categories whose rows live in their own JSON-lines file rather than in the Spec-Bench one
CATEGORY_FILES: dict[str, Path] = {"code-edit": Path(__file__).parent / "data" / "code_edit.jsonl"}
_ALIASES = {"multi_turn": MULTI_TURN, "multiturn": MULTI_TURN, "mt-bench": MULTI_TURN,
            "mt_bench": MULTI_TURN}


class PromptError(ValueError):
    """A prompt file that cannot be used, or a selection it cannot satisfy; the message
    names the file and line, or the option (--categories, --per-category)."""


@dataclass(frozen=True)
class Prompt:
    """One prompt row.

    Attributes:
        id: the row's question_id (an int for Spec-Bench; a string id stays a string),
            or its line number when the row has none (plain text files).
        category: the category as written in the file (e.g. "coding"; "prompts" for
            plain text).
        turns: the user turns; only ``turns[0]`` is used.
        groups: the reported categories it was selected for, e.g. ("multi-turn",) or
            ("multi-turn", "coding") when both were asked (empty before selection).
        line: 1-based line number in its file.
    """

    id: int | str
    category: str
    turns: tuple[str, ...]
    groups: tuple[str, ...] = ()
    line: int = 0

    @property
    def text(self) -> str:
        """The prompt that is run: the first turn."""
        return self.turns[0]


def dataset_path(path: str | os.PathLike | None = None) -> Path:
    """The prompt file: `path`, else $VERISPEC_SPEC_BENCH, else Spec-Bench beside the checkout.

    $VERISPEC_SPEC_BENCH may name the file or a directory holding question.jsonl. The
    default is ``shared/data/spec_bench/question.jsonl`` under ``..`` or ``.``, looked
    for from the source checkout and from the working directory.

    Raises:
        FileNotFoundError: naming `path`, the variable, or every place tried.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"prompt file {p} does not exist")
        return p
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            p = p / "question.jsonl"
        if not p.is_file():
            raise FileNotFoundError(f"${ENV_VAR} is set to {env!r} but {p} is not a file "
                                    "(unset it or pass --dataset FILE)")
        return p
    rel = Path("data") / "spec_bench" / "question.jsonl"
    tried = []
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        for base in (root / ".." / "shared", root / "shared"):
            candidate = (base / rel).resolve()
            if candidate.is_file():
                return candidate
            tried.append(str(candidate))
    raise FileNotFoundError("no Spec-Bench question file found (tried " + ", ".join(dict.fromkeys(tried))
                            + f"); pass --dataset FILE (Spec-Bench's question.jsonl) or set ${ENV_VAR}")


def _row_id(value: object, where: str) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        return int(value) if value.strip().isdigit() else value.strip()
    raise PromptError(f"{where}: \"question_id\" must be an integer or a non-empty string, got {value!r}")


def read_prompt_file(path: str | os.PathLike) -> list[Prompt]:
    """Every row of a JSON-lines or plain text prompt file, in file order (no selection).

    JSON lines (a .jsonl/.json file, or one whose first non-blank line starts with "{"):
    one object a line with ``turns`` (a string or a list of strings whose first is not
    blank), ``category`` (default "uncategorized") and ``question_id`` (default: the
    line number). Plain text: one prompt a line, category "prompts". Blank lines are
    skipped.

    Raises:
        FileNotFoundError: naming the path.
        PromptError: for a directory, an empty or non-UTF-8 file, a bad JSON line, a row
            without a usable first turn or a repeated question_id (naming the lines).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    if path.is_dir():
        raise PromptError(f"prompt file {path} is a directory; give a .jsonl or text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(f"{path} is not UTF-8 text: {e}") from None
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines:
        raise PromptError(f"prompt file {path} is empty: give one prompt a line, or Spec-Bench JSON lines")
    if not (path.suffix.lower() in (".jsonl", ".json") or lines[0][1].lstrip().startswith("{")):
        return [Prompt(number, PLAIN_CATEGORY, (line.strip(),), line=number) for number, line in lines]
    rows: list[Prompt] = []
    seen: dict[int | str, int] = {}
    for number, line in lines:
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise PromptError(f"{where}: expected a JSON object, got {type(row).__name__}")
        turns = row.get("turns")
        if isinstance(turns, str):
            turns = [turns]
        if (not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns)
                or not turns[0].strip()):
            raise PromptError(f"{where}: needs \"turns\", a list of strings whose first is not empty "
                              "(a Spec-Bench row has question_id, category, turns)")
        qid = _row_id(row.get("question_id", number), where)
        if qid in seen:
            raise PromptError(f"{where}: question_id {qid!r} repeats line {seen[qid]}")
        seen[qid] = number
        rows.append(Prompt(qid, str(row.get("category") or "uncategorized"), tuple(turns), line=number))
    return rows


def canonical_category(name: str) -> str:
    """A --categories entry as reported: aliases of multi-turn (multi_turn, mt-bench) folded."""
    name = name.strip()
    return _ALIASES.get(name.lower(), name)


def _reported(category: str, raw_categories: bool) -> str:
    return MULTI_TURN if not raw_categories and category in MT_BENCH_CATEGORIES else category


def _pick(rows: Sequence[Prompt], category: str, n: int) -> list[Prompt]:
    """The first n rows of `category` (n = 0: all); multi-turn round-robin over its sub-categories."""
    if category != MULTI_TURN:
        mine = [r for r in rows if r.category == category]
        return mine[:n] if n else mine
    subs = [s for s in dict.fromkeys(r.category for r in rows) if s in MT_BENCH_CATEGORIES]
    queues = [[r for r in rows if r.category == s] for s in subs]
    want = n or sum(len(q) for q in queues)
    picked: list[Prompt] = []
    while len(picked) < want and any(queues):
        for q in queues:
            if q and len(picked) < want:
                picked.append(q.pop(0))
    return picked


def load_prompts(path: str | os.PathLike | None = None, categories: Sequence[str] | None = None,
                 per_category: int = 3, *, raw_categories: bool = False) -> list[Prompt]:
    """Read a prompt file and select `per_category` rows of each category (module docstring).

    Args:
        path: Spec-Bench JSON lines or plain text; None = `dataset_path()`.
        categories: reported categories, in the order wanted (see the module docstring);
            None = every category of the file.
        per_category: rows per category, an integer >= 0; 0 = all.
        raw_categories: with categories=None, keep MT-Bench's eight categories apart
            instead of reporting them as one "multi-turn".

    Returns:
        The selected prompts, each once, grouped by category in the order asked
        (categories=None: in order of first appearance), `groups` filled in.

    Raises:
        FileNotFoundError: naming a missing file.
        PromptError: from `read_prompt_file`; naming --per-category (not an integer >= 0)
            or --categories (empty, unknown, or without rows in the file); for a
            question_id selected from two different files.
    """
    if isinstance(per_category, bool) or not isinstance(per_category, int) or per_category < 0:
        raise PromptError(f"--per-category (per_category) must be an integer >= 0 (0 = all), "
                          f"got {per_category!r}")
    path = dataset_path(path)
    files: dict[Path, list[Prompt]] = {path: read_prompt_file(path)}
    if categories is None:
        asked = list(dict.fromkeys(_reported(r.category, raw_categories) for r in files[path]))
    else:
        asked = list(dict.fromkeys(canonical_category(c) for c in categories))
        if not asked:
            raise PromptError("--categories is empty")
    chosen: dict[int | str, tuple[Prompt, Path, list[str]]] = {}
    for c in asked:
        source = Path(CATEGORY_FILES.get(c, path))
        if source not in files:
            files[source] = read_prompt_file(source)
        rows = files[source]
        known = {*SPEC_BENCH_CATEGORIES, *MT_BENCH_CATEGORIES, MULTI_TURN, *CATEGORY_FILES,
                 *(r.category for r in rows)}
        if c not in known:
            raise PromptError(f"--categories: unknown category {c!r}; choose from "
                              + ", ".join(dict.fromkeys((*DEFAULT_CATEGORIES, *MT_BENCH_CATEGORIES,
                                                         *CATEGORY_FILES))))
        picked = _pick(rows, c, per_category)
        if not picked:
            raise PromptError(f"--categories: {c!r} has no rows in {source}")
        for r in picked:
            if r.id in chosen and chosen[r.id][1] != source:
                raise PromptError(f"question_id {r.id!r} is in both {chosen[r.id][1]} and {source}; "
                                  "ids must be unique across prompt files")
            chosen.setdefault(r.id, (r, source, []))[2].append(c)
    return [replace(r, groups=tuple(groups)) for r, _, groups in chosen.values()]
