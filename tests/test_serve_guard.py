"""No input reaches a 500 and no client stalls another (toy models, 127.0.0.1 only):
hostile JSON is a 400 naming the place, error bodies quote a short prefix, a real fault
keeps the keep-alive connection, bodies and headers have size and time limits, the
prompt a length cap, requests a time limit, and the key guards every route that reads
the model's tokenizer."""

import http.client
import json
import socket
import threading
import time

import httpx
import pytest
from test_serve_toys import toy_decoder, wait_for

from verispec.serve import BackgroundServer, create_app
from verispec.serve.guard import Limits

GOOD = {"prompt": [1, 2], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    app = create_app(toy_decoder(), k=2, limits=Limits(max_request_bytes=200_000, read_timeout=1.0,
                                                      max_prompt_tokens=8))
    with BackgroundServer(app) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield app, client


def post_raw(client, path, raw: bytes, content_type="application/json"):
    return client.post(path, content=raw, headers={"content-type": content_type})


@pytest.mark.parametrize("raw,param", [
    (b"[" * 100_000 + b"]" * 100_000, None),                       # RecursionError in json
    (b'{"prompt": ' + b"[" * 70 + b"1" + b"]" * 70 + b"}", "prompt" + "[0]" * 64),   # past MAX_DEPTH
    (b'{"prompt": [1], "seed": ' + b"9" * 5000 + b"}", None),      # past Python's int-digit limit
    (b'{"prompt": [1], "seed": ' + b"9" * 30 + b"}", "seed"),       # outside 64 bits
    (b'{"prompt": "a\\ud800b"}', "prompt"),
    (b'{"prompt": [1], "stop": ["x", "\\udfff"]}', "stop[1]"),
    (b'{"prompt": [1], "\\ud800": 1}', "\\ud800"),
    (b'{"prompt": [1], "logit_bias": {"\\ud800": 1}}', "logit_bias.\\ud800"),
], ids=["deep", "depth", "digits", "int64", "prompt", "stop", "field", "logit_bias"])
def test_hostile_json_is_a_400_naming_where_and_the_server_keeps_serving(server, raw, param):
    _, client = server
    r = post_raw(client, "/v1/completions", raw)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert client.post("/v1/completions", json=GOOD).status_code == 200


def test_a_lone_surrogate_in_chat_content_is_named_not_passed_to_the_tokenizer(server):
    _, client = server
    raw = b'{"messages": [{"role": "user", "content": "hi \\ud83d"}]}'
    r = post_raw(client, "/v1/chat/completions", raw)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"


def test_a_lone_surrogate_at_tokenize_is_a_400(server):
    _, client = server
    r = post_raw(client, "/tokenize", b'{"prompt": "\\ud800"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_an_error_quotes_only_a_short_prefix_of_a_large_value(server):
    _, client = server
    r = client.post("/v1/completions", json={"prompt": [1], "temperature": "x" * 150_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert len(r.text) < 2_000


def test_a_real_fault_is_a_500_in_openai_shape_and_the_connection_stays_usable(server, monkeypatch):
    app, client = server
    state = app.state.verispec

    def broken(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(state.prompter, "check_ids", broken)
    host, port = str(client.base_url.host), client.base_url.port
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", "/detokenize", body=json.dumps({"tokens": [1]}),
                     headers={"content-type": "application/json"})
        first = conn.getresponse()
        body = json.loads(first.read())
        assert first.status == 500 and body["error"]["type"] == "server_error"
        sock = conn.sock
        assert sock is not None                      # not closed after the 500
        monkeypatch.undo()
        conn.request("GET", "/health")
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read()) == {"status": "ok"}
        assert conn.sock is sock                     # the same connection answered
    finally:
        conn.close()


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_declared_json_is_a_415(server, content_type):
    _, client = server
    headers = {"content-type": content_type} if content_type else {}
    r = client.post("/v1/completions", content=json.dumps(GOOD).encode(), headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"
    assert client.post("/v1/completions", content=json.dumps(GOOD).encode(),
                       headers={"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_a_body_over_the_size_limit_is_a_413_declared_or_chunked(server):
    _, client = server
    big = json.dumps({"prompt": [1] * 80_000}).encode()          # 240,000 bytes > 200,000
    r = post_raw(client, "/v1/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():
        for i in range(0, len(big), 10_000):
            yield big[i:i + 10_000]
    r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def raw_socket(client) -> socket.socket:
    return socket.create_connection((str(client.base_url.host), client.base_url.port), timeout=30)


def test_a_413_reaches_a_client_that_sent_its_whole_body_first(server):
    """A client that writes its whole (too large) body before reading must get the 413, not a
    connection reset: the server drains the unread rest (bounded) before closing, since a
    socket closed with unread input sends an RST that can discard the answer in flight."""
    _, client = server
    big = json.dumps({"prompt": [1] * 80_000}).encode()          # 240,000 bytes > 200,000
    for _ in range(3):
        with raw_socket(client) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(big)}\r\n\r\n".encode() + big)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413") and b"request_too_large" in reply


def test_a_body_that_never_arrives_times_out_with_a_408(server):
    _, client = server
    with raw_socket(client) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\"")
        reply = b""
        while chunk := s.recv(65536):          # the server answers, then closes
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"read_timeout" in reply


def test_headers_that_never_finish_are_cut_off(server):
    _, client = server
    with raw_socket(client) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        assert s.recv(65536) == b""                   # the server closed the connection
    assert client.get("/health").status_code == 200


def test_a_prompt_over_the_cap_is_a_400_naming_the_option(server):
    _, client = server
    r = client.post("/v1/completions", json={"prompt": [1] * 9, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt" and "--max-prompt-tokens" in r.json()["error"]["message"]


def test_tokenizing_happens_off_the_event_loop(server, monkeypatch):
    """A request stuck in tokenization (here: held on an event) leaves /health answering."""
    app, client = server
    state = app.state.verispec
    held, release = threading.Event(), threading.Event()
    real = state.prompter.check_ids

    def slow(ids, param="prompt"):
        held.set()
        release.wait(60)
        return real(ids, param)

    monkeypatch.setattr(state.prompter, "check_ids", slow)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=client.post("/v1/completions", json=GOOD)))
    t.start()
    try:
        assert held.wait(60)
        with httpx.Client(base_url=str(client.base_url), timeout=10) as other:
            assert other.get("/health").status_code == 200
    finally:
        release.set()
        t.join(60)
    assert result["r"].status_code == 200


def test_a_request_past_its_time_limit_is_a_408_and_the_next_one_is_served():
    gate = threading.Semaphore(0)
    app = create_app(toy_decoder(gate=gate, draft=False), k=0, limits=Limits(request_timeout=0.2))
    engine = app.state.verispec.engine
    with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        result = {}
        t = threading.Thread(target=lambda: result.update(r=client.post(
            "/v1/completions", json={"prompt": [1, 2], "max_tokens": 20, "temperature": 0})))
        t.start()
        wait_for(lambda: engine.current is not None, what="the request to start")
        job = engine.current
        wait_for(lambda: time.perf_counter() > job.deadline, what="the deadline")
        gate.release(10_000)
        t.join(60)
        r = result["r"]
        assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
        assert "--request-timeout" in r.json()["error"]["message"]
        assert engine.history[-1]["rounds"] <= 1
        assert client.post("/v1/completions", json=GOOD).status_code == 200


def test_the_api_key_guards_the_tokenizer_routes_too():
    app = create_app(toy_decoder(), k=0, api_key="sk-test")
    with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        for method, path, body in [("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
                                   ("GET", "/tokenizer_info", None), ("GET", "/v1/models", None)]:
            r = client.request(method, path, json=body)
            assert r.status_code == 401, (path, r.text)
        ok = client.post("/detokenize", json={"tokens": [1]}, headers={"authorization": "Bearer sk-test"})
        assert ok.status_code == 400       # past the key: the toy has no tokenizer to detokenize with
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("key", ["", " pad ", "key\n", "naïve", "two words"])
def test_a_key_no_client_can_send_is_refused_at_start_up(key):
    with pytest.raises(ValueError, match="api_key"):
        create_app(toy_decoder(), api_key=key)


def test_shutdown_answers_the_queue_with_503_and_ends_the_running_stream_with_done():
    gate = threading.Semaphore(0)
    decoder = toy_decoder(gate=gate, draft=False)
    app = create_app(decoder, k=0)
    engine = app.state.verispec.engine
    server = BackgroundServer(app, graceful_seconds=0.2)
    url = server.__enter__()
    lines, queued = [], {}
    with httpx.Client(base_url=url, timeout=60) as client:
        gate.release(3)                                        # the prefill and two rounds

        def stream():
            body = {"prompt": [1, 2], "max_tokens": 50, "temperature": 0, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as r:
                lines.extend(line for line in r.iter_lines() if line)

        def queued_request():
            with httpx.Client(base_url=url, timeout=60) as other:
                queued["r"] = other.post("/v1/completions", json={"prompt": [3], "max_tokens": 2})

        running = threading.Thread(target=stream)
        running.start()
        wait_for(lambda: engine.current is not None, what="the stream to start")
        waiting = threading.Thread(target=queued_request)
        waiting.start()
        wait_for(lambda: engine.waiting == 1, what="the second request to queue")
        stopper = threading.Thread(target=server.__exit__, args=(None, None, None))
        stopper.start()
        waiting.join(60)
        r = queued["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"
        wait_for(lambda: engine.current is not None and engine.current.shutting_down, what="the grace to end")
        gate.release(10_000)
        running.join(60)
        stopper.join(60)
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: "):])
    assert final["choices"][0]["finish_reason"] == "abort"


def test_every_metric_series_carries_the_model_name(server):
    _, client = server
    client.post("/v1/completions", json=GOOD)
    series = [line for line in client.get("/metrics").text.splitlines() if line and not line.startswith("#")]
    assert series
    assert all('model_name="toy"' in line for line in series), [s for s in series if "model_name" not in s][:3]
    from verispec.plan.server_alpha import read_acceptance     # the planner's --metrics-url reader

    acceptance = read_acceptance(client.get("/metrics").text, model_name="toy")
    assert acceptance.model_name == "toy" and acceptance.drafts > 0
