"""`verispec audit`: the rule options, the significance level and its deprecated spelling.

All of these run the exact enumeration on the seed example (`--exact`, no model) or
fail before any model is loaded.
"""

import json

import pytest
from typer.testing import CliRunner

from verispec.cli import app


def run(*args):
    result = CliRunner().invoke(app, ["audit", *args])
    return result, " ".join(result.output.split())


def test_exact_json_names_and_verdicts_for_every_exact_rule():
    result, _ = run("--exact", "--json", "--k", "2", "--rule", "gumbel",
                    "--rules", "verispec,standard,gumbel,naive-agree,naive-always-accept")
    assert result.exit_code == 0, result.output
    reports = {r["rule"]: r for r in json.loads(result.stdout)}
    assert list(reports) == ["verispec", "standard", "gumbel", "naive-agree", "naive-always-accept"]
    for name in ("verispec", "standard", "gumbel"):
        assert reports[name]["verdict"] == "exact" and reports[name]["tv"] <= 1e-12
    for name in ("naive-agree", "naive-always-accept"):
        assert reports[name]["verdict"] == "biased" and reports[name]["tv"] > 1e-3


def test_the_default_exact_audit_is_verispec_and_the_shortcuts():
    result, _ = run("--exact", "--json", "--k", "2")
    assert result.exit_code == 0, result.output
    assert [r["rule"] for r in json.loads(result.stdout)] == [
        "verispec", "naive-agree", "naive-always-accept"]


def test_alpha_is_a_deprecated_hidden_spelling_of_significance():
    result, out = run("--exact", "--k", "1", "--rules", "verispec", "--alpha", "0.05")
    assert result.exit_code == 0 and "--alpha is deprecated" in out and "--significance" in out
    help_text = CliRunner().invoke(app, ["audit", "--help"]).output
    assert "--significance" in help_text and "--alpha" not in help_text


@pytest.mark.parametrize("args, match", [
    (["--significance", "0"], "--significance is a significance level and must be in (0, 1)"),
    (["--significance", "1.5"], "--significance is a significance level"),
    (["--alpha", "1.5"], "--alpha is a significance level"),
    (["--significance", "0.1", "--alpha", "0.2"], "--significance 0.1 and --alpha 0.2 disagree"),
    (["--rule", "nope"], "--rule must be one of standard, gumbel"),
    (["--rules", "verispec,nope"], "--rules: unknown ['nope']"),
    (["--rules", " , "], "--rules is empty"),
    (["--exact", "--rules", "verispec,hf-assisted"], "--rules hf-assisted has no exact enumeration"),
])
def test_bad_options_are_refused_before_loading_models(args, match):
    result, out = run("--target", "/nonexistent", *args)
    assert result.exit_code == 2 and match in out, out
