"""verispec.analyze: α on the trajectory, cost-curve timing logic, prompt files, predictions.

Toy models only (FunctionModel, fake clock): no real models, no sleeps, no timings.
"""

import json

import pytest
import torch

from verispec import analyze as an
from verispec import theory
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.model import ModelDrafter
from verispec.models.base import CausalLM
from verispec.models.toy import FunctionModel, log_probs
from verispec.sampling import SamplingConfig, TorchRandomness

V = 6
P = [0.4, 0.3, 0.1, 0.1, 0.05, 0.05]
Q = [0.1, 0.2, 0.4, 0.1, 0.1, 0.1]
SAMPLE = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig()


def constant(probs, name):
    logits = log_probs(probs)
    return FunctionModel(lambda prefix: logits, V, name=name)


def successor(wrong_after=None, name="succ"):
    """Greedy toy: next token = last + 1 (mod V); after `wrong_after` it says 0 instead."""
    def fn(prefix):
        nxt = 0 if prefix[-1] == wrong_after else (prefix[-1] + 1) % V
        out = torch.full((V,), -10.0, dtype=torch.float64)
        out[nxt] = 0.0
        return out
    return FunctionModel(fn, V, name=name)


# --------------------------------------------------------------------------- α on the trajectory


@pytest.mark.parametrize("sampling", [SAMPLE, SamplingConfig(temperature=0.7, top_k=5)])
def test_constant_distributions_give_theory_alpha_at_every_position(sampling):
    from verispec.sampling import warp

    target, draft = constant(P, "p"), constant(Q, "q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [1, 2], k_max=5, sampling=sampling,
                                      max_new_tokens=40, rng=TorchRandomness(3), stride=1)
    assert len(res.tokens) == 40 and len(res.points) == 40
    p = warp(log_probs(P), sampling).numpy()
    q = warp(log_probs(Q), sampling).numpy()
    expected = theory.alpha(p, q)
    assert 0.3 < expected < 0.9
    for point in res.points:
        assert point.proposed == 5
        assert point.alphas == pytest.approx([expected] * 5, abs=1e-12)
    s = an.summarize_points(res.points, 5)
    assert s.alpha == pytest.approx(expected, abs=1e-12)
    assert s.alphas == pytest.approx([expected] * 5, abs=1e-12)   # w-weighting keeps it exact
    # E(k) measured directly is Σ_i P(acc >= i), not the product form: only check bounds
    assert all(1.0 <= e <= k + 1 for k, e in enumerate(s.expected_tokens))


def test_identical_target_and_draft_give_alpha_one():
    target, draft = constant(P, "p"), constant(P, "p2")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [0], k_max=4, sampling=SAMPLE,
                                      max_new_tokens=30, rng=TorchRandomness(0))
    s = an.summarize_points(res.points, 4)
    assert s.alpha == pytest.approx(1.0, abs=1e-12)
    assert s.alphas == pytest.approx([1.0] * 4, abs=1e-12)
    assert s.alpha_empirical == 1.0 and s.empirical_per_position == [1.0] * 4
    assert s.tau_empirical == [1, 2, 3, 4, 5]
    assert s.expected_tokens == pytest.approx([1, 2, 3, 4, 5])


def test_greedy_exact_alpha_equals_counted_accepts_and_is_conditional():
    # the draft goes wrong after token 2, so a draft run through "2" fails at the next position
    target, draft = successor(name="p"), successor(wrong_after=2, name="q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [0], k_max=4, sampling=GREEDY,
                                      max_new_tokens=60, stride=1)
    assert res.tokens == [(i + 1) % V for i in range(60)]
    s = an.summarize_points(res.points, 4)
    # greedy: p and q are point masses, so the exact α_i is the counted acceptance
    assert s.alphas == pytest.approx(s.empirical_per_position, abs=1e-12)
    assert s.expected_tokens == pytest.approx(s.tau_empirical, abs=1e-12)
    # context ending in 2 -> x_1 wrong (α_1 = 0 there): 1 point in V
    assert s.alpha == pytest.approx(5 / 6)
    # position i given i-1 accepted: the draft reaches "2" only if it is not yet behind; by hand:
    # last token c, drafts c+1, c+2, ...; position i fails iff c+i-1 == 2 (mod 6)
    assert s.alphas == pytest.approx([5 / 6, 4 / 5, 3 / 4, 2 / 3])
    # unconditional (unweighted) mean at position 2 would count drafts after a miss: it differs
    unweighted = sum(p.alphas[1] for p in res.points) / len(res.points)
    assert unweighted != pytest.approx(s.alphas[1])


