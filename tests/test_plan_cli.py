"""`verispec plan` on the command line: output, JSON, plot, and clear refusals naming the flag."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verispec.cli import app

ANALYSIS = Path(__file__).resolve().parents[1] / "benchmarks" / "analysis-llamacpp" / "analysis.json"


def run(*args):
    return CliRunner().invoke(app, ["plan", *args])


def test_plan_prints_cost_curve_speedups_and_verdict():
    r = run("--target", "llama-3-70b", "--draft", "llama-3.2-1b", "--hardware", "2xh100", "--alpha", "0.75")
    assert r.exit_code == 0, r.output
    for text in ("predicted cost curve", "T_d", "c =", "speedup vs draft length", "k* =", "ceiling at α = 1",
                 "speculation pays for α >"):
        assert text in r.output


def test_plan_json_and_plot(tmp_path):
    png = tmp_path / "plan.png"
    r = run("--target", "qwen2.5-7b", "--draft", "qwen2.5-0.5b", "--hardware", "bw=1008GB/s,flops=165T,mem=24GB",
            "--alpha", "0.7", "--k-max", "5", "--context", "1024", "--json", "--plot", str(png))
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["target_times"]) == 6 and len(d["speedups"]) == 6 and d["context"] == 1024
    assert d["speedups"][0] == 1.0 and d["speedups"][d["k_star"]] == d["speedup_star"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_with_tau_and_lookup():
    r = run("--target", "llama-2-7b", "--drafter", "lookup", "--hardware", "a100", "--tau", "2.0", "--tau-k", "4",
            "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["draft"] is None and d["draft_time"] == 0 and d["alpha_source"].startswith("--tau")


def test_plan_alpha_from_analysis_uses_its_models_and_alphas():
    r = run("--alpha-from", str(ANALYSIS), "--target", "qwen2.5-1.5b", "--draft", "qwen2.5-0.5b",
            "--hardware", "rtx4090", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["alphas"] == pytest.approx(json.loads(ANALYSIS.read_text())["overall"]["alphas"][:d["k_max"]])
    assert any("measured where the analysis ran" in n for n in d["notes"])


@pytest.mark.parametrize("args,flag", [
    (["--alpha", "1.0"], "--alpha"),
    (["--alpha", "0"], "--alpha"),
    (["--alpha", "1.5"], "--alpha"),
    (["--alpha", "0.7", "--dtype", "int3"], "--dtype"),
    (["--alpha", "0.7", "--k-max", "0"], "--k-max"),
    (["--alpha", "0.7", "--context", "-5"], "--context"),
    (["--alpha", "0.7", "--batch", "0"], "--batch"),
    (["--alpha", "0.7", "--tau-k", "3"], "--tau-k"),
    (["--tau", "9", "--tau-k", "3"], "--tau"),
    (["--alpha", "0.7", "--alpha-from", "x.json"], "--alpha and --alpha-from"),
    (["--alpha", "0.7", "--plot", "out.jpg"], "--plot"),
    (["--alpha", "0.7", "--stack", "warp-drive"], "--stack"),
    (["--alpha", "0.7", "--drafter", "magic"], "--drafter"),
])
def test_bad_inputs_are_refused_naming_the_flag(args, flag):
    r = run("--target", "llama-2-7b", "--draft", "vicuna-68m", "--hardware", "a100", *args)
    assert r.exit_code == 2, r.output
    assert "error:" in r.output and flag in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args,text", [
    (["--target", "llama-2-7b", "--draft", "vicuna-68m", "--alpha", "0.7"], "--hardware is required"),
    (["--target", "llama-2-7b", "--draft", "vicuna-68m", "--hardware", "bw=fast,flops=1T", "--alpha", "0.7"],
     "--hardware: cannot read bandwidth"),
    (["--target", "llama-2-7b", "--draft", "vicuna-68m", "--hardware", "warp9", "--alpha", "0.7"],
     "--hardware: unknown hardware"),
    (["--target", "llama-2-70b", "--draft", "llama-2-7b", "--hardware", "rtx4090", "--alpha", "0.7"],
     "holds 24.0 GB"),
    (["--target", "no-such-model", "--draft", "vicuna-68m", "--hardware", "a100", "--alpha", "0.7"],
     "--target: unknown model"),
    (["--target", "llama-2-7b", "--draft", "./nowhere/config.json", "--hardware", "a100", "--alpha", "0.7"],
     "--draft: no config.json"),
    (["--target", "llama-2-7b", "--hardware", "a100", "--alpha", "0.7"], "--draft is required"),
    (["--draft", "vicuna-68m", "--hardware", "a100", "--alpha", "0.7"], "--target is required"),
    (["--alpha-from", "/nonexistent/analysis.json", "--hardware", "a100"], "--alpha-from: cannot read"),
    (["--target", "llama-2-7b", "--draft", "vicuna-68m", "--hardware", "apple m4 ultra", "--alpha", "0.7"],
     "did you mean"),
    (["--target", "llama-2-7b", "--draft", "vicuna-68m", "--hardware", "a100", "--alpha", "0.7",
      "--calibrate", "smollm2-135m"], "--calibrate needs --hardware local"),
])
def test_bad_models_and_hardware_are_refused_clearly(args, text):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert text in r.output and "Traceback" not in r.output


def test_analyze_refuses_a_bad_hardware_before_loading_models(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    r = CliRunner().invoke(app, ["analyze", "--prompts", str(prompts), "--hardware", "warp9"])
    assert r.exit_code == 2 and "--hardware: unknown hardware 'warp9'" in r.output


def test_analyze_hardware_projects_the_measured_alpha_and_writes_plan_json(tmp_path, monkeypatch):
    """The analysis itself is faked (the committed llama.cpp analysis, models renamed to presets so
    no weights are needed); what is tested is the --hardware hand-off to the planner."""
    import sys
    import types

    import verispec.analyze as an

    cli_analyze = sys.modules["verispec.cli.analyze"]   # the package attribute is the command function

    data = json.loads(ANALYSIS.read_text())
    data.update(target="qwen2.5-1.5b", draft="qwen2.5-0.5b")
    fake = types.SimpleNamespace(target=types.SimpleNamespace(eos_token_ids=(), vocab_size=151936),
                                 draft=None, encode=None, tokenizer=None)
    monkeypatch.setattr(cli_analyze, "build_decoder", lambda *a, **k: (fake, "llamacpp"))
    monkeypatch.setattr(an, "run_analysis", lambda *a, **k: json.loads(json.dumps(data)))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["analyze", "--prompts", str(prompts), "--out", str(out), "--hardware", "h100",
                                 "--json"])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    saved = json.loads((out / "plan.json").read_text())
    assert printed["projection"]["k_star"] == saved["k_star"] and saved["hardware"]["name"] == "H100 SXM5"
    assert saved["alphas"] == pytest.approx(data["overall"]["alphas"][:saved["k_max"]])
    r = CliRunner().invoke(app, ["analyze", "--prompts", str(prompts), "--out", str(out), "--hardware", "h100"])
    assert r.exit_code == 0 and "predicted cost curve" in r.output and "k* =" in r.output


def test_any_registered_drafter_is_planned_for():
    """--drafter reads the DRAFTERS table: a model-free drafter (suffix) needs no --draft,
    and plans as prompt lookup does (no drafting cost)."""
    suffix = run("--target", "llama-2-7b", "--hardware", "a100", "--alpha", "0.6", "--drafter", "suffix")
    lookup = run("--target", "llama-2-7b", "--hardware", "a100", "--alpha", "0.6", "--drafter", "lookup")
    assert suffix.exit_code == 0 and lookup.exit_code == 0, suffix.output + lookup.output
    assert "k* =" in suffix.output and suffix.output.split("k* =")[1][:20] == lookup.output.split("k* =")[1][:20]
    needs = run("--target", "llama-2-7b", "--hardware", "a100", "--alpha", "0.6", "--drafter", "model")
    assert needs.exit_code == 2 and "--draft is required with --drafter model" in needs.output
