import json

import pytest
from typer.testing import CliRunner

from verispec import bench as B
from verispec.api import SpeculativeDecoder
from verispec.cli import app

from conftest import tiny_llama

ROWS = (
    [("translation", f"Translate sentence {i}.") for i in range(3)]
    + [("qa", f"Who wrote book {i}?") for i in range(2)]
    + [("writing", "Write a poem."), ("writing", "Write a haiku."), ("roleplay", "Play a pirate."),
       ("coding", "Sort a list."), ("coding", "Reverse a string.")]
)


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "question.jsonl"
    with path.open("w") as f:
        for i, (cat, text) in enumerate(ROWS, start=1):
            turns = [text, "And now?"] if cat in B.MT_BENCH_CATEGORIES else [text]
            f.write(json.dumps({"question_id": i, "category": cat, "turns": turns}) + "\n")
    return path


# --------------------------------------------------------------------------- questions
def test_first_n_per_category_in_file_order(dataset):
    qs = B.load_questions(dataset, ["translation", "qa"], per_category=2)
    assert [(q.question_id, q.category, q.groups) for q in qs] == [
        (1, "translation", ("translation",)), (2, "translation", ("translation",)),
        (4, "qa", ("qa",)), (5, "qa", ("qa",))]
    assert qs[0].prompt == "Translate sentence 0."
    # fewer rows than asked: all of them
    assert len(B.load_questions(dataset, ["qa"], per_category=5)) == 2


def test_multi_turn_is_spread_round_robin_over_sub_categories_first_turn_only(dataset):
    qs = B.load_questions(dataset, ["multi-turn"], per_category=4)
    # writing #1, roleplay #1, coding #1, then writing #2
    assert [(q.question_id, q.category) for q in qs] == [(6, "writing"), (8, "roleplay"),
                                                        (9, "coding"), (7, "writing")]
    assert all(q.groups == ("multi-turn",) for q in qs)
    assert qs[0].prompt == "Write a poem." and len(qs[0].turns) == 2
    assert [q.question_id for q in B.load_questions(dataset, ["multi_turn"], 1)] == [6]  # alias


def test_raw_coding_category_alone_and_together_with_multi_turn(dataset):
    assert [q.question_id for q in B.load_questions(dataset, ["coding"], 3)] == [9, 10]
    qs = B.load_questions(dataset, ["multi-turn", "coding"], per_category=3)
    groups = {q.question_id: q.groups for q in qs}
    assert groups == {6: ("multi-turn",), 8: ("multi-turn",), 9: ("multi-turn", "coding"),
                      10: ("coding",)}
    assert len(qs) == 4   # a row selected twice is run once


def test_default_categories_are_the_six_spec_bench_columns(dataset):
    with pytest.raises(B.BenchError, match="--categories: 'summarization' has no rows"):
        B.load_questions(dataset, None, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"per_category": 0}, "--per-category"),
    ({"per_category": 2.5}, "--per-category"),
    ({"categories": ["poetry"]}, "--categories: unknown category 'poetry'"),
])
def test_bad_selection_errors_name_the_option(dataset, kwargs, match):
    with pytest.raises(B.BenchError, match=match):
        B.load_questions(dataset, **{"categories": ["qa"], "per_category": 1, **kwargs})


def test_dataset_errors(tmp_path, monkeypatch):
    with pytest.raises(B.BenchError, match="--dataset"):
        B.load_questions(tmp_path / "missing.jsonl", ["qa"], 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["x"]}\n{"oops": 1}\n')
    with pytest.raises(B.BenchError, match="line 2"):
        B.load_questions(bad, ["qa"], 1)
    monkeypatch.setenv(B.DATASET_ENV, str(bad))
    assert B.resolve_dataset(None) == bad
    assert B.resolve_dataset(str(bad)) == bad
    with pytest.raises(B.BenchError, match="--dataset"):
        B.resolve_dataset(str(tmp_path / "nope.jsonl"))
    monkeypatch.setenv(B.DATASET_ENV, str(tmp_path / "nope.jsonl"))
    with pytest.raises(B.BenchError, match=B.DATASET_ENV):
        B.resolve_dataset(None)


