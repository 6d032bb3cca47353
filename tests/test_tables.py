"""A new backend, drafter and rule is one line in one table each: registered here in one
line apiece (monkeypatch.setitem), they work through `generate`, the CLI (`verispec
generate`) and the server (real HTTP on 127.0.0.1) without any other change, and
greedy output stays the target's own."""

import json

import httpx
import pytest
import torch
from typer.testing import CliRunner

from verispec.api import SpeculativeDecoder, load_model
from verispec.cli import app
from verispec.drafters import DRAFTERS, DrafterKind
from verispec.models import BACKENDS, BackendKind
from verispec.models.toy import FunctionModel
from verispec.serve import BackgroundServer, create_app
from verispec.verify import RULES, UniformRule, min_one_p_over_q, verify

from conftest import RepeatLast

V = 96


class CharTokenizer:
    """One id per character (ids 1..90), no chat template."""

    chat_template = None
    eos_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(32 + int(i) % 90) for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(V)}


def char_logits(prefix):
    """[V] logits, a fixed random function of the last token that likes repeating it."""
    out = torch.randn(V, generator=torch.Generator().manual_seed(prefix[-1]), dtype=torch.float64)
    out[prefix[-1]] += 2.5
    return out


class CharBackend(FunctionModel):
    """A backend of its own: `open` builds a toy model for any name."""

    tokenizer = CharTokenizer()

    @classmethod
    def open(cls, spec, *, fetch_missing=True):
        return cls(char_logits, V, context_length=512, name=f"char:{spec}")


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(BACKENDS, "chars", BackendKind(f"{__name__}:CharBackend", "toy", "torch", "chars"))
    monkeypatch.setitem(DRAFTERS, "repeat", DrafterKind(False, lambda model, cache: RepeatLast(), "repeat"))
    monkeypatch.setitem(RULES, "mine", UniformRule(verify, "mine", min_one_p_over_q))


def test_generate_uses_the_registered_backend_drafter_and_rule(registered):
    sd = SpeculativeDecoder("anything", backend="chars", drafter="repeat")
    out = sd.generate("abcabc", max_new_tokens=24, k=3, rule="mine", use_chat_template=False)
    plain = sd.generate("abcabc", max_new_tokens=24, k=0, use_chat_template=False)
    assert out.token_ids == plain.token_ids                  # greedy: the target's own output
    assert out.stats.rule == "mine" and out.stats.by_drafter["repeat"]["drafted"] > 0
    assert out.stats.by_drafter["repeat"]["accepted"] > 0
    assert isinstance(load_model("x", backend="chars"), CharBackend)


def test_the_cli_offers_and_runs_them(registered):
    result = CliRunner().invoke(app, ["generate", "abcabc", "--target", "anything", "--backend", "chars",
                                      "--drafter", "repeat", "--rule", "mine", "--k", "3",
                                      "--max-new-tokens", "24", "--no-chat-template", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["backend"] == "chars" and out["rule"] == "mine"
    assert out["by_drafter"]["repeat"]["drafted"] > 0
    sd = SpeculativeDecoder("anything", backend="chars", drafter="none")
    assert out["token_ids"] == sd.generate("abcabc", max_new_tokens=24, k=0, use_chat_template=False).token_ids


def test_the_server_accepts_them(registered):
    sd = SpeculativeDecoder("anything", backend="chars", drafter="none")
    with BackgroundServer(create_app(sd, k=3, rule="mine")) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": "abcabc", "max_tokens": 24, "temperature": 0,
                                            "drafter": "repeat", "return_token_ids": True})
        assert r.status_code == 200, r.text
        spec = r.json()["metrics"]["speculative_decoding"]
        assert spec["rule"] == "mine" and spec["num_draft_tokens"] > 0
        plain = c.post("/v1/completions", json={"prompt": "abcabc", "max_tokens": 24, "temperature": 0,
                                                "k": 0, "return_token_ids": True})
        assert r.json()["choices"][0]["token_ids"] == plain.json()["choices"][0]["token_ids"]
        bad = c.post("/v1/completions", json={"prompt": "abcabc", "drafter": "psychic"})
        assert bad.status_code == 400 and "repeat" in bad.json()["error"]["message"]


def test_help_lists_the_tables(registered):
    """The options' help is written from the tables when the CLI is imported; what it
    validates against is the tables at run time (the registered names above)."""
    result = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    for name in ("transformers", "llamacpp", "suffix", "lookup", "standard", "gumbel"):
        assert name in text


def test_analyze_measures_a_registered_drafter(registered, tmp_path):
    from verispec import analyze as an
    from verispec.prompts import Prompt
    from verispec.report.analysis import render_tables

    tick = {"n": 0}

    def fake_clock():   # 1 ms per reading: deterministic, positive durations
        tick["n"] += 1
        return tick["n"] * 1e-3

    target = load_model("anything", backend="chars")
    prompts = [Prompt(1, "qa", ("abcabc",), ("qa",), 1)]
    config = an.AnalyzeConfig(k_max=3, max_new_tokens=16, prefix_tokens=8, repeats=2, warmup=0, measure=True)
    analysis = an.run_analysis(target, prompts, CharTokenizer().encode, config, drafter_kind="repeat",
                               clock=fake_clock)
    assert analysis["drafter"] == "repeat" and analysis["cost_curve"]["draft_kind"] == "repeat"
    assert analysis["overall"]["n_points"] > 0 and analysis["measured"]["qa"]["points"]
    assert render_tables(analysis)
