"""verispec.bench.summary: figures per (method, category) from rows, and the written report."""

import json

import pytest
from typer.testing import CliRunner

from verispec import bench as B
from verispec.cli import app


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
    assert qa["draft_acceptance_rate"] == pytest.approx(26 / 32)
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
