"""Build the `code-edit` benchmark prompts: 20 edit requests over CPython standard-library functions.

Copy-heavy work of the kind users run small models for on CPUs: the answer repeats most of
the function it was given, with a small edit. Each prompt holds one function's source
(`inspect.getsource`, dedented) from `textwrap`, `shlex`, `json.encoder` or `difflib`
(CPython, Python Software Foundation License Version 2) and one instruction ("rename X to
Y", "add type hints", "add a docstring", "use a list comprehension where possible", ...),
chosen with a fixed seed among the instructions that make sense for that function.

Writes JSON lines compatible with Spec-Bench's question.jsonl (question_id, category,
turns) plus a `provenance` object per row (module, qualified name, file, first line,
sha256 of the source, Python version, licence, instruction kind). Question ids start at
10001, clear of Spec-Bench's (81..480).

Usage (the committed file was made with CPython 3.11.7; other versions may differ in
the sources, which --check reports):

    python benchmarks/data/make_code_edit.py            # writes verispec/data/code_edit.jsonl
    python benchmarks/data/make_code_edit.py --check    # regenerate and compare with it
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import inspect
import json
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

SEED = 18            # the issue that asked for this benchmark
FIRST_ID = 10001
CATEGORY = "code-edit"
LICENCE = "PSF-2.0 (Python Software Foundation License Version 2)"
OUT = Path(__file__).resolve().parents[2] / "verispec" / "data" / "code_edit.jsonl"   # package data

#: module -> (how many to draw, the candidate functions: 8..60 lines of source each)
POOL = {
    "textwrap": (5, ["dedent", "indent", "shorten", "TextWrapper.__init__", "TextWrapper.wrap",
                     "TextWrapper._split",
                     "TextWrapper._munge_whitespace", "TextWrapper._fix_sentence_endings",
                     "TextWrapper._handle_long_word"]),
    "shlex": (4, ["split", "quote", "shlex.__init__", "shlex.push_source", "shlex.pop_source",
                  "shlex.sourcehook", "shlex.get_token"]),
    "json.encoder": (4, ["py_encode_basestring_ascii", "JSONEncoder.default", "JSONEncoder.encode",
                         "JSONEncoder.iterencode"]),
    "difflib": (7, ["get_close_matches", "_format_range_unified", "_format_range_context",
                    "SequenceMatcher.ratio", "SequenceMatcher.quick_ratio",
                    "SequenceMatcher.real_quick_ratio", "SequenceMatcher.get_opcodes",
                    "SequenceMatcher.get_grouped_opcodes", "SequenceMatcher.set_seq2",
                    "Differ._plain_replace", "restore", "IS_LINE_JUNK"]),
}

#: clearer names a user might ask for; others get a "_value" suffix
RENAMES = {"text": "source_text", "s": "string", "lines": "line_list", "n": "limit",
           "cutoff": "min_score", "word": "query", "possibilities": "candidates", "a": "first",
           "b": "second", "x": "value", "o": "obj", "prefix": "leader", "width": "max_width",
           "chunks": "pieces", "delta": "diff_lines", "which": "side", "start": "first_line",
           "stop": "last_line", "length": "span", "result": "matches", "newstream": "stream",
           "newfile": "filename", "line": "current_line", "pat": "pattern", "tag": "op",
           "codes": "ops", "la": "len_a", "lb": "len_b", "matches": "match_count",
           "answer": "output", "avail": "remaining", "fullbcount": "b_counts",
           "placeholder": "ellipsis", "chunk": "piece", "reversed_chunks": "pending_chunks",
           "cur_line": "line_parts", "cur_len": "line_width", "beginning": "begin",
           "tok": "token", "raw": "token_text", "comments": "allow_comments", "posix": "posix_mode",
           "punctuation_chars": "punctuation", "chunk_trail": "tail", "ws": "whitespace",
           "markers": "seen_ids", "_iterencode": "iterate", "_encoder": "encode_str",
           "floatstr": "format_float", "chunks_list": "chunk_list", "instream": "stream",
           "infile": "filename", "nlines": "line_count", "maxcount": "max_count"}

#: the new names of functions and methods for "rename this function" requests
FUNCTION_RENAMES = {"dedent": "remove_common_indent", "indent": "prefix_lines",
                    "shorten": "truncate_text", "__init__": None, "wrap": "wrap_lines",
                    "_split": "_split_words", "_munge_whitespace": "_normalize_whitespace",
                    "_fix_sentence_endings": "_space_sentence_ends",
                    "_handle_long_word": "_break_long_word", "split": "split_command",
                    "quote": "shell_quote", "push_source": "push_stream", "pop_source": "pop_stream",
                    "sourcehook": "resolve_source", "get_token": "next_token",
                    "py_encode_basestring_ascii": "encode_ascii_string", "default": "fallback",
                    "encode": "to_json", "iterencode": "iter_chunks",
                    "get_close_matches": "closest_matches",
                    "_format_range_unified": "_unified_range", "_format_range_context": "_context_range",
                    "ratio": "similarity", "quick_ratio": "similarity_upper_bound",
                    "real_quick_ratio": "similarity_length_bound", "get_opcodes": "edit_operations",
                    "get_grouped_opcodes": "grouped_edit_operations", "set_seq2": "set_second",
                    "_plain_replace": "_replace_block", "restore": "restore_sequence",
                    "IS_LINE_JUNK": "is_blank_or_hash_line"}

INSTRUCTIONS = {
    "rename": "Rename the {what} `{old}` to `{new}` everywhere in this function and return the "
              "whole function.",
    "type-hints": "Add type hints to the parameters and the return value of this function. Return "
                  "the whole function, otherwise unchanged.",
    "docstring": "Add a docstring to this function that explains its parameters and what it "
                 "returns. Return the whole function.",
    "docstring-google": "Rewrite this function's docstring in Google style (Args:, Returns:), "
                        "keeping the code unchanged, and return the whole function.",
    "comprehension": "Convert the loops that build lists into list comprehensions where possible, "
                     "and return the whole function.",
    "f-strings": "Replace the %-formatting and str.format calls with f-strings and return the "
                 "whole function.",
    "comments": "Add a short comment above each block of this function explaining what it does, "
                "and return the whole function.",
    "rename-function": "Rename this {kind} from `{old}` to `{new}` (including any call to itself) "
                       "and return the whole {kind}.",
}


def resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def eligible(source: str, rng: random.Random) -> dict[str, dict]:
    """Instruction kind -> its template fields, for the instructions that fit this function."""
    tree = ast.parse(source)
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    is_method = bool(func.args.args) and func.args.args[0].arg in ("self", "cls")
    kinds: dict[str, dict] = {"type-hints": {}, "comments": {}}
    kinds["docstring-google" if ast.get_docstring(func) else "docstring"] = {}
    params = [a.arg for a in func.args.args + func.args.kwonlyargs if a.arg not in ("self", "cls")]
    local = sorted({n.id for n in ast.walk(func) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)} - set(params))
    names = [("parameter", p) for p in params] + [("variable", v) for v in local if len(v) > 1]
    if names:
        what, old = names[rng.randrange(len(names))]
        kinds["rename"] = {"what": what, "old": old, "new": RENAMES.get(old, f"{old}_value")}
    if FUNCTION_RENAMES.get(func.name):      # (a constructor keeps its name)
        kinds["rename-function"] = {"kind": "method" if is_method else "function", "old": func.name,
                                    "new": FUNCTION_RENAMES[func.name]}
    for node in ast.walk(func):
        if isinstance(node, (ast.For, ast.While)) and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "append"
                for c in ast.walk(node)):
            kinds["comprehension"] = {}
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
                and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"):
            kinds["f-strings"] = {}
    return kinds


def build() -> list[dict]:
    rng = random.Random(SEED)
    chosen = []
    for module, (count, names) in POOL.items():
        chosen += [(module, name) for name in rng.sample(names, count)]
    rng.shuffle(chosen)
    sources = []
    for module, qualname in chosen:
        lines, first = inspect.getsourcelines(resolve(module, qualname))
        source = textwrap.dedent("".join(lines))
        sources.append((source, first, eligible(source, rng)))
    # every instruction at least once, the scarcest first (only some functions have a loop
    # building a list, or no docstring yet); then the least used so far (ties: by the seed)
    kind_of: dict[int, str] = {}
    for kind in sorted(INSTRUCTIONS, key=lambda k: (sum(k in s[2] for s in sources), k)):
        free = [i for i, s in enumerate(sources) if kind in s[2] and i not in kind_of]
        if free:
            kind_of[rng.choice(free)] = kind
    used = {kind: list(kind_of.values()).count(kind) for kind in INSTRUCTIONS}
    for i, (_, _, kinds) in enumerate(sources):
        if i not in kind_of:
            fewest = min(used[k] for k in kinds)
            kind_of[i] = rng.choice(sorted(k for k in kinds if used[k] == fewest))
            used[kind_of[i]] += 1
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for i, (module, qualname) in enumerate(chosen):
        source, first, kinds = sources[i]
        kind = kind_of[i]
        obj = resolve(module, qualname)
        instruction = INSTRUCTIONS[kind].format(**kinds[kind])
        what = "method" if "." in qualname else "function"
        prompt = (f"Here is the {what} `{qualname}` from Python's `{module}` module.\n\n"
                  f"```python\n{source}```\n\n{instruction}")
        path = Path(inspect.getsourcefile(obj)).resolve()
        rows.append({
            "question_id": FIRST_ID + i,
            "category": CATEGORY,
            "turns": [prompt],
            "provenance": {
                "module": module, "qualname": qualname,
                "file": "Lib/" + path.relative_to(stdlib.resolve()).as_posix(),
                "first_line": first, "sha256": hashlib.sha256(source.encode()).hexdigest(),
                "python": sys.version.split()[0], "implementation": sys.implementation.name,
                "licence": LICENCE, "instruction": kind,
            },
        })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the JSON lines")
    parser.add_argument("--check", action="store_true",
                        help="regenerate and compare with --out instead of writing it")
    args = parser.parse_args()
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in build())
    if args.check:
        committed = args.out.read_text(encoding="utf-8")
        if committed == text:
            print(f"{args.out}: identical")
            return 0
        made_with = json.loads(committed.splitlines()[0])["provenance"]["python"]
        print(f"{args.out}: differs from what this interpreter builds (file made with Python "
              f"{made_with}, this is {sys.version.split()[0]})", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({text.count(chr(10))} prompts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
