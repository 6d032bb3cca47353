"""Load and disconnects on a real model (SmolLM2-135M with a 10-layer self-draft, fixed k,
transformers: greedy speculative output is exactly plain greedy output). Bounded:
16 clients x 4 requests of 8 tokens, loopback only (about a minute on 2 cores: in the default run)."""

import threading

import httpx
import pytest
from test_serve_reliability import check_totals
from test_serve_toys import metric_totals, sse_events, wait_for

from verispec.api import SpeculativeDecoder, load_model
from verispec.serve import BackgroundServer, create_app


QUESTIONS = ["What is 2 + 2?", "Name a colour.", "Say hello in French.", "What is Python?",
             "Write a haiku about the sea.", "List three fruits.", "Who wrote Hamlet?", "Define entropy."]


@pytest.fixture(scope="module")
def served():
    target = load_model("smollm2-135m", backend="transformers", device="cpu")
    draft = load_model("smollm2-135m", backend="transformers", device="cpu", num_hidden_layers=10)
    decoder = SpeculativeDecoder(target, draft)
    app = create_app(decoder, k=3, max_queue=64)
    with BackgroundServer(app) as url:
        yield app, decoder, url


def test_16_clients_x_4_requests_each_get_their_answer_alone_and_metrics_add_up(served):
    _, decoder, url = served
    jobs = [{"q": QUESTIONS[(c + r) % len(QUESTIONS)], "k": 3 if (c + r) % 3 else 2, "stream": (c * 4 + r) % 2 == 0}
            for c in range(16) for r in range(4)]
    expect = {}
    for job in jobs:      # each answer alone, in process, before the load
        key = (job["q"], job["k"])
        if key not in expect:
            expect[key] = decoder.generate(job["q"], max_new_tokens=8, temperature=0, k=job["k"])

    results: list = [None] * len(jobs)

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=1800) as http:
            for r in range(4):
                i = c * 4 + r
                job = jobs[i]
                body = {"messages": [{"role": "user", "content": job["q"]}], "max_tokens": 8, "temperature": 0,
                        "k": job["k"], "return_token_ids": True}
                if job["stream"]:
                    body.update(stream=True, stream_options={"include_usage": True})
                    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                        assert resp.status_code == 200
                        events = sse_events(resp.iter_lines())
                    assert events[-1] == "[DONE]"
                    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
                    ids = [t for e in events[:-1] for ch in e["choices"] for t in ch.get("token_ids", [])]
                    results[i] = {"text": text, "ids": ids, "usage": events[-2]["usage"],
                                  "metrics": events[-2]["metrics"]}
                else:
                    resp = http.post("/v1/chat/completions", json=body)
                    assert resp.status_code == 200, resp.text
                    data = resp.json()
                    results[i] = {"text": data["choices"][0]["message"]["content"],
                                  "ids": data["choices"][0]["token_ids"], "usage": data["usage"],
                                  "metrics": data["metrics"]}

    with httpx.Client(base_url=url) as http:
        before = metric_totals(http.get("/metrics").text)
    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3600)
    assert not any(t.is_alive() for t in threads)
    with httpx.Client(base_url=url) as http:
        after = metric_totals(http.get("/metrics").text)
    assert all(r is not None for r in results), "a request was lost"
    for job, result in zip(jobs, results):
        ref = expect[(job["q"], job["k"])]
        assert result["ids"] == ref.token_ids and result["text"] == ref.text, job
        assert result["usage"]["completion_tokens"] == len(ref.token_ids)
        assert result["metrics"]["speculative_decoding"]["num_draft_tokens"] == ref.stats.drafted
    check_totals(before, after, results)
    assert sum(r["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] for r in results) > 0


def test_a_real_client_disconnect_stops_within_one_round_and_the_next_request_is_exact(served):
    app, decoder, url = served
    engine = app.state.verispec.engine
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 300, "temperature": 0, "stream": True}
    with httpx.Client(base_url=url, timeout=600) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            for line in resp.iter_lines():
                if any(e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")
                       for e in sse_events([line])):
                    break                    # the first text arrived: hang up
        wait_for(engine.idle, timeout=600, what="the abandoned request to stop")
        record = engine.history[-1]
        assert record["finish_reason"] == "abort"
        assert record["rounds"] - record["rounds_at_cancel"] <= 1
        assert record["tokens"] < 300
        after = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTIONS[0]}],
                                                        "max_tokens": 8, "temperature": 0, "k": 3}).json()
    assert after["choices"][0]["message"]["content"] == decoder.generate(
        QUESTIONS[0], max_new_tokens=8, temperature=0, k=3).text
