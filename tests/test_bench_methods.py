"""verispec.bench.methods: the one table of methods, and the option checks built on it."""

import pytest
from typer.testing import CliRunner

from verispec import bench as B
from verispec.bench.hf import HF_MODES
from verispec.cli import app
from verispec.drafters import DRAFTER_CHOICES


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
        "plain", "verispec-lookup", "verispec-suffix", "hf-prompt-lookup"]
    assert B.quick_methods("transformers")[-1] == "hf-assisted"
    # --quick without a draft model drops what needs one (it blamed --methods, never given)
    no_draft = B.quick_methods("llamacpp", has_draft=False)
    assert len(no_draft) > 1 and no_draft == B.check_methods(no_draft, "llamacpp", False)
    assert all(not B.METHODS[m].needs_draft for m in no_draft)


def test_every_method_names_a_real_drafter_choice():
    for name, spec in B.METHODS.items():
        choices = DRAFTER_CHOICES if spec.kind == "verispec" else HF_MODES
        assert spec.drafter in choices, name
        assert spec.description, name
    assert B.METHODS["plain"].k == 0 and not B.METHODS["plain"].needs_draft


def test_cli_help_lists_the_methods_from_the_table():
    out = " ".join(CliRunner().invoke(app, ["bench", "--help"], terminal_width=200).output.split())
    for name in B.METHODS:
        assert name in out, name
