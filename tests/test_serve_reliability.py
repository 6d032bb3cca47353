"""The server's guarantees over toy models: every bad input is a 400 naming the field
(and the server keeps serving), a full queue is a 429 with Retry-After, a client that
disconnects costs at most one more round, concurrent clients get exactly their own
answers, and /metrics adds up to the responses."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_serve_toys import CONTEXT, metric_totals, sse_events, toy_decoder, wait_for

from verispec.serve import BackgroundServer, create_app

NAN = float("nan")

# (endpoint, body, the field the 400 must name)
BAD = [
    ("completions", {"model": "gpt-4", "prompt": [1]}, "model"),
    ("completions", {"max_tokens": 4}, "prompt"),
    ("completions", {"prompt": []}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": {"text": "hi"}}, "prompt"),
    ("completions", {"prompt": [[1], [2]]}, "prompt"),
    ("completions", {"prompt": [1, 16]}, "prompt[1]"),
    ("completions", {"prompt": [1, -1]}, "prompt[1]"),
    ("completions", {"prompt": [1, 2.5]}, "prompt[1]"),
    ("completions", {"prompt": [1, True]}, "prompt[1]"),
    ("completions", {"prompt": [1] * CONTEXT}, "prompt"),
    ("completions", {"prompt": [1], "max_tokens": -1}, "max_tokens"),
    ("completions", {"prompt": [1], "max_tokens": CONTEXT}, "max_tokens"),
    ("completions", {"prompt": [1], "max_tokens": "8"}, "max_tokens"),
    ("completions", {"prompt": [1], "temperature": -0.5}, "temperature"),
    ("completions", {"prompt": [1], "temperature": NAN}, "temperature"),
    ("completions", {"prompt": [1], "temperature": float("inf")}, "temperature"),
    ("completions", {"prompt": [1], "temperature": "hot"}, "temperature"),
    ("completions", {"prompt": [1], "temperature": True}, "temperature"),
    ("completions", {"prompt": [1], "top_p": 0}, "top_p"),
    ("completions", {"prompt": [1], "top_p": 1.5}, "top_p"),
    ("completions", {"prompt": [1], "top_k": -2}, "top_k"),
    ("completions", {"prompt": [1], "min_p": 2}, "min_p"),
    ("completions", {"prompt": [1], "repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"prompt": [1], "presence_penalty": 3}, "presence_penalty"),
    ("completions", {"prompt": [1], "frequency_penalty": -2.5}, "frequency_penalty"),
    ("completions", {"prompt": [1], "logit_bias": {"99": 1}}, "logit_bias.99"),
    ("completions", {"prompt": [1], "logit_bias": {"1": 500}}, "logit_bias.1"),
    ("completions", {"prompt": [1], "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ("completions", {"prompt": [1], "seed": "x"}, "seed"),
    ("completions", {"prompt": [1], "n": 17}, "n"),
    ("completions", {"prompt": [1], "n": 0}, "n"),
    ("completions", {"prompt": [1], "stop_token_ids": [99]}, "stop_token_ids[0]"),
    ("completions", {"prompt": [1], "ignore_eos": "yes"}, "ignore_eos"),
    ("completions", {"prompt": [1], "stop": 5}, "stop"),
    ("completions", {"prompt": [1], "stop": [5]}, "stop[0]"),
    ("completions", {"prompt": [1], "stop": [""]}, "stop[0]"),
    ("completions", {"prompt": [1], "stop": ["a"] * 17}, "stop"),
    ("completions", {"prompt": [1], "stop": ["a"]}, "stop"),          # toy: no tokenizer
    ("completions", {"prompt": [1], "logprobs": 21}, "logprobs"),
    ("completions", {"prompt": [1], "stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"prompt": [1], "stream": "yes"}, "stream"),
    ("completions", {"prompt": [1], "k": -1}, "k"),
    ("completions", {"prompt": [1], "k": "fast"}, "k"),
    ("completions", {"prompt": [1], "drafter": "psychic"}, "drafter"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
    ("completions", {"prompt": [1], "suffix": "x"}, "suffix"),
    ("completions", {"prompt": [1], "best_of": 2}, "best_of"),
    ("completions", {"prompt": [1], "max_token": 3}, "max_token"),
    ("chat/completions", {}, "messages"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": "hi"}, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),   # toy: no template
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
     "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                          "max_completion_tokens": 3}, "max_completion_tokens"),
]


@pytest.fixture(scope="module")
def server():
    decoder = toy_decoder()
    app = create_app(decoder, k=3)
    with BackgroundServer(app) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield app, decoder, client


@pytest.mark.parametrize("endpoint,body,param", BAD, ids=[f"{e}:{p}" for e, _, p in BAD])
def test_bad_input_is_a_400_naming_the_field_then_a_good_request_succeeds(server, endpoint, body, param):
    _, _, client = server
    r = client.post(f"/v1/{endpoint}", content=json.dumps(body),      # NaN/Infinity as Python writes them
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"] == "invalid_request_error" and "code" in error
    good = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"\"text\""])
def test_a_body_that_is_not_a_json_object_is_a_400(server, raw):
    _, _, client = server
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] is None


def test_neutral_values_of_unsupported_fields_are_accepted(server):
    _, _, client = server
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2, "n": 1, "echo": False,
                                             "best_of": 1, "logprobs": None, "user": "me", "tools": None})
    assert r.status_code == 200, r.text


def test_a_full_queue_is_a_429_with_retry_after_and_the_queue_is_fifo():
    gate = threading.Semaphore(0)
    app = create_app(toy_decoder(gate=gate, draft=False), k=0, max_queue=1)
    engine = app.state.verispec.engine
    with BackgroundServer(app) as url, ThreadPoolExecutor(2) as pool, httpx.Client(base_url=url, timeout=60) as c:
        first = pool.submit(c.post, "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
        wait_for(lambda: engine.current is not None, what="the first request to start")
        second = pool.submit(c.post, "/v1/completions", json={"prompt": [3, 4], "max_tokens": 3})
        wait_for(lambda: engine.waiting == 1, what="the second request to queue")
        third = c.post("/v1/completions", json={"prompt": [5], "max_tokens": 3})
        assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(third.headers["Retry-After"]) >= 1
        gate.release(10_000)
        a, b = first.result(), second.result()
        assert a.status_code == b.status_code == 200
        order = [h["id"] for h in engine.history]
        assert order == [a.json()["id"], b.json()["id"]]
        assert c.post("/v1/completions", json={"prompt": [5], "max_tokens": 3}).status_code == 200


def test_a_request_of_n_choices_is_admitted_whole_or_not_at_all():
    """A 429 for an n > 1 request used to queue the choices that fitted and cancel them: they
    held queue places from other clients until skipped and were counted as aborted requests.
    Now the n choices are queued together or none is; n above the queue's size is a 400."""
    gate = threading.Semaphore(0)
    app = create_app(toy_decoder(gate=gate, draft=False), k=0, max_queue=3)
    engine = app.state.verispec.engine
    with BackgroundServer(app) as url, ThreadPoolExecutor(3) as pool, httpx.Client(base_url=url, timeout=60) as c:
        first = pool.submit(c.post, "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
        wait_for(lambda: engine.current is not None, what="the first request to start")
        second = pool.submit(c.post, "/v1/completions", json={"prompt": [3, 4], "max_tokens": 3})
        wait_for(lambda: engine.waiting == 1, what="the second request to queue")
        before = metric_totals(c.get("/metrics").text)
        busy = c.post("/v1/completions", json={"prompt": [5], "max_tokens": 3, "n": 3, "temperature": 1, "seed": 1})
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
        assert engine.waiting == 1                       # no choice of it was left in the queue
        never = c.post("/v1/completions", json={"prompt": [5], "max_tokens": 3, "n": 4, "temperature": 1})
        assert never.status_code == 400 and never.json()["error"]["param"] == "n"
        fits = pool.submit(c.post, "/v1/completions", json={"prompt": [5], "max_tokens": 3, "n": 2,
                                                            "temperature": 1, "seed": 1})
        wait_for(lambda: engine.waiting == 3, what="both choices of the n = 2 request to queue")
        gate.release(10_000)
        assert first.result().status_code == second.result().status_code == 200
        assert len(fits.result().json()["choices"]) == 2
        after = metric_totals(c.get("/metrics").text)
    abort = 'verispec:request_success_total{finished_reason="abort"}'
    assert after.get(abort, 0.0) == before.get(abort, 0.0)


def test_a_client_that_disconnects_mid_stream_costs_at_most_one_more_round():
    """Rounds are counted, not timed: the target's forwards are gated, so the test knows
    how many rounds had run when the server learnt of the disconnect."""
    gate = threading.Semaphore(0)
    decoder = toy_decoder(gate=gate, draft=False)
    app = create_app(decoder, k=0)
    engine = app.state.verispec.engine
    rounds_before_disconnect = 3
    with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        gate.release(1 + rounds_before_disconnect)            # the prefill, then 3 rounds
        body = {"prompt": [1, 2, 3], "max_tokens": 50, "temperature": 0, "stream": True, "return_token_ids": True}
        received = []
        with client.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                for event in sse_events([line]):
                    received += event["choices"][0].get("token_ids", [])
                if len(received) == rounds_before_disconnect:
                    break                                       # leaving the block closes the connection
        job = engine.current
        wait_for(lambda: job.cancel_requested.is_set(), what="the server to notice the disconnect")
        gate.release(10_000)                                    # let the worker run freely
        wait_for(engine.idle, what="the abandoned request to stop")
        record = engine.history[-1]
        assert record["finish_reason"] == "abort"
        assert record["rounds_at_cancel"] == rounds_before_disconnect
        assert record["rounds"] <= rounds_before_disconnect + 1      # at most one more round
        # the next request is served, from consistent caches
        after = client.post("/v1/completions", json={"prompt": [1, 2, 3, 9], "max_tokens": 6, "temperature": 0,
                                                     "return_token_ids": True}).json()
    ref = decoder.generate([1, 2, 3, 9], max_new_tokens=6, temperature=0, k=0)
    assert after["choices"][0]["token_ids"] == ref.token_ids
    abort = metric_totals(app.state.verispec.metrics.exposition().decode())
    assert abort['verispec:request_success_total{finished_reason="abort"}'] == 1


def run_clients(url: str, jobs: list[dict], clients: int) -> list[dict]:
    """Send `jobs` from `clients` threads; return per job: token ids, usage, spec metrics."""
    def one(job):
        with httpx.Client(base_url=url, timeout=600) as c:
            body = {"temperature": 0, "return_token_ids": True, **job}
            if not job.get("stream"):
                r = c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                data = r.json()
                return {"ids": data["choices"][0]["token_ids"], "usage": data["usage"], "metrics": data["metrics"]}
            body["stream_options"] = {"include_usage": True}
            with c.stream("POST", "/v1/completions", json=body) as r:
                events = sse_events(r.iter_lines())
            assert events[-1] == "[DONE]"
            ids = [t for e in events[:-1] for ch in e["choices"] for t in ch.get("token_ids", [])]
            return {"ids": ids, "usage": events[-2]["usage"], "metrics": events[-2]["metrics"]}

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, jobs))