def test_sampled_exact_alpha_agrees_with_counted_accepts():
    def fn_p(prefix):
        return log_probs(P if prefix[-1] % 2 else Q)

    def fn_q(prefix):
        return log_probs(Q if prefix[-1] % 3 else P)

    target, draft = FunctionModel(fn_p, V, name="p"), FunctionModel(fn_q, V, name="q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [1], k_max=3, sampling=SAMPLE,
                                      max_new_tokens=500, rng=TorchRandomness(1), stride=1)
    s = an.summarize_points(res.points, 3)
    for exact, counted in zip(s.alphas, s.empirical_per_position):
        assert exact == pytest.approx(counted, abs=0.06)
    for e, tau in zip(s.expected_tokens, s.tau_empirical):
        assert e == pytest.approx(tau, rel=0.05)


def test_lookup_drafter_and_stride_and_short_proposals():
    target = successor(name="p")
    res = an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=4, sampling=GREEDY,
                                      max_new_tokens=24, stride=3)
    assert [p.t for p in res.points] == list(range(0, 24, 3))
    # the first point's context [0] has no earlier occurrence: nothing proposed, α = 0 there
    assert res.points[0].proposed == 0 and res.points[0].alphas == [0.0] * 4
    # once the cycle 0..5 has been seen, lookup predicts the successor exactly
    later = [p for p in res.points if p.t >= V]
    assert later and all(p.proposed == 4 and p.alphas == [1.0] * 4 for p in later)
    assert an.default_stride(48) == 2 and an.default_stride(10) == 1 and an.default_stride(100) == 4


def test_bad_arguments():
    target = successor()
    with pytest.raises(ValueError, match="k_max"):
        an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=0)
    with pytest.raises(ValueError, match="stride"):
        an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=2, stride=0)


# --------------------------------------------------------------------------- cost curve (fake clock)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeModel(CausalLM):
    """Each forward advances a fake clock by the next scripted duration (or a default per n)."""

    def __init__(self, clock, script=None, per_token=0.01, base=0.1, name="fake"):
        super().__init__()
        self.clock, self.script = clock, list(script or [])
        self.per_token, self.base = per_token, base
        self.vocab_size, self.context_length, self.name = 8, 4096, name
        self.calls = []          # (cache length before, n new tokens)
        self.truncations = []

    def _extend(self, tokens, keep):
        self.calls.append((len(self.tokens), len(tokens)))
        self.clock.now += self.script.pop(0) if self.script else self.base + self.per_token * len(tokens)
        return torch.zeros(keep, self.vocab_size)

    def _truncate(self, length):
        self.truncations.append(length)


def test_time_forward_drops_warmup_and_rolls_back_after_each_run():
    clock = FakeClock()
    model = FakeModel(clock, script=[9.0, 9.0, 1.0, 5.0, 2.0, 3.0, 4.0])
    model.forward([1, 2, 3])          # a context of 3 tokens (scripted 9.0, untimed)
    samples = an.time_forward(model, [4, 5], repeats=5, warmup=1, clock=clock)
    assert samples == [1.0, 5.0, 2.0, 3.0, 4.0]     # the warm-up's 9.0 is dropped
    assert model.calls[1:] == [(3, 2)] * 6            # each run starts from the same 3-token cache
    assert model.truncations == [3] * 6 and model.tokens == [1, 2, 3]
    with pytest.raises(ValueError):
        an.time_forward(model, [4], repeats=0, clock=clock)


