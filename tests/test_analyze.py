"""verispec.analyze end to end on toy models (fake clock), analysis.json round trip, and the CLI.

Toy models only (FunctionModel, fake clock): no real models, no sleeps, no timings.
"""

import json

import pytest

from verispec import analyze as an
from verispec.predict import predict_from_analysis
from verispec.prompts import Prompt
from verispec.report.analysis import closing_notes, render_tables

from conftest import successor

V = 6


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- end to end (toy)


def test_run_analysis_end_to_end_writes_json_and_plots(tmp_path):
    tick = {"n": 0}

    def fake_clock():   # advances 1 ms per reading: deterministic, positive durations
        tick["n"] += 1
        return tick["n"] * 1e-3

    target, draft = successor(name="p"), successor(wrong_after=2, name="q")
    prompts = [Prompt(1, "qa", ("0",), ("qa",), 1), Prompt(2, "qa", ("3",), ("qa",), 2),
               Prompt(3, "coding", ("1",), ("multi-turn", "coding"), 3)]
    config = an.AnalyzeConfig(k_max=3, max_new_tokens=20, prefix_tokens=8, repeats=3, warmup=1,
                              measure=True)
    analysis = an.run_analysis(target, prompts, lambda text: [int(text)], config, drafter_kind="model",
                               draft=draft, clock=fake_clock)
    assert list(analysis["categories"]) == ["qa", "multi-turn", "coding"]
    # a prompt selected for two groups counts in both, and once overall
    assert analysis["categories"]["coding"]["n_points"] == analysis["categories"]["multi-turn"]["n_points"]
    assert analysis["prompts"][2]["groups"] == ["multi-turn", "coding"]
    assert analysis["prompts"][2]["raw_category"] == "coding" and analysis["prompts"][2]["id"] == "3"
    assert analysis["prompt_selection"] == an.PROMPT_SELECTION
    qa = analysis["categories"]["qa"]
    assert qa["n_prompts"] == 2 and len(qa["prompt_alphas"]) == 2
    assert qa["n_points"] == sum(len(p["points"]) for p in analysis["prompts"] if p["category"] == "qa")
    assert analysis["overall"]["n_points"] == sum(len(p["points"]) for p in analysis["prompts"])
    cm = analysis["cost_curve"]
    assert cm["target_times"] == pytest.approx([1e-3] * 4) and cm["draft_time"] == pytest.approx(1e-3)
    sp = analysis["overall"]["speedup"]
    assert len(sp["constant"]) == len(sp["curve"]) == 4
    assert {r["k"] for r in analysis["measured"]["qa"]["points"]} == {0, 1, 2, 3}
    pred = predict_from_analysis(analysis, "qa", k=2)
    assert pred["speedup"] == pytest.approx(analysis["categories"]["qa"]["speedup"]["curve"][2])
    assert predict_from_analysis(analysis, model="constant")["k"] == sp["k_star_constant"]
    assert predict_from_analysis(analysis, model="curve+")["k"] == sp["k_star_refeed"]
    assert predict_from_analysis(analysis, "qa", k=1, model="curve+")["speedup"] == pytest.approx(
        analysis["categories"]["qa"]["speedup"]["refeed"][1])
    paths = an.write_outputs(analysis, tmp_path / "out")
    for p in paths.values():
        assert p.stat().st_size > 0
    loaded = an.load_analysis(tmp_path / "out")
    assert loaded["overall"]["alphas"] == pytest.approx(analysis["overall"]["alphas"])
    assert loaded["prompt_selection"]["version"] == 2
    assert predict_from_analysis(loaded, k="auto") == predict_from_analysis(analysis, k="auto")
    assert render_tables(analysis) and closing_notes(analysis)
    assert not any("older prompt selection" in line for line in closing_notes(analysis))
    with pytest.raises(ValueError, match="draft model"):
        an.run_analysis(target, prompts, lambda t: [int(t)], config, drafter_kind="model", draft=None)
    with pytest.raises(ValueError, match="drafter"):
        an.run_analysis(target, prompts, lambda t: [int(t)], config, drafter_kind="eagle", draft=draft)


def test_committed_analysis_is_read_as_made_with_the_old_prompt_selection():
    """benchmarks/analysis-llamacpp predates the shared prompt selection: reading it says so."""
    from pathlib import Path

    committed = Path(__file__).resolve().parent.parent / "benchmarks" / "analysis-llamacpp"
    analysis = an.load_analysis(committed)
    assert "prompt_selection" not in json.loads((committed / "analysis.json").read_text())
    assert analysis["prompt_selection"]["version"] == 1
    # its multi-turn prompts are MT-Bench's first three rows in file order (all "writing")
    assert {p["raw_category"] for p in analysis["prompts"] if p["category"] == "multi-turn"} == {"writing"}
    assert any("older prompt selection" in line for line in closing_notes(analysis))
    assert len(render_tables(analysis)) == 3
    assert predict_from_analysis(analysis)["k"] == analysis["overall"]["speedup"]["k_star_curve"]


def test_cli_analyze_reports_prompt_file_errors_before_loading_models(tmp_path):
    from typer.testing import CliRunner

    from verispec.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["analyze", "--prompts", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "missing.jsonl" in res.output
    bad = write(tmp_path, "bad.jsonl", '{"category": "qa", "turns": ["hi"]}\n{nope\n')
    res = runner.invoke(app, ["analyze", "--prompts", str(bad)])
    assert res.exit_code == 2 and "line 2" in res.output
    res = runner.invoke(app, ["analyze", "--prompts", str(bad), "--drafter", "eagle"])
    assert res.exit_code == 2 and "--drafter" in res.output
    res = runner.invoke(app, ["analyze", "--dataset", str(bad)])    # bench's name for the same option
    assert res.exit_code == 2 and "line 2" in res.output
    res = runner.invoke(app, ["analyze", "--prompts", str(bad), "--per-category", "-1"])
    assert res.exit_code == 2 and "--per-category" in res.output
    res = runner.invoke(app, ["analyze", "--k-max", "0"])
    assert res.exit_code == 2 and "--k-max" in res.output