def check_totals(before: dict, after: dict, results: list[dict]) -> None:
    """/metrics deltas equal the sums over the responses."""
    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    spec = [r["metrics"]["speculative_decoding"] for r in results]
    assert delta("verispec:prompt_tokens_total") == sum(r["usage"]["prompt_tokens"] for r in results)
    assert delta("verispec:generation_tokens_total") == sum(r["usage"]["completion_tokens"] for r in results)
    assert delta("verispec:prefix_cache_hits_total") == sum(r["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                            for r in results)
    assert delta("verispec:spec_decode_num_drafts_total") == sum(s["num_spec_steps"] for s in spec)
    assert delta("verispec:spec_decode_num_draft_tokens_total") == sum(s["num_draft_tokens"] for s in spec)
    assert delta("verispec:spec_decode_num_accepted_tokens_total") == sum(s["num_accepted_draft_tokens"] for s in spec)
    assert delta("verispec:spec_decode_num_rounds_total") == sum(s["num_rounds"] for s in spec)
    for pos in range(max(len(s["num_accepted_tokens_per_pos"]) for s in spec)):
        name = f'verispec:spec_decode_num_accepted_tokens_per_pos_total{{position="{pos}"}}'
        assert delta(name) == sum(s["num_accepted_tokens_per_pos"][pos] for s in spec
                                  if pos < len(s["num_accepted_tokens_per_pos"]))
    finished = sum(delta(f'verispec:request_success_total{{finished_reason="{f}"}}') for f in ("stop", "length"))
    assert finished == len(results)
    assert delta("verispec:spec_decode_acceptance_length_count") == sum(s["num_spec_steps"] for s in spec)
    assert delta("verispec:time_to_first_token_seconds_count") == len(results)


def test_concurrent_clients_get_their_own_answers_and_metrics_add_up(server):
    _, decoder, client = server
    jobs = [{"prompt": [1 + i % 7, 2 + i % 5, i % 3], "max_tokens": 6 + i % 5, "stream": i % 2 == 1,
             "k": [3, "auto", 1][i % 3]} for i in range(12)]
    for job in jobs:    # each answer alone, in process, before the load
        job["expect"] = decoder.generate(job["prompt"], max_new_tokens=job["max_tokens"], temperature=0,
                                         k=job["k"]).token_ids
    before = metric_totals(client.get("/metrics").text)
    results = run_clients(str(client.base_url), [{k: v for k, v in j.items() if k != "expect"} for j in jobs], 4)
    after = metric_totals(client.get("/metrics").text)
    for job, result in zip(jobs, results):
        assert result["ids"] == job["expect"]
        assert result["usage"]["completion_tokens"] == len(job["expect"])
    check_totals(before, after, results)