def test_time_forwards_interleaves_rounds_over_batches():
    clock = FakeClock()
    model = FakeModel(clock, per_token=1.0, base=0.0)
    model.forward([1])
    model.calls.clear()
    samples = an.time_forwards(model, [[2], [2, 3], [2, 3, 4]], repeats=2, warmup=1, clock=clock)
    assert [n for _, n in model.calls] == [1, 2, 3] * 3      # round by round, not n by n
    assert samples == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert model.tokens == [1]


def test_timing_noise_warning():
    quiet = {"target_samples": [[1.0, 1.1], [1.2, 1.3]], "draft_samples": [0.5, 0.5], "target_times": [1.05, 1.25]}
    assert an.timing_noise(quiet) is None
    spiky = {**quiet, "target_samples": [[1.0, 3.0], [1.2, 1.3]]}
    assert "T_t(1) spread 3.0x" in an.timing_noise(spiky)
    falling = {**quiet, "target_times": [2.0, 1.0]}
    assert "falls at n = 2" in an.timing_noise(falling)


def test_measure_cost_curve_medians_prefix_and_draft():
    clock = FakeClock()
    target = FakeModel(clock, per_token=0.01, base=0.1, name="t")
    draft = FakeModel(clock, per_token=0.001, base=0.02, name="d")
    # outliers: every 3rd timed target forward takes 10 s extra -> the median ignores them
    orig = target._extend
    count = {"n": 0}

    def spiky(tokens, keep):
        count["n"] += 1
        if count["n"] > 1 and count["n"] % 3 == 0:
            clock.now += 10.0
        return orig(tokens, keep)

    target._extend = spiky
    m = an.measure_cost_curve(target, 3, list(range(50)), draft=draft, prefix_tokens=20, repeats=5,
                              warmup=2, clock=clock)
    assert target.calls[0] == (0, 20)                      # prefill of the 20-token prefix
    assert len(target.tokens) == 20 and len(draft.tokens) == 20   # rolled back to the prefix
    assert [len(s) for s in m.target_samples] == [5, 5, 5, 5]
    assert m.curve.target_times == pytest.approx([0.1 + 0.01 * n for n in range(1, 5)])
    assert m.curve.draft_time == pytest.approx(0.021)
    assert m.draft_time_2 == pytest.approx(0.022) and len(m.draft_samples_2) == 5
    assert len(draft.calls) == 1 + 7 * 2 and draft.calls[1:3] == [(20, 1), (20, 2)]   # interleaved
    assert m.curve.constant_c() == pytest.approx(0.021 / 0.11)
    assert max(max(s) for s in m.target_samples) > 10      # the spikes were measured, not used
    # forwards: 1 prefill + (2 + 5) per n
    assert len(target.calls) == 1 + 7 * 4
    d = m.as_dict()
    assert d["draft_kind"] == "model" and d["prefix_tokens"] == 20 and len(d["target_times"]) == 4


def test_measure_cost_curve_lookup_and_none():
    clock = FakeClock()
    target = FakeModel(clock)
    m = an.measure_cost_curve(target, 2, [1, 2, 3], lookup=True, prefix_tokens=10, repeats=3, warmup=0,
                              clock=clock)
    assert m.draft_kind == "lookup" and m.draft_samples == [0.0, 0.0, 0.0]   # the fake clock stands still
    m = an.measure_cost_curve(target, 2, [1, 2, 3], prefix_tokens=10, repeats=3, clock=clock)
    assert m.draft_kind == "none" and m.curve.draft_time == 0.0


# --------------------------------------------------------------------------- predictions


