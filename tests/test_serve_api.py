"""The server over toy models, through real HTTP on 127.0.0.1: what it returns equals
`SpeculativeDecoder.generate`, streams add up, counters and logprobs are exact."""

import httpx
import pytest
import torch
from test_serve_toys import V, sse_events, toy_decoder, toy_logits

from verispec.serve import BackgroundServer, create_app

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def toy():
    decoder = toy_decoder()
    with BackgroundServer(create_app(decoder, k=3)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield decoder, client


def complete(client, **body):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(client, path="/v1/completions", **body):
    body = {"prompt": PROMPT, "temperature": 0, "stream": True, **body}
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r.iter_lines())


def test_completion_equals_generate_with_its_acceptance_counters(toy):
    decoder, client = toy
    ref = decoder.generate(PROMPT, max_new_tokens=20, temperature=0, k=3)
    body = complete(client, max_tokens=20, return_token_ids=True)
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert choice["token_ids"] == ref.token_ids and choice["prompt_token_ids"] == PROMPT
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == len(ref.token_ids) == 20
    assert body["usage"]["prompt_tokens"] == len(PROMPT)
    assert body["usage"]["total_tokens"] == 20 + len(PROMPT)
    spec, s = body["metrics"]["speculative_decoding"], ref.stats
    assert 0 < s.accepted < s.drafted                        # a real mix: the toy draft errs
    assert spec["num_draft_tokens"] == s.drafted
    assert spec["num_accepted_draft_tokens"] == s.accepted
    assert spec["num_rounds"] == s.target_forwards
    assert spec["num_verified_tokens_per_pos"] == s.reached
    assert spec["num_accepted_tokens_per_pos"] == s.accepted_at
    assert spec["alpha"] == pytest.approx(s.alpha_exact)
    assert spec["draft_acceptance_rate"] == pytest.approx(s.accepted / s.drafted)
    hist, steps = spec["acceptance_histogram"], spec["num_spec_steps"]
    assert spec["num_spec_tokens"] == 3 and len(hist) == 4 and sum(hist) == steps
    assert sum(j * c for j, c in enumerate(hist)) == s.accepted
    assert spec["mean_acceptance_length"] == pytest.approx(1 + s.accepted / steps)
    assert spec["rule"] == s.rule == "standard"


def test_streamed_chunks_add_up_to_the_non_streamed_response(toy):
    _, client = toy
    whole = complete(client, max_tokens=16, return_token_ids=True)
    events = stream(client, max_tokens=16, return_token_ids=True, stream_options={"include_usage": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = [t for e in chunks for c in e["choices"] for t in c.get("token_ids", [])]
    assert ids == whole["choices"][0]["token_ids"]
    assert chunks[0]["choices"][0]["token_ids"] == [] and chunks[0]["prompt_token_ids"] == PROMPT
    blocks = [e for e in chunks if e["choices"] and e["choices"][0]["token_ids"]]
    spec = chunks[-1]["metrics"]["speculative_decoding"]
    assert len(blocks) == spec["num_rounds"]                # one chunk per committed block
    final = [e for e in chunks if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {**whole["usage"], "prompt_tokens_details":
                                                         usage["usage"]["prompt_tokens_details"]}
    for key in ("num_draft_tokens", "num_accepted_draft_tokens", "acceptance_histogram"):
        assert spec[key] == whole["metrics"]["speculative_decoding"][key]


def test_logprobs_are_the_raw_target_log_softmax_not_the_warped_one(toy):
    _, client = toy
    body = complete(client, max_tokens=8, temperature=0.7, top_k=3, seed=5, logprobs=2, return_token_ids=True)
    ids = body["choices"][0]["token_ids"]
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == [str(t) for t in ids]
    for j, tok in enumerate(ids):
        raw = torch.log_softmax(toy_logits(tuple(PROMPT + ids[:j])), -1)
        assert lp["token_logprobs"][j] == pytest.approx(float(raw[tok]), abs=1e-9)
        top = torch.topk(raw, 2)
        assert lp["top_logprobs"][j] == pytest.approx({str(int(i)): float(v) for v, i in zip(*top)})


def test_logprobs_0_gives_each_chosen_token_alone_in_top_logprobs(toy):
    """OpenAI's legacy completions: up to logprobs + 1 entries, the chosen token always among
    them; with logprobs 0 that is the chosen token alone (it was null)."""
    _, client = toy
    body = complete(client, max_tokens=5, temperature=0, logprobs=0, return_token_ids=True)
    lp = body["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"])]
    assert len(lp["tokens"]) == 5


def test_seeded_sampling_reproduces_across_requests_and_equals_generate(toy):
    decoder, client = toy
    for k in (3, "auto"):
        a = complete(client, max_tokens=12, temperature=1.0, seed=7, k=k, return_token_ids=True)
        complete(client, max_tokens=12, temperature=1.0, seed=8, k=k)        # in between
        b = complete(client, max_tokens=12, temperature=1.0, seed=7, k=k, return_token_ids=True)
        ids = a["choices"][0]["token_ids"]
        assert ids == b["choices"][0]["token_ids"], f"k={k}"
        ref = decoder.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=7, k=k)
        assert ids == ref.token_ids, f"k={k}"
        assert a["metrics"]["speculative_decoding"]["seed"] == 7