def test_check_methods():
    assert B.check_methods(["verispec", "verispec-lookup"], "llamacpp", True) == [
        "plain", "verispec", "verispec-lookup"]
    with pytest.raises(B.BenchError, match="--methods: unknown method 'fast'"):
        B.check_methods(["fast"], "llamacpp", True)
    with pytest.raises(B.BenchError, match="--methods: hf-assisted needs --backend transformers"):
        B.check_methods(["hf-assisted"], "llamacpp", True)
    with pytest.raises(B.BenchError, match="--methods: verispec-k4 needs a draft model"):
        B.check_methods(["verispec-k4"], "transformers", False)
    assert "hf-assisted" not in B.default_methods("llamacpp")
    assert B.default_methods("transformers", has_draft=False) == [
        "plain", "verispec-lookup", "hf-prompt-lookup"]
    assert B.quick_methods("transformers")[-1] == "hf-assisted"


# --------------------------------------------------------------------------- summary
def _row(qid, cat, method, tokens, seconds, forwards=None, **kw):
    return {"question_id": qid, "category": cat, "groups": [cat], "method": method,
            "new_tokens": tokens, "wall_seconds": seconds, "target_forwards": forwards,
            "error": None, **kw}


def synthetic_rows():
    return [
        _row(1, "qa", "plain", 10, 2.0, 10),
        _row(1, "qa", "verispec", 10, 1.0, 4, drafted=12, accepted=6, alpha_sum=7.0, reached=[4, 3],
             identical_to_plain=True),
        _row(2, "qa", "plain", 30, 4.0, 30),
        _row(2, "qa", "verispec", 30, 3.0, 10, drafted=20, accepted=20, alpha_sum=9.0, reached=[5, 4],
             identical_to_plain=False),
        _row(3, "rag", "plain", 20, 5.0, 20),
        _row(3, "rag", "verispec", 20, 2.0, 5, identical_to_plain=True),
        _row(3, "rag", "hf-assisted", 0, None, error="RuntimeError: boom"),
    ]


def test_summarize_speedup_is_ratio_of_aggregated_tokens_per_second():
    s = B.summarize(synthetic_rows())
    assert s["categories"] == ["qa", "rag", "overall"]
    assert s["methods"] == ["plain", "verispec", "hf-assisted"]
    qa = s["cells"]["verispec"]["qa"]
    assert qa["prompts"] == 2
    assert qa["speedup"] == pytest.approx((40 / 4.0) / (40 / 6.0))   # = 6 s / 4 s
    assert qa["tau"] == pytest.approx(40 / 14)
    assert qa["acceptance_rate"] == pytest.approx(26 / 32)
    assert qa["alpha_exact"] == pytest.approx(16 / 16)
    assert (qa["identical"], qa["compared"]) == (1, 2)
    overall = s["cells"]["verispec"]["overall"]
    assert overall["speedup"] == pytest.approx(11.0 / 6.0)   # Σ plain s / Σ verispec s
    assert s["cells"]["plain"]["overall"]["speedup"] == pytest.approx(1.0)
    assert s["cells"]["plain"]["overall"]["tau"] == pytest.approx(1.0)
    hf = s["cells"]["hf-assisted"]["rag"]
    assert hf["prompts"] == 0 and hf["speedup"] is None and hf["errors"] == 1


def test_summarize_differing_lengths_and_superseded_rows():
    rows = [_row(1, "qa", "plain", 10, 1.0, 10), _row(1, "qa", "m", 20, 1.0, 5),
            _row(2, "qa", "m", 0, None, error="boom"),       # no plain for q2: not counted
            _row(1, "qa", "m", 20, 4.0, 5)]                  # supersedes the first m row
    cell = B.summarize(rows)["cells"]["m"]["qa"]
    assert cell["prompts"] == 1 and cell["speedup"] == pytest.approx((20 / 4.0) / (10 / 1.0))


def test_render_markdown_tables():
    meta = {"command": "verispec bench --quick", "backend": "llamacpp", "target": "t", "draft": "d",
            "max_new_tokens": 32, "temperature": 0.0, "seed": 0,
            "machine": {"cpu": "AMD EPYC", "cores": 2, "usable_cores": 2, "torch_threads": 2},
            "versions": {"python": "3.11", "torch": "2.13.0"}}
    md = B.render_markdown(B.summarize(synthetic_rows()), meta)
    assert "first turn only" in md.lower() and "`verispec bench --quick`" in md and "AMD EPYC" in md
    assert "| method | qa | rag | overall |" in md
    assert "| plain | 1.00× (1.00) | 1.00× (1.00) | 1.00× (1.00) |" in md
    assert "| verispec | 1.50× (2.86) | 2.50× (4.00) | 1.83× (3.16) |" in md
    assert "| hf-assisted | – | – | – |" in md
    assert "| verispec | 1/2 | 1/1 | 2/3 |" in md        # greedy-identical table
    assert "RuntimeError: boom" in md
    sampled = B.render_markdown(B.summarize(synthetic_rows()), {**meta, "temperature": 0.7})
    assert "n/a: sampling" in sampled


