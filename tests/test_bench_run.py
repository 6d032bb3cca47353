"""verispec.bench.run / measure: run_bench end to end on tiny random models, resume, and run_one."""

import json

import pytest

from verispec import bench as B
from verispec.api import SpeculativeDecoder
from verispec.bench import run as run_module
from verispec.prompts import load_prompts

from conftest import tiny_llama


class CharTokenizer:
    """One id per character (ids 1..90), no chat template."""

    chat_template = None
    eos_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(32 + int(i) % 90) for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(96)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one thread, especially on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_decoder():
    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    target.tokenizer = draft.tokenizer = CharTokenizer()
    return SpeculativeDecoder(target, draft)


def test_run_bench_end_to_end_on_tiny_models(tiny_decoder, dataset, tmp_path):
    qs = load_prompts(dataset, ["qa", "coding"], per_category=1)
    methods = ["plain-again", "verispec", "verispec-k4", "verispec-lookup", "verispec-suffix",
               "verispec-auto", "hf-plain", "hf-assisted", "hf-prompt-lookup"]
    rows = B.run_bench(qs, methods, target=tiny_decoder, max_new_tokens=16, out_dir=tmp_path,
                       meta={"command": "test"}, warmup=False, progress=False)
    assert len(rows) == 2 * 10
    assert [r["method"] for r in rows[:10]] == ["plain", *methods]    # interleaved, plain first
    # the next prompt: plain first again, the others one place on (a drift within a prompt's
    # turn must not always fall on the same method)
    assert [r["method"] for r in rows[10:]] == ["plain", *methods[1:], methods[0]]
    for r in rows:
        assert r["error"] is None, r
        assert r["new_tokens"] == 16 and r["wall_seconds"] > 0 and r["finish_reason"] == "length"
        assert r["tau"] >= 1.0
        if r["method"] != "plain":
            assert r["identical_to_plain"] is True, r["method"]     # greedy: exact
    k4 = next(r for r in rows if r["method"] == "verispec-k4")
    assert k4["drafted"] > 0 and set(k4["k_hist"]) <= {"none:0"} | {f"model:{k}" for k in range(1, 5)}
    assert k4["draft_acceptance_rate"] == k4["accepted"] / k4["drafted"] and k4["alpha_exact"] is not None
    assert all("acceptance_rate" not in r for r in rows)   # the old name is no longer written
    assert next(r for r in rows if r["method"] == "hf-assisted")["draft_forwards"] > 0
    plain = next(r for r in rows if r["method"] == "plain")
    assert plain["tau"] == 1.0 and plain["target_forwards"] == 16
    on_disk = B.load_results(tmp_path)
    assert len(on_disk) == 2 * 10
    meta = json.loads((tmp_path / B.META).read_text())
    assert meta["backend"] == "transformers" and meta["command"] == "test"
    assert meta["machine"]["cores"] and meta["versions"]["torch"]
    assert all(r["loadavg"] is not None for r in rows)
    md = B.write_report(tmp_path)
    assert "| method | qa | coding | overall |" in md
    assert "| verispec-k4 | 1/1 | 1/1 | 2/2 |" in md

    # existing results: refuse without resume/overwrite; resume with other settings: refuse
    with pytest.raises(B.BenchError, match="--resume"):
        B.run_bench(qs, ["verispec"], target=tiny_decoder, max_new_tokens=16, out_dir=tmp_path,
                    progress=False)
    with pytest.raises(B.BenchError, match="--max-new-tokens 16"):
        B.run_bench(qs, ["verispec"], target=tiny_decoder, max_new_tokens=8, out_dir=tmp_path,
                    resume=True, progress=False)


def test_method_order_rotates_all_but_plain():
    methods = ["plain", "a", "b", "c"]
    orders = [run_module.method_order(methods, turn) for turn in range(3)]
    assert [o[0] for o in orders] == ["plain"] * 3
    assert [o[1:].index(m) for o in orders for m in ["a"]] == [0, 2, 1]   # every position once
    assert run_module.method_order(["x", "y"], 1) == ["y", "x"]            # no plain: all rotate
    assert run_module.method_order(["plain"], 5) == ["plain"]