def test_predict_speedup_matches_theory():
    curve = theory.CostCurve((0.10, 0.11, 0.13, 0.16), 0.02)
    alphas = [0.8, 0.7, 0.6]
    for k in range(4):
        assert an.predict_speedup(alphas, curve, k) == pytest.approx(
            theory.speedup_cost_curve(alphas, k, curve.target, 0.02))
    k_star, s_star = an.optimal_k(alphas, curve)
    assert (k_star, s_star) == curve.optimal_k(alphas, 3)
    assert an.predict_speedup(alphas, curve, "auto") == pytest.approx(s_star)
    assert an.predict_speedup([0.8, None, None], curve, 3) == pytest.approx(curve.speedup([0.8, 0, 0], 3))
    table = an.speedup_table(0.8, alphas, curve, 3)
    assert table["constant"] == pytest.approx([theory.speedup_constant_cost(0.8, k, 0.2) for k in range(4)])
    assert table["curve"][0] == table["constant"][0] == 1.0
    assert (table["k_star_constant"], table["S_star_constant"]) == theory.optimal_k_constant(0.8, 0.2, 3)
    assert table["curve_at_k_star_constant"] == table["curve"][table["k_star_constant"]]
    assert "refeed" not in table
    # T_d(2) == T_d: the re-feed costs nothing extra, curve+ is the curve
    same = an.speedup_table(0.8, alphas, curve, 3, draft_time_2=0.02)
    assert same["refeed"] == pytest.approx(same["curve"]) and same["k_star_refeed"] == same["k_star_curve"]
    # T_d(2) = 0.05: k drafts cost (k-1)·T_d + Πα·T_d(2) + (1-Πα)·T_d
    more = an.speedup_table(0.8, alphas, curve, 3, draft_time_2=0.05)
    pa = 0.8 * 0.7
    e = theory.expected_tokens_positional(alphas[:2])
    assert more["refeed"][2] == pytest.approx(e * 0.10 / (0.02 + pa * 0.05 + (1 - pa) * 0.02 + 0.13))
    assert more["refeed"][0] == 1.0 and all(r < c for r, c in zip(more["refeed"][1:], more["curve"][1:]))


