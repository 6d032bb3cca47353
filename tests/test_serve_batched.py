"""`verispec serve --max-seqs N`: continuous batching over real HTTP, each response its solo run.

SmolLM2-135M on llama.cpp (batch-invariant mode), the server on 127.0.0.1 with 3 (or 2)
sequence slots. Every response is compared with the same request decoded alone in process
(`SpeculativeDecoder.generate` on a fresh solo model): greedy responses token for token,
sampled ones token for token with the same seed (the coupled rule, which "auto" picks for
k = "auto" and for point-mass drafters: the seeded solo sample for any drafts). Requests
arrive staggered, mix greedy and sampled, streams and not, stop strings, budgets, n = 2,
fixed and adaptive k and a prompt longer than one 512-token prefill piece. No timings are
asserted; waits are hang guards.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import needs_llama_cpp
from test_serve_toys import sse_events, wait_for

pytestmark = needs_llama_cpp

WAIT = 600       # seconds: a hang guard, not a timing assertion
CTX = 1024       # tokens per slot


@pytest.fixture(scope="module")
def decoder():
    from verispec.api import SpeculativeDecoder

    dec = SpeculativeDecoder("smollm2-135m", None, drafter="auto", backend="llamacpp", k_max=4)
    assert dec.target.batch_invariant
    return dec


def serve(decoder, slots: int, **options):
    from verispec.serve import BackgroundServer, create_app
    from verispec.serve.batched import load_batch_models

    batch = load_batch_models(decoder, slots, n_ctx_per_seq=CTX)
    app = create_app(decoder, batch=batch, **options)
    return app, batch, BackgroundServer(app)


def solo(decoder, spec: dict, url: str) -> list[tuple[list[int], str]]:
    """(token ids, finish reason) of each choice of `spec` decoded alone, from an empty cache
    (the prompt's ids as the server's /tokenize gives them)."""
    out = []
    seed = spec.get("seed")
    for i in range(spec.get("n", 1)):
        decoder.target.reset()
        result = decoder.generate(
            prompt_ids(spec, url), max_new_tokens=spec["max_tokens"], temperature=spec.get("temperature", 0.0),
            top_p=spec.get("top_p", 1.0), repetition_penalty=spec.get("repetition_penalty", 1.0), seed=None if seed is None else seed + i, k=spec.get("k", "auto"),
            drafter=spec.get("drafter"), stop_strings=spec.get("stop"), ignore_eos=spec.get("ignore_eos", False))
        out.append((result.token_ids, result.finish_reason))
    return out


def prompt_ids(spec: dict, url: str) -> list[int]:
    key = "messages" if "messages" in spec else "prompt"
    resp = httpx.post(url + "/tokenize", json={key: spec[key]}, timeout=WAIT)
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def body(spec: dict) -> dict:
    return {"temperature": 0.0, **spec, "return_token_ids": True}     # the API's default is 1


def post(http: httpx.Client, spec: dict, on_chunk=None) -> list[tuple[list[int], str]]:
    """Send `spec` to the right endpoint; (token ids, finish reason) per choice."""
    path = "/v1/chat/completions" if "messages" in spec else "/v1/completions"
    if not spec.get("stream"):
        resp = http.post(path, json=body(spec))
        assert resp.status_code == 200, resp.text
        choices = sorted(resp.json()["choices"], key=lambda c: c["index"])
        return [(c["token_ids"], c["finish_reason"]) for c in choices]
    with http.stream("POST", path, json=body(spec)) as resp:
        assert resp.status_code == 200, resp.read()
        events = []
        for line in resp.iter_lines():
            events += sse_events([line])
            if on_chunk is not None and events:
                on_chunk(events)
    assert events[-1] == "[DONE]"
    ids, reasons = {}, {}
    for event in events[:-1]:
        for c in event["choices"]:
            ids.setdefault(c["index"], []).extend(c.get("token_ids") or [])
            if c.get("finish_reason"):
                reasons[c["index"]] = c["finish_reason"]
    return [(ids[i], reasons[i]) for i in sorted(ids)]


def chat(text: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": text}], **kw}


LONG = ("Here is a list of facts. " + " ".join(f"Fact {i}: the number {i} squared is {i * i}."
                                               for i in range(36)) + " Which fact mentions 49?")
SPECS = [
    chat("Count from one to twenty in words.", max_tokens=32, stream=True),
    {"prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):", "max_tokens": 24, "temperature": 0.8,
     "seed": 11, "k": 3, "drafter": "lookup"},
    chat("Say yes.", max_tokens=5, k=0),                                     # leaves early: its slot is reused
    chat("Write a short poem about the sea.", max_tokens=28, temperature=1.0, top_p=0.9, seed=5, stream=True),
    {"prompt": "Colours: red, green, blue, red, green, blue, red,", "max_tokens": 40, "k": 2,
     "drafter": "suffix", "stop": [" blue"]},                                # a stop string ends it
    chat("Repeat: apple, banana, cherry, apple, banana, cherry.", max_tokens=20, k=4, drafter="lookup",
         ignore_eos=True),
    {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "seed": 3, "k": 0, "n": 2},
    {"prompt": LONG, "max_tokens": 12, "k": 3, "drafter": "lookup"},         # prefill in 2 pieces
]


def test_staggered_concurrent_requests_each_equal_their_solo_run(decoder):
    app, batch, server = serve(decoder, 3, max_batched_rows=64)     # prompt pieces wait their turn
    engine = app.state.verispec.engine
    loads, policies = [], []
    make_policy = engine._policy

    def recording_policy(req, drafters):       # the k="auto" requests' load, as set_load is told it
        policy = make_policy(req, drafters)
        costs = getattr(policy, "costs", None)
        if costs is not None:
            set_load = costs.set_load

            def told(sequences=1, other_rows=0):
                loads.append((sequences, other_rows))
                set_load(sequences, other_rows)
            costs.set_load = told
            policies.append(policy)
        return policy

    engine._policy = recording_policy
    got: list = [None] * len(SPECS)
    started = [threading.Event() for _ in SPECS]
    with server as url:
        want = [solo(decoder, spec, url) for spec in SPECS]
        assert 512 < len(prompt_ids(SPECS[-1], url)) < CTX - 20      # more than one prefill piece

        def client(i: int) -> None:
            try:
                if i:                  # staggered: each arrives once the one before it streams or is sent
                    assert started[i - 1].wait(WAIT)
                with httpx.Client(base_url=url, timeout=WAIT) as http:
                    if SPECS[i].get("stream"):
                        got[i] = post(http, SPECS[i], on_chunk=lambda events: started[i].set())
                    else:
                        started[i].set()
                        got[i] = post(http, SPECS[i])
            finally:
                started[i].set()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(SPECS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        history = list(engine.history)
    batch.free()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"request {i} ({SPECS[i]}) left its solo run"
    assert got[4][0][1] == "stop" and got[0][0][1] in ("length", "stop")
    assert engine.rounds.max_live == 3                         # they decoded together
    assert engine.rounds.forwards < sum(len(ids) for choices in want for ids, _ in choices)
    assert {h["slot"] for h in history} == {0, 1, 2}
    assert policies and max(b for b, _ in loads) > 1           # k=auto priced under the load
    assert all(r >= b - 1 for b, r in loads)


def test_a_freed_slot_taken_by_a_later_request_out_of_arrival_order_is_exact(decoder):
    """TensorRT-LLM PR #3456's bug class: a request ending early frees a slot that a
    newcomer takes while an older one still decodes; nothing of the previous occupant
    (cache, randomness, penalties) may leak into it."""
    long = chat("List the planets of the solar system with one fact each.", max_tokens=160,
                ignore_eos=True, stream=True)
    short = {"prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 6,
             "temperature": 0.9, "seed": 1, "repetition_penalty": 1.3, "ignore_eos": True}
    newcomer = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0.8, "seed": 2,
                "ignore_eos": True}
    app, batch, server = serve(decoder, 2)
    engine = app.state.verispec.engine
    got: dict = {}
    with server as url:
        want = [solo(decoder, spec, url) for spec in (long, short, newcomer)]
        streaming = threading.Event()

        def run_long() -> None:
            with httpx.Client(base_url=url, timeout=WAIT) as http:
                got["long"] = post(http, long, on_chunk=lambda events: streaming.set())

        thread = threading.Thread(target=run_long)
        thread.start()
        assert streaming.wait(WAIT)
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            got["short"] = post(http, short)          # slot 1, done while the long one decodes
            got["newcomer"] = post(http, newcomer)    # takes slot 1 again
        thread.join(WAIT)
    batch.free()
    assert [got["long"], got["short"], got["newcomer"]] == want
    order = [(h["slot"], h["tokens"]) for h in engine.history]
    assert order[:2] == [(1, 6), (1, 12)], f"the newcomer did not reuse the freed slot 1: {order}"
    assert order[2] == (0, 160)


def test_a_disconnected_stream_is_cancelled_and_the_others_stay_exact(decoder):
    specs = [chat("Count from one to twenty in words.", max_tokens=40, stream=True),
             chat("Write a long story about a dragon.", max_tokens=200, ignore_eos=True, stream=True,
                  temperature=0.9, seed=9),
             {"prompt": "Colours: red, green, blue, red, green,", "max_tokens": 40, "temperature": 0.6,
              "seed": 4, "k": 3, "drafter": "lookup", "stream": True}]
    app, batch, server = serve(decoder, 3)
    engine = app.state.verispec.engine
    got: list = [None] * 3
    with server as url:
        want = [solo(decoder, specs[0], url), None, solo(decoder, specs[2], url)]
        gate = threading.Event()

        def client(i: int) -> None:
            assert gate.wait(WAIT)
            with httpx.Client(base_url=url, timeout=WAIT) as http:
                got[i] = post(http, specs[i])

        threads = [threading.Thread(target=client, args=(i,)) for i in (0, 2)]
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            with http.stream("POST", "/v1/chat/completions", json=body(specs[1])) as resp:
                chunks = 0
                for line in resp.iter_lines():
                    chunks += line.startswith("data: ")
                    if chunks == 2:
                        gate.set()
                        for t in threads:
                            t.start()
                        wait_for(lambda: len(engine.running) >= 2, WAIT, "another request to decode")
                        break            # the client leaves mid-stream
        for t in threads:
            t.join(WAIT)
        wait_for(lambda: len(engine.history) == 3, WAIT, "the cancelled request to end")
        history = list(engine.history)
    batch.free()
    assert got[0] == want[0] and got[2] == want[2]
    assert engine.rounds.max_live >= 2
    dropped = [h for h in history if h["finish_reason"] == "abort"]
    assert len(dropped) == 1 and dropped[0]["tokens"] < 200 and dropped[0]["rounds_at_cancel"] is not None


def test_batched_mode_refuses_what_it_does_not_support_with_a_400(decoder):
    app, batch, server = serve(decoder, 2)
    with server as url, httpx.Client(base_url=url, timeout=WAIT) as http:
        resp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "echo": True, "logprobs": 1})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "echo"
        resp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    batch.free()