def test_resume_runs_only_missing_pairs_and_records_errors(tiny_decoder, dataset, tmp_path,
                                                           monkeypatch):
    qs = load_prompts(dataset, ["qa", "translation"], per_category=1)
    real = run_module.run_one

    def flaky(decoder, ids, method, **kw):
        if method == "verispec-k4" and ids == tiny_decoder.encode(qs[0].text):
            raise RuntimeError("injected failure")
        return real(decoder, ids, method, **kw)

    monkeypatch.setattr(run_module, "run_one", flaky)
    rows = B.run_bench(qs, ["plain", "verispec-k4", "verispec-lookup"], target=tiny_decoder,
                       max_new_tokens=12, out_dir=tmp_path, progress=False)
    failed = [r for r in rows if r["error"]]
    assert [(r["question_id"], r["method"]) for r in failed] == [(qs[0].id, "verispec-k4")]
    assert "injected failure" in failed[0]["error"]
    assert sum(1 for r in rows if not r["error"]) == 5      # the run went on

    # drop q2's lookup row (as if interrupted), then resume with the failure gone
    lines = (tmp_path / B.RESULTS).read_text().splitlines()
    kept = [ln for ln in lines if not (json.loads(ln)["question_id"] == qs[1].id
                                       and json.loads(ln)["method"] == "verispec-lookup")]
    (tmp_path / B.RESULTS).write_text("\n".join(kept) + "\n")
    ran = []
    monkeypatch.setattr(run_module, "run_one",
                        lambda d, ids, method, **kw: ran.append(method) or real(d, ids, method, **kw))
    rows = B.run_bench(qs, ["plain", "verispec-k4", "verispec-lookup"], target=tiny_decoder,
                       max_new_tokens=12, out_dir=tmp_path, resume=True, warmup=False,
                       progress=False)
    # only the errored pair and the missing pair ran (plain of both prompts was kept)
    assert ran == ["verispec-k4", "verispec-lookup"]
    assert len(rows) == 6 and not any(r["error"] for r in rows)
    assert all(r["identical_to_plain"] for r in rows if r["method"] != "plain")
    assert len(B.load_results(tmp_path)) == len(kept) + 2
    assert len(json.loads((tmp_path / B.META).read_text())["resumed"]) == 1


def test_run_one_is_the_public_per_prompt_hook(tiny_decoder):
    target, draft = tiny_decoder.target, tiny_decoder.draft
    ids = tiny_decoder.encode("Who wrote it?")
    plain = B.run_one(B.decoder_for("plain", target, draft), ids, "plain", max_new_tokens=12)
    assert plain["tau"] == 1.0 and plain["new_tokens"] == 12 and plain["draft_acceptance_rate"] is None
    for method in ("verispec-k4", "verispec-auto", "hf-assisted"):
        row = B.run_one(B.decoder_for(method, target, draft), ids, method, max_new_tokens=12)
        assert row["token_ids"] == plain["token_ids"], method       # greedy: exact
    k4 = B.run_one(B.decoder_for("verispec-k4", target, draft), ids, B.METHODS["verispec-k4"],
                   max_new_tokens=12)
    assert k4["drafted"] > 0 and set(k4["k_hist"]) <= {"none:0"} | {f"model:{k}" for k in range(1, 5)}
    with pytest.raises(B.BenchError, match="decoder_for"):
        B.run_one(B.decoder_for("plain", target, draft), ids, "verispec", max_new_tokens=4)
    with pytest.raises(B.BenchError, match="unknown method 'fast'"):
        B.run_one(tiny_decoder, ids, "fast", max_new_tokens=4)
    with pytest.raises(B.BenchError, match="needs a draft model"):
        B.decoder_for("verispec", target, None)


def test_hf_methods_refuse_a_model_that_is_not_transformers():
    from verispec.bench.hf import hf_generate
    from verispec.models.toy import FunctionModel

    toy = FunctionModel(lambda prefix: __import__("torch").zeros(4), 4, name="toy")
    with pytest.raises(B.BenchError, match="--backend transformers"):
        hf_generate(toy, [1, 2], max_new_tokens=2)