def test_an_unseeded_sample_reports_the_seed_that_replays_it(toy):
    _, client = toy
    a = complete(client, max_tokens=10, temperature=1.0, return_token_ids=True)
    seed = a["metrics"]["speculative_decoding"]["seed"]
    b = complete(client, max_tokens=10, temperature=1.0, seed=seed, return_token_ids=True)
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]


def test_eos_finishes_with_stop_and_the_budget_with_length():
    from test_serve_toys import CountingModel

    from verispec.api import SpeculativeDecoder

    def count_up(prefix):                  # next token = last + 1; V - 1 is EOS
        logits = torch.full((V,), -10.0, dtype=torch.float64)
        logits[(prefix[-1] + 1) % V] = 10.0
        return logits

    target = CountingModel(count_up, "counter", eos_token_ids=[V - 1])
    with BackgroundServer(create_app(SpeculativeDecoder(target, None, drafter="lookup"), k=2)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            done = client.post("/v1/completions", json={"prompt": [9], "temperature": 0,
                                                        "return_token_ids": True}).json()
            assert done["choices"][0]["token_ids"] == list(range(10, V))   # EOS included
            assert done["choices"][0]["finish_reason"] == "stop"
            assert done["usage"]["completion_tokens"] == V - 10
            cut = client.post("/v1/completions", json={"prompt": [9], "max_tokens": 3,
                                                       "temperature": 0}).json()
            assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3
            none = client.post("/v1/completions", json={"prompt": [9], "max_tokens": 0}).json()
            assert none["choices"][0]["finish_reason"] == "length" and none["usage"]["completion_tokens"] == 0


def test_prefix_reuse_skips_the_shared_prefix_and_changes_nothing():
    outputs = {}
    for reuse in (True, False):
        decoder = toy_decoder()
        with BackgroundServer(create_app(decoder, k=3, prefix_reuse=reuse)) as url:
            with httpx.Client(base_url=url, timeout=60) as client:
                first = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                             "return_token_ids": True}).json()
                out1 = first["choices"][0]["token_ids"]
                turn2 = PROMPT + out1 + [2, 7]           # a second turn: the first one, then more
                fed = decoder.target.fed
                second = client.post("/v1/completions", json={"prompt": turn2, "max_tokens": 8, "temperature": 0,
                                                              "return_token_ids": True}).json()
                cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
                fed = decoder.target.fed - fed
                spec = second["metrics"]["speculative_decoding"]
        if reuse:   # the target held PROMPT + out1 but its last token; only the rest is prefilled
            assert cached == len(PROMPT) + len(out1) - 1
        else:
            assert cached == 0
        # the target was fed the uncached prompt (but its last token), then k + 1 tokens a round
        assert fed == len(turn2) - 1 - cached + spec["num_draft_tokens"] + spec["num_rounds"]
        outputs[reuse] = (out1, second["choices"][0]["token_ids"])
    assert outputs[True] == outputs[False]


def test_a_server_with_another_acceptance_rule_uses_it():
    from verispec.audit import NAIVE_RULES

    naive = NAIVE_RULES["naive-agree"]
    decoder = toy_decoder()
    with BackgroundServer(create_app(decoder, k=3, rule=naive)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            body = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0,
                                                        "seed": 3, "return_token_ids": True}).json()
    assert body["metrics"]["speculative_decoding"]["rule"] == "naive-agree"
    ref = decoder.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=3, k=3, rule=naive)
    assert body["choices"][0]["token_ids"] == ref.token_ids


def test_per_request_drafter_and_k(toy):
    _, client = toy
    plain = complete(client, max_tokens=10, k=0, return_token_ids=True)
    assert plain["metrics"]["speculative_decoding"]["num_draft_tokens"] == 0
    lookup = complete(client, max_tokens=10, k=2, drafter="lookup", return_token_ids=True)
    assert lookup["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]   # greedy: exact
    drafted = lookup["metrics"]["speculative_decoding"]["num_accepted_tokens_by_drafter"]
    assert set(drafted) <= {"lookup"}
    model = complete(client, max_tokens=10, k=2, drafter="model")
    spec = model["metrics"]["speculative_decoding"]
    assert set(spec["num_accepted_tokens_by_drafter"]) == {"model"}
    assert spec["num_draft_tokens_by_drafter"] == {"model": spec["num_draft_tokens"]} and spec["num_draft_tokens"] > 0


def test_models_health_and_metrics(toy):
    _, client = toy
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "toy"
    assert client.get("/v1/models/toy").json() == models["data"][0]
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "verispec:spec_decode_num_drafts_total" in metrics.text
    assert client.get("/nowhere").json()["error"]["type"] == "not_found_error"


def test_health_is_503_while_loading_then_200():
    app = create_app(None)
    with BackgroundServer(app) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/health").status_code == 503
            for r in (client.get("/v1/models"), client.post("/v1/completions", json={"prompt": [1]})):
                assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
            app.state.verispec.attach(toy_decoder())
            assert client.get("/health").status_code == 200
            assert client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2}).status_code == 200


def test_api_key_guards_the_v1_routes_only():
    with BackgroundServer(create_app(toy_decoder(), api_key="sekret")) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = client.get("/v1/models", headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
            assert r.status_code == 401
            ok = {"Authorization": "Bearer sekret"}
            assert client.get("/v1/models", headers=ok).status_code == 200
            assert client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2}, headers=ok).status_code == 200
            assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
