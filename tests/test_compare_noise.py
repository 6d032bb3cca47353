"""`generate --compare`: the speedup is stated with the noise of an A/A pair of plain runs."""

import pytest

from verispec.bench.summary import compare_noise

from test_tables import registered  # noqa: F401  (the fixture: a toy backend registered in one line)


def test_a_ratio_inside_the_aa_spread_is_called_noise():
    got = compare_noise(9.9, [10.0, 9.6])           # plain twice: 10.0 and 9.6 tok/s
    assert got["speedup"] == pytest.approx(9.9 / 9.8)
    assert got["aa_ratio"] == pytest.approx(0.96)
    assert got["noise"] == pytest.approx(0.2 / 9.8)
    assert got["within_noise"]


def test_a_ratio_beyond_the_aa_spread_is_not():
    got = compare_noise(13.0, [10.0, 10.1])
    assert got["speedup"] > 1.2 and not got["within_noise"]
    assert not compare_noise(7.0, [10.0, 10.1])["within_noise"]     # a real slowdown too


def test_bad_input_names_what_is_missing():
    with pytest.raises(ValueError, match="two plain runs"):
        compare_noise(10.0, [10.0])
    with pytest.raises(ValueError, match="> 0"):
        compare_noise(0.0, [10.0, 10.0])


def test_compare_with_nothing_drafted_calls_its_ratio_noise(registered):
    """`generate --compare` on a run that drafted nothing (every round plain): whatever the
    timings, its ratio is noise, never a speedup (a user read 1.31x on such a run)."""
    import json

    from typer.testing import CliRunner

    from verispec.cli import app

    args = ["generate", "abcabc", "--target", "anything", "--backend", "chars", "--k", "0",
            "--max-new-tokens", "8", "--no-chat-template", "--compare"]
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout.strip().splitlines()[-1])
    assert out["drafted"] == 0 and out["within_noise"] is True
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "nothing was drafted, so this run was plain decoding" in " ".join(text.output.split())
