"""The bench command line: bad options are refused, naming the option, before models load.

The audit and generate commands' early refusals are checked here too (they shared this file).
"""

import json

import pytest
from typer.testing import CliRunner

from verispec import prompts as P
from verispec.cli import app


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [("qa", "Who wrote book 0?"), ("writing", "Write a poem."), ("coding", "Sort a list.")]
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n"
                            for i, (c, t) in enumerate(rows, start=1)))
    return path


@pytest.mark.parametrize("args, match", [
    (["--methods", "plain,turbo"], "--methods: unknown method 'turbo'"),
    (["--methods", "hf-assisted", "--backend", "llamacpp"], "needs --backend transformers"),
    (["--per-category", "-1"], "--per-category"),
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
    monkeypatch.delenv(P.ENV_VAR, raising=False)
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
