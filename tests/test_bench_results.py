"""verispec.bench.results on the committed benchmark directories: the renamed α̂ field is read
both ways, `--report` rebuilds the committed tables unchanged, and `--resume` accepts them."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from verispec import bench as B
from verispec.api import SpeculativeDecoder
from verispec.prompts import Prompt

from conftest import tiny_llama
from test_bench_run import CharTokenizer

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# `verispec bench` runs: results.jsonl with its summary.json (other benchmark scripts, e.g. the
# server's and the identity check's, write rows of their own shape)
COMMITTED = sorted(p.parent for p in BENCHMARKS.rglob(B.RESULTS) if (p.parent / "summary.json").exists())
SPECULATIVE = BENCHMARKS / "llamacpp" / "llama-speculative"   # its table is written by its own script


def test_there_are_committed_runs():
    assert len(COMMITTED) >= 4 and SPECULATIVE in COMMITTED


def test_upgrade_row_reads_the_old_name():
    assert B.upgrade_row({"acceptance_rate": 0.5}) == {"draft_acceptance_rate": 0.5}
    assert B.upgrade_row({"draft_acceptance_rate": 0.25}) == {"draft_acceptance_rate": 0.25}


@pytest.mark.parametrize("directory", COMMITTED, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_committed_results_load_under_the_current_name(directory):
    raw = [json.loads(line) for line in (directory / B.RESULTS).read_text().splitlines() if line.strip()]
    rows = B.load_results(directory)
    assert len(rows) == len(raw)
    assert all("acceptance_rate" not in r for r in rows)
    for before, after in zip(raw, rows):
        if "acceptance_rate" in before:
            assert after["draft_acceptance_rate"] == before["acceptance_rate"]


@pytest.mark.parametrize("directory", [d for d in COMMITTED if d != SPECULATIVE],
                         ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_report_rebuilds_the_committed_table(directory, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(directory, copy)
    markdown = B.write_report(copy)
    assert markdown == (directory / B.TABLE).read_text()
    summary = json.loads((copy / B.SUMMARY).read_text())["summary"]
    assert all("draft_acceptance_rate" in cell and "acceptance_rate" not in cell
               for cells in summary["cells"].values() for cell in cells.values())


def test_llama_speculative_script_rebuilds_its_committed_table(tmp_path):
    spec = importlib.util.spec_from_file_location("llama_speculative",
                                                  BENCHMARKS / "llamacpp" / "llama_speculative.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    copy = tmp_path / "run"
    shutil.copytree(SPECULATIVE, copy)
    assert script.report(copy) == (SPECULATIVE / B.TABLE).read_text()


def _decoder_named_as(meta):
    """Tiny random models carrying the committed run's model names (nothing is generated)."""
    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    target.tokenizer = draft.tokenizer = CharTokenizer()
    target.name, draft.name = meta["target"], meta["draft"]
    return SpeculativeDecoder(target, draft)


@pytest.mark.parametrize("directory", [d for d in COMMITTED if (d / B.META).is_file()
                                       and json.loads((d / B.META).read_text())["backend"] == "transformers"],
                         ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_resume_accepts_a_committed_run_and_has_nothing_left_to_do(directory, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(directory, copy)
    meta = json.loads((copy / B.META).read_text())
    rows = B.load_results(copy)
    questions = list({r["question_id"]: Prompt(r["question_id"], r["category"], ("Hello?",),
                                               tuple(r["groups"])) for r in rows}.values())
    methods = list(dict.fromkeys(r["method"] for r in rows))
    decoder = _decoder_named_as(meta)
    result = B.run_bench(questions, methods, target=decoder, max_new_tokens=meta["max_new_tokens"],
                         temperature=meta["temperature"], seed=meta["seed"], out_dir=copy, resume=True,
                         meta={"command": "resume test"}, warmup=False, progress=False)
    assert (copy / B.RESULTS).read_text() == (directory / B.RESULTS).read_text()   # nothing re-run
    assert result == B.latest_rows(rows)
    new_meta = json.loads((copy / B.META).read_text())
    assert new_meta["resumed"][-1]["command"] == "resume test" and new_meta["date"] == meta["date"]
    assert B.write_report(copy) == (directory / B.TABLE).read_text().replace(
        "\n- date:", f"\n- resumed {new_meta['resumed'][-1]['date']}: `resume test`\n- date:", 1)
    with pytest.raises(B.BenchError, match="--max-new-tokens"):
        B.run_bench(questions, methods, target=decoder, max_new_tokens=meta["max_new_tokens"] + 1,
                    out_dir=copy, resume=True, warmup=False, progress=False)