# --------------------------------------------------------------------------- prompt files


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_prompts_grouping_and_per_category(tmp_path):
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}", "second turn"]}
            for i, c in enumerate(["writing", "qa", "coding", "qa", "qa", "rag", "writing"])]
    path = write(tmp_path, "q.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = an.load_prompts(path, per_category=2)
    assert [(p.category, p.text) for p in prompts] == [
        ("multi-turn", "q0"), ("multi-turn", "q2"), ("qa", "q1"), ("qa", "q3"), ("rag", "q5")]
    assert prompts[1].raw_category == "coding" and prompts[1].id == "2" and prompts[1].line == 3
    raw = an.load_prompts(path, per_category=1, raw_categories=True)
    assert [p.category for p in raw] == ["writing", "qa", "coding", "rag"]
    assert len(an.load_prompts(path, per_category=0)) == 7


def test_plain_text_prompts(tmp_path):
    path = write(tmp_path, "prompts.txt", "Write a haiku.\n\n  Explain TCP.  \n")
    prompts = an.load_prompts(path, per_category=0)
    assert [(p.category, p.text, p.line) for p in prompts] == [
        ("prompts", "Write a haiku.", 1), ("prompts", "Explain TCP.", 3)]
    assert len(an.load_prompts(path, per_category=1)) == 1


def test_prompt_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        an.load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(an.PromptFileError, match="empty"):
        an.load_prompts(write(tmp_path, "empty.txt", "\n  \n"))
    good = json.dumps({"category": "qa", "turns": ["hi"]})
    with pytest.raises(an.PromptFileError, match="line 3: not valid JSON"):
        an.load_prompts(write(tmp_path, "bad.jsonl", f"{good}\n\n{{oops\n"))
    with pytest.raises(an.PromptFileError, match="line 2: needs \"turns\""):
        an.load_prompts(write(tmp_path, "noturns.jsonl", f"{good}\n{json.dumps({'category': 'qa'})}\n"))
    with pytest.raises(an.PromptFileError, match="line 1: expected a JSON object"):
        an.load_prompts(write(tmp_path, "list.jsonl", "[1, 2]\n"))
    with pytest.raises(ValueError, match="per_category"):
        an.load_prompts(write(tmp_path, "ok.txt", "hi\n"), per_category=-1)


def test_default_prompts_path_env(tmp_path, monkeypatch):
    f = write(tmp_path, "question.jsonl", json.dumps({"category": "qa", "turns": ["hi"]}) + "\n")
    monkeypatch.setenv(an.ENV_VAR, str(tmp_path))
    assert an.default_prompts_path() == f
    assert an.load_prompts(None)[0].text == "hi"
    monkeypatch.setenv(an.ENV_VAR, str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match=an.ENV_VAR):
        an.default_prompts_path()
    monkeypatch.delenv(an.ENV_VAR)
    monkeypatch.chdir(tmp_path)   # neither ../shared nor ./shared here; the checkout's may exist
    try:
        path = an.default_prompts_path()
    except FileNotFoundError as e:
        assert "--prompts" in str(e)
    else:
        assert path.name == "question.jsonl"


# --------------------------------------------------------------------------- end to end (toy)


def test_run_analysis_end_to_end_writes_json_and_plots(tmp_path):
    clock = FakeClock()
    tick = {"n": 0}

    def fake_clock():   # advances 1 ms per reading: deterministic, positive durations
        tick["n"] += 1
        return tick["n"] * 1e-3

    target, draft = successor(name="p"), successor(wrong_after=2, name="q")
    prompts = [an.Prompt("1", "qa", "qa", "0", 1), an.Prompt("2", "qa", "qa", "3", 2),
               an.Prompt("3", "multi-turn", "coding", "1", 3)]
    config = an.AnalyzeConfig(k_max=3, max_new_tokens=20, prefix_tokens=8, repeats=3, warmup=1,
                              measure=True)
    analysis = an.run_analysis(target, prompts, lambda text: [int(text)], config, drafter_kind="model",
                               draft=draft, clock=fake_clock)
    assert set(analysis["categories"]) == {"qa", "multi-turn"}
    qa = analysis["categories"]["qa"]
    assert qa["n_prompts"] == 2 and len(qa["prompt_alphas"]) == 2
    assert qa["n_points"] == sum(len(p["points"]) for p in analysis["prompts"] if p["category"] == "qa")
    assert analysis["overall"]["n_points"] == sum(len(p["points"]) for p in analysis["prompts"])
    cm = analysis["cost_curve"]
    assert cm["target_times"] == pytest.approx([1e-3] * 4) and cm["draft_time"] == pytest.approx(1e-3)
    sp = analysis["overall"]["speedup"]
    assert len(sp["constant"]) == len(sp["curve"]) == 4
    assert {r["k"] for r in analysis["measured"]["qa"]["points"]} == {0, 1, 2, 3}
    pred = an.predict_from_analysis(analysis, "qa", k=2)
    assert pred["speedup"] == pytest.approx(analysis["categories"]["qa"]["speedup"]["curve"][2])
    assert an.predict_from_analysis(analysis, model="constant")["k"] == sp["k_star_constant"]
    assert an.predict_from_analysis(analysis, model="curve+")["k"] == sp["k_star_refeed"]
    assert an.predict_from_analysis(analysis, "qa", k=1, model="curve+")["speedup"] == pytest.approx(
        analysis["categories"]["qa"]["speedup"]["refeed"][1])
    paths = an.write_outputs(analysis, tmp_path / "out")
    for p in paths.values():
        assert p.stat().st_size > 0
    loaded = an.load_analysis(tmp_path / "out")
    assert loaded["overall"]["alphas"] == pytest.approx(analysis["overall"]["alphas"])
    assert an.predict_from_analysis(loaded, k="auto") == an.predict_from_analysis(analysis, k="auto")
    assert an.render_tables(analysis) and an.closing_notes(analysis)
    with pytest.raises(ValueError, match="draft model"):
        an.run_analysis(target, prompts, lambda t: [int(t)], config, drafter_kind="model", draft=None)
    with pytest.raises(ValueError, match="drafter"):
        an.run_analysis(target, prompts, lambda t: [int(t)], config, drafter_kind="eagle", draft=draft)


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
    res = runner.invoke(app, ["analyze", "--k-max", "0"])
    assert res.exit_code == 2 and "--k-max" in res.output
