"""`generate --compare`: the speedup is stated with the noise of an A/A pair of plain runs."""

import pytest

from verispec.bench.summary import compare_noise


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