def test_write_report_from_results_file(tmp_path):
    (tmp_path / B.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows())
                                      + '{"truncated": ')    # an interrupted last write
    (tmp_path / B.META).write_text(json.dumps({"temperature": 0.0, "methods": ["plain", "verispec"]}))
    md = B.write_report(tmp_path)
    assert "| verispec |" in md and "hf-assisted" not in md.split("## Errors")[0]
    assert (tmp_path / B.TABLE).read_text() == md
    assert json.loads((tmp_path / B.SUMMARY).read_text())["summary"]["cells"]["verispec"]
    assert (tmp_path / B.PLOT).read_bytes()[:4] == b"\x89PNG"
    result = CliRunner().invoke(app, ["bench", "--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "| verispec |" in result.output
    with pytest.raises(B.BenchError, match="--report"):
        B.write_report(tmp_path / "empty")


def test_done_pairs_skip_errors_and_use_latest():
    rows = [_row(1, "qa", "plain", 1, 1.0), _row(1, "qa", "m", 0, None, error="x"),
            _row(2, "qa", "m", 1, 1.0), _row(2, "qa", "m", 0, None, error="x")]
    assert B.done_pairs(rows) == {(1, "plain")}


# --------------------------------------------------------------------------- run_bench
class CharTokenizer:
    """One id per character (ids 1..90), no chat template."""

    chat_template = None
    eos_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + int(i) % 90) for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(96)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one thread, especially on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_decoder():
    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    target.tokenizer = draft.tokenizer = CharTokenizer()
    return SpeculativeDecoder(target, draft)


def test_run_bench_end_to_end_on_tiny_models(tiny_decoder, dataset, tmp_path):
    qs = B.load_questions(dataset, ["qa", "coding"], per_category=1)
    methods = ["verispec", "verispec-k4", "verispec-lookup", "verispec-auto", "hf-plain",
               "hf-assisted", "hf-prompt-lookup"]
    rows = B.run_bench(qs, methods, target=tiny_decoder, max_new_tokens=16, out_dir=tmp_path,
                       meta={"command": "test"}, warmup=False, progress=False)
    assert len(rows) == 2 * 8
    assert [r["method"] for r in rows[:8]] == ["plain", *methods]    # interleaved, plain first
    for r in rows:
        assert r["error"] is None, r
        assert r["new_tokens"] == 16 and r["wall_seconds"] > 0 and r["finish_reason"] == "length"
        assert r["tau"] >= 1.0
        if r["method"] != "plain":
            assert r["identical_to_plain"] is True, r["method"]     # greedy: exact
    k4 = next(r for r in rows if r["method"] == "verispec-k4")
    assert k4["drafted"] > 0 and set(k4["k_hist"]) <= {"none:0"} | {f"model:{k}" for k in range(1, 5)}
    assert k4["acceptance_rate"] is not None and k4["alpha_exact"] is not None
    assert next(r for r in rows if r["method"] == "hf-assisted")["draft_forwards"] > 0
    plain = next(r for r in rows if r["method"] == "plain")
    assert plain["tau"] == 1.0 and plain["target_forwards"] == 16
    on_disk = B.load_results(tmp_path)
    assert len(on_disk) == 16
    meta = json.loads((tmp_path / B.META).read_text())
    assert meta["backend"] == "transformers" and meta["command"] == "test"
    assert meta["machine"]["cores"] and meta["versions"]["torch"]
    assert all(r["loadavg"] is not None for r in rows)
    md = B.write_report(tmp_path)
    assert "| method | qa | coding | overall |" in md
    assert "| verispec-k4 | 1/1 | 1/1 | 2/2 |" in md

    # existing results: refuse without resume/overwrite; resume with other settings: refuse
    with pytest.raises(B.BenchError, match="--resume"):
        B.run_bench(qs, ["verispec"], target=tiny_decoder, max_new_tokens=16, out_dir=tmp_path,
                    progress=False)
    with pytest.raises(B.BenchError, match="--max-new-tokens 16"):
        B.run_bench(qs, ["verispec"], target=tiny_decoder, max_new_tokens=8, out_dir=tmp_path,
                    resume=True, progress=False)


def test_resume_runs_only_missing_pairs_and_records_errors(tiny_decoder, dataset, tmp_path,
                                                           monkeypatch):
    qs = B.load_questions(dataset, ["qa", "translation"], per_category=1)
    real = B._verispec_run

    def flaky(decoder, ids, spec, *args):
        if spec.k == 4 and ids == tiny_decoder.encode(qs[0].prompt):
            raise RuntimeError("injected failure")
        return real(decoder, ids, spec, *args)

    monkeypatch.setattr(B, "_verispec_run", flaky)
    rows = B.run_bench(qs, ["plain", "verispec-k4", "verispec-lookup"], target=tiny_decoder,
                       max_new_tokens=12, out_dir=tmp_path, progress=False)
    failed = [r for r in rows if r["error"]]
    assert [(r["question_id"], r["method"]) for r in failed] == [(qs[0].question_id, "verispec-k4")]
    assert "injected failure" in failed[0]["error"]
    assert sum(1 for r in rows if not r["error"]) == 5      # the run went on

    # drop q2's lookup row (as if interrupted), then resume with the failure gone
    lines = (tmp_path / B.RESULTS).read_text().splitlines()
    kept = [ln for ln in lines if not (json.loads(ln)["question_id"] == qs[1].question_id
                                       and json.loads(ln)["method"] == "verispec-lookup")]
    (tmp_path / B.RESULTS).write_text("\n".join(kept) + "\n")
    monkeypatch.setattr(B, "_verispec_run", real)
    ran = []
    monkeypatch.setattr(B, "_verispec_run",
                        lambda d, ids, spec, *a: ran.append(spec) or real(d, ids, spec, *a))
    rows = B.run_bench(qs, ["plain", "verispec-k4", "verispec-lookup"], target=tiny_decoder,
                       max_new_tokens=12, out_dir=tmp_path, resume=True, warmup=False,
                       progress=False)
    # only the errored pair and the missing pair ran (plain of both prompts was kept)
    assert [(s.drafter, s.k) for s in ran] == [("model", 4), ("lookup", "auto")]
    assert len(rows) == 6 and not any(r["error"] for r in rows)
    assert all(r["identical_to_plain"] for r in rows if r["method"] != "plain")
    assert len(B.load_results(tmp_path)) == len(kept) + 2
    assert len(json.loads((tmp_path / B.META).read_text())["resumed"]) == 1


# --------------------------------------------------------------------------- CLI errors
@pytest.mark.parametrize("args, match", [
    (["--methods", "plain,turbo"], "--methods: unknown method 'turbo'"),
    (["--methods", "hf-assisted", "--backend", "llamacpp"], "needs --backend transformers"),
    (["--per-category", "0"], "--per-category"),
    (["--categories", "poetry"], "--categories: unknown category"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--draft", "none", "--methods", "verispec"], "needs a draft model"),
    (["--out", "pyproject.toml"], "--out pyproject.toml is a file"),
    (["--temperature", "-1"], "--temperature must be finite and >= 0"),
    (["--temperature", "inf"], "--temperature must be finite and >= 0"),
])
def test_cli_rejects_bad_options_before_loading_models(dataset, args, match):
    result = CliRunner().invoke(app, ["bench", "--dataset", str(dataset), "--backend", "transformers",
                                      *args])
    assert result.exit_code == 2
    assert match in " ".join(result.output.split())


def test_cli_missing_dataset(tmp_path, monkeypatch):
    monkeypatch.delenv(B.DATASET_ENV, raising=False)
    result = CliRunner().invoke(app, ["bench", "--dataset", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "--dataset" in result.output


@pytest.mark.parametrize("args, match", [
    (["--alpha", "0"], "--alpha"), (["--alpha", "1.5"], "--alpha"),
    (["--prompt", "  "], "--prompt is empty"),
    (["--temperature", "inf"], "--temperature must be finite"),
    (["--top-p", "2"], "--top-p"),
    (["--rules", ""], "--rules is empty"),
])
def test_cli_audit_rejects_bad_options_before_loading_models(args, match):
    result = CliRunner().invoke(app, ["audit", "--target", "/nonexistent", *args])
    assert result.exit_code == 2
    assert match in " ".join(result.output.split())


def test_cli_draft_self_without_layers_is_one_clear_error():
    result = CliRunner().invoke(app, ["generate", "hi", "--target", "smollm2-135m", "--draft", "self",
                                      "--backend", "transformers"])
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert "--draft self needs --draft-layers N" in out and "error: 2" not in out


def test_cli_generate_refuses_an_empty_stop_string_before_loading():
    result = CliRunner().invoke(app, ["generate", "hi", "--target", "/nonexistent", "--stop", ""])
    assert result.exit_code == 2 and "--stop needs a non-empty string" in result.output
