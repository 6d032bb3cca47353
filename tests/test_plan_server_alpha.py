"""α read from a live server's /metrics: a recorded vLLM page and verispec serve over HTTP."""

import json
import re
from pathlib import Path

import httpx
import pytest
from scipy.stats import beta
from test_serve_toys import toy_decoder
from typer.testing import CliRunner

from verispec.cli import app
from verispec.plan.server_alpha import (
    llama_server_flags,
    read_acceptance,
    vllm_speculative_config,
)
from verispec.serve import BackgroundServer, create_app

VLLM = (Path(__file__).parent / "fixtures" / "vllm_spec_decode_metrics.txt").read_text()
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_vllm_page_gives_conditional_alpha_per_position_with_jeffreys_intervals():
    acc = read_acceptance(VLLM, level=0.8)
    assert acc.prefix == "vllm" and acc.k_server == 3 and acc.drafts == 1200 and acc.draft_tokens == 3600
    assert acc.accepted_per_position == [960, 720, 504]
    assert [p.alpha for p in acc.positions] == pytest.approx([0.8, 0.75, 0.7])     # 960/1200, 720/960, 504/720
    assert [p.trials for p in acc.positions] == [1200, 960, 720]
    p = acc.positions[1]
    assert (p.low, p.high) == pytest.approx((beta.ppf(0.1, 720.5, 240.5), beta.ppf(0.9, 720.5, 240.5)))
    assert acc.tau == pytest.approx(1 + (960 + 720 + 504) / 1200)


def test_the_model_name_label_is_optional_and_selects_among_models():
    bare = re.sub(r'\{model_name="[^"]*",engine="0",?', "{", VLLM).replace("{}", "")
    assert "model_name" not in bare
    assert read_acceptance(bare).accepted_per_position == [960, 720, 504]
    two = VLLM + VLLM.replace(MODEL, "other").replace("960.0", "100.0")
    with pytest.raises(ValueError, match="2 models.*--metrics-model"):
        read_acceptance(two)
    assert read_acceptance(two, MODEL).accepted_per_position == [960, 720, 504]
    assert read_acceptance(two, "other").accepted_per_position[0] == 100
    with pytest.raises(ValueError, match="--metrics-model: 'nope' is not on the page"):
        read_acceptance(two, "nope")


@pytest.mark.parametrize("page,match", [("# nothing here\n", "no vllm:spec_decode_num_drafts_total"),
                                        (VLLM.replace("} 1200.0", "} 0.0"), "no drafts yet"),
                                        ("this is { not prometheus", "not a Prometheus text page")])
def test_pages_without_usable_counters_are_refused_by_name(page, match):
    with pytest.raises(ValueError, match=f"--metrics-url: .*{match}"):
        read_acceptance(page)


def test_extrapolation_beyond_the_servers_k_widens_its_interval():
    acc = read_acceptance(VLLM)
    ext = acc.extended(6)
    assert [p.measured for p in ext] == [True] * 3 + [False] * 3
    widths = [p.high - p.low for p in ext[3:]]
    assert widths == sorted(widths) and widths[0] > ext[2].high - ext[2].low
    # the logit-linear trend of 0.8, 0.75, 0.7 keeps falling
    assert ext[3].alpha < 0.7 and ext[5].alpha < ext[3].alpha
    draws = acc.draw(6, 2000, seed=1)
    assert draws.shape == (2000, 6) and abs(draws[:, 0].mean() - 0.8) < 0.01


def test_deploy_strings():
    assert json.loads(vllm_speculative_config(4, "meta-llama/Llama-3.2-1B-Instruct")) == {
        "num_speculative_tokens": 4, "model": "meta-llama/Llama-3.2-1B-Instruct"}
    assert json.loads(vllm_speculative_config(3, None))["method"] == "ngram"
    assert llama_server_flags(5, "d.gguf") == "--model-draft d.gguf --draft-max 5 --draft-min 0 --draft-p-min 0.0"


def test_verispec_serve_metrics_match_its_responses_and_plan_from_them():
    with BackgroundServer(create_app(toy_decoder(), k=3)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            drafts, per_pos = 0, [0, 0, 0]
            for prompt in ([3, 1, 4], [1, 5, 9, 2], [6, 5]):
                r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0})
                spec = r.json()["metrics"]["speculative_decoding"]
                drafts += spec["num_spec_steps"]
                per_pos = [a + b for a, b in zip(per_pos, spec["num_accepted_tokens_per_pos"] + [0, 0, 0])]
            acc = read_acceptance(client.get("/metrics").text)
            assert acc.prefix == "verispec" and acc.drafts == drafts
            assert acc.accepted_per_position == per_pos[:acc.k_server]
            r = CliRunner().invoke(app, ["plan", "--metrics-url", f"{url}/metrics", "--target", "llama-3-8b",
                                         "--draft", "llama-3.2-1b", "--hardware", "rtx4090", "--k-max", "5", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["server_acceptance"]["drafts"] == drafts and len(d["server_acceptance"]["positions"]) == 5
    assert d["alphas"][:acc.k_server] == pytest.approx([p.alpha for p in acc.positions])
    assert d["interval"]["verdict"] in ("likely a gain", "likely a loss", "uncertain")
    assert json.loads(d["deploy"]["vllm_speculative_config"])["num_speculative_tokens"] == max(d["k_star"], 1)
