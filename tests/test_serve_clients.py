"""The clients people bring: the request bodies the openai SDK, langchain-openai, lm-eval
and guidellm send (recorded from their source in tests/fixtures/clients/) are replayed
on 127.0.0.1 against a model with SmolLM2-135M's tokenizer and chat template (random
logits over its 49,152 tokens: no weights to load, so the test is quick and needs no
lock) and checked the way each client reads the answer,
and every field they need is exact: echo + logprobs over the prompt (lm-eval's
loglikelihood), usage in every chunk and ignore_eos (guidellm), n > 1 with seed + i,
stop_token_ids, real token bytes, text offsets, /tokenizer_info."""

import json
from pathlib import Path

import httpx
import pytest
import torch
from test_serve_toys import sse_events

from verispec import registry
from verispec.api import SpeculativeDecoder
from verispec.models.toy import FunctionModel
from verispec.serve import BackgroundServer, create_app

MODEL = "smollm2-135m"
FIXTURES = Path(__file__).parent / "fixtures" / "clients"


def worded_toy() -> FunctionModel:
    """Random float32 logits of the last two tokens, SmolLM2's tokenizer and EOS."""
    from transformers import AutoTokenizer

    try:
        path = registry.resolve(MODEL, fetch_missing=False).hf_path
    except Exception as e:  # noqa: BLE001 - not fetched on this machine
        pytest.skip(f"{MODEL} is not in the model cache: {e}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = len(tokenizer)

    def logits(prefix):
        key = (prefix[-1] * 7919 + (prefix[-2] if len(prefix) > 1 else 0)) % 2**31
        return torch.randn(vocab, generator=torch.Generator().manual_seed(key)) * 4

    model = FunctionModel(logits, vocab, eos_token_ids=[tokenizer.eos_token_id], context_length=2048, name=MODEL)
    model.tokenizer = tokenizer
    return model


@pytest.fixture(scope="module")
def smol():
    decoder = SpeculativeDecoder(worded_toy(), None, drafter="lookup")
    with BackgroundServer(create_app(decoder, k=3)) as url:
        with httpx.Client(base_url=url, timeout=600) as client:
            yield decoder, client


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def send(client, endpoint: str, body: dict):
    """POST a recorded body; a stream comes back as its decoded events."""
    if not body.get("stream"):
        r = client.post(endpoint, json=body)
        assert r.status_code == 200, r.text
        return r.json()
    with client.stream("POST", endpoint, json=body) as r:
        assert r.status_code == 200, r.read()
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return events[:-1]


def text_of(events: list[dict], chat: bool) -> dict[int, str]:
    out: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            piece = (choice["delta"].get("content") or "") if chat else choice["text"]
            out[choice["index"]] = out.get(choice["index"], "") + piece
    return out


def prompt_logprobs(target, ids: list[int]) -> tuple[list[float], list[bool]]:
    """log p(ids[i] | ids[:i]) for i >= 1, and whether ids[i] is that row's argmax, from
    one forward of a cleared cache (the server is idle between tests)."""
    target.reset()
    rows = torch.log_softmax(target.forward(ids[:-1]).double(), dim=-1)
    target.reset()
    return ([float(rows[i, ids[i + 1]]) for i in range(len(ids) - 1)],
            [int(rows[i].argmax()) == ids[i + 1] for i in range(len(ids) - 1)])


@pytest.mark.parametrize("client_name", ["openai_sdk", "langchain_openai"])
def test_recorded_chat_sdk_bodies_are_served_as_generate_answers(smol, client_name):
    decoder, client = smol
    for request in fixture(client_name)["requests"]:
        body, endpoint = request["body"], request["endpoint"]
        out = send(client, endpoint, body)
        n = body.get("n", 1)
        chat = endpoint.endswith("chat/completions")
        if body.get("stream"):
            texts = text_of(out, chat)
            assert out[-1]["usage"]["completion_tokens"] >= 1           # include_usage: the last chunk
        else:
            texts = {c["index"]: c["message"]["content"] if chat else c["text"] for c in out["choices"]}
        assert sorted(texts) == list(range(n))
        if chat:
            prompt = decoder.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
            prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
        else:
            prompt = decoder.tokenizer.encode(body["prompt"])
        for i in range(n):
            seed = None if body.get("seed") is None else body["seed"] + i
            ref = decoder.generate(prompt, max_new_tokens=body.get("max_tokens") or body["max_completion_tokens"],
                                   temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                   seed=seed, k=3, stop_strings=body.get("stop"))
            if body.get("temperature", 1.0) == 0 or seed is not None:
                assert texts[i] == ref.text, (client_name, i)


def test_lm_eval_loglikelihood_reads_exact_prompt_logprobs(smol):
    decoder, client = smol
    rec = fixture("lm_eval")
    body, ctxlen = rec["requests"][0]["body"], rec["ctxlen"]
    out = send(client, "/v1/completions", body)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    ids = body["prompt"][0]
    assert len(lp["token_logprobs"]) == len(ids) + 1                    # the prompt, then max_tokens=1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # what lm-eval's parse_logprobs computes: sum over the continuation, and is_greedy
    continuation = lp["token_logprobs"][ctxlen:-1]
    tops = lp["top_logprobs"][ctxlen:-1]
    ref, argmax = prompt_logprobs(decoder.target, ids)
    assert continuation == pytest.approx(ref[ctxlen - 1:], abs=1e-4)
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx(ref, abs=1e-4)
    is_greedy = [tok == max(top.values()) for tok, top in zip(continuation, tops)]
    assert is_greedy == argmax[ctxlen - 1:]
    # the text echoes the prompt, and the generated token's offset is the prompt's length
    prompt_text = decoder.tokenizer.decode(ids, skip_special_tokens=False)
    assert choice["text"].startswith(prompt_text)
    assert lp["text_offset"][0] == 0 and lp["text_offset"][len(ids)] == len(prompt_text)


def test_lm_eval_generate_until_and_remote_tokenizer(smol):
    decoder, client = smol
    rec = fixture("lm_eval")
    gen = rec["requests"][1]["body"]
    out = send(client, "/v1/completions", gen)
    ref = decoder.generate(gen["prompt"][0], max_new_tokens=gen["max_tokens"], temperature=0, k=3,
                           stop_strings=gen["stop"])
    assert out["choices"][0]["text"] == ref.text
    info = client.get("/tokenizer_info").json()                          # check_remote_tokenizer_support
    assert info["eos_token"] == decoder.tokenizer.eos_token and "chat_template" in info
    tokens = send(client, "/tokenize", rec["requests"][2]["body"])["tokens"]
    assert tokens == decoder.tokenizer.encode("test", add_special_tokens=False)
    eos = send(client, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})["tokens"]
    assert eos[0] == decoder.tokenizer.eos_token_id                      # RemoteTokenizer.eos_token_id


def test_tokenize_takes_vllms_add_generation_prompt_for_messages(smol):
    """vLLM's /tokenize field (default true) was refused as unknown."""
    decoder, client = smol
    messages = [{"role": "user", "content": "Hi there"}]
    template = decoder.tokenizer.apply_chat_template

    def ids(flag):
        out = template(messages, add_generation_prompt=flag, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    assert send(client, "/tokenize", {"messages": messages})["tokens"] == ids(True)
    assert send(client, "/tokenize", {"messages": messages, "add_generation_prompt": True})["tokens"] == ids(True)
    assert send(client, "/tokenize", {"messages": messages, "add_generation_prompt": False})["tokens"] == ids(False)
    assert ids(False) != ids(True)
    for body in ({"messages": messages, "add_generation_prompt": "no"}, {"prompt": "Hi", "add_generation_prompt": False}):
        r = client.post("/tokenize", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "add_generation_prompt", r.text


def test_guidellm_streams_carry_usage_in_every_chunk_and_ignore_eos_gives_the_exact_length(smol):
    _, client = smol
    for request in fixture("guidellm")["requests"]:
        body = request["body"]
        events = send(client, request["endpoint"], body)
        budget = body.get("max_tokens") or body["max_completion_tokens"]
        counts = [e["usage"]["completion_tokens"] for e in events]
        assert all("usage" in e for e in events)
        assert counts == sorted(counts) and counts[-1] == budget
        finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finishes == ["length"]


def test_ignore_eos_and_stop_token_ids_end_where_they_say(smol):
    decoder, client = smol
    eos = decoder.tokenizer.eos_token_id
    forced = {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logit_bias": {str(eos): 100},
              "return_token_ids": True}
    stopped = client.post("/v1/completions", json=forced).json()["choices"][0]
    assert stopped["token_ids"] == [eos] and stopped["finish_reason"] == "stop"
    kept = client.post("/v1/completions", json={**forced, "ignore_eos": True}).json()["choices"][0]
    assert kept["token_ids"] == [eos] * 4 and kept["finish_reason"] == "length"
    free = client.post("/v1/completions", json={"prompt": "The numbers are 1, 2,", "max_tokens": 8,
                                                "temperature": 0, "return_token_ids": True}).json()["choices"][0]
    stop_id = free["token_ids"][2]
    cut = free["token_ids"].index(stop_id) + 1
    r = client.post("/v1/completions", json={"prompt": "The numbers are 1, 2,", "max_tokens": 8, "temperature": 0,
                                             "return_token_ids": True, "stop_token_ids": [stop_id]})
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == free["token_ids"][:cut] and choice["finish_reason"] == "stop"


def test_n_choices_are_each_the_single_request_with_seed_plus_i_streamed_or_not(smol):
    _, client = smol
    body = {"prompt": "My favourite fruit is", "max_tokens": 6, "temperature": 1.0, "seed": 11,
            "return_token_ids": True}
    singles = [client.post("/v1/completions", json={**body, "seed": 11 + i}).json()["choices"][0]["token_ids"]
               for i in range(3)]
    many = client.post("/v1/completions", json={**body, "n": 3}).json()
    assert [c["token_ids"] for c in sorted(many["choices"], key=lambda c: c["index"])] == singles
    assert many["usage"]["completion_tokens"] == sum(len(s) for s in singles)
    events = send(client, "/v1/completions", {**body, "n": 3, "stream": True})
    streamed = {i: [] for i in range(3)}
    for e in events:
        for c in e["choices"]:
            streamed[c["index"]] += c.get("token_ids", [])
    assert [streamed[i] for i in range(3)] == singles


def test_logprob_bytes_are_the_tokens_real_bytes(smol):
    decoder, client = smol
    partial = decoder.tokenizer.convert_tokens_to_ids("ð")        # byte 0xF0: the start of an emoji
    eos = decoder.tokenizer.eos_token_id
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "logprobs": True,
        "top_logprobs": 1, "logit_bias": {str(partial): 100}}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert content[0]["bytes"] == [0xF0] and content[0]["token"] == "\ufffd"
    top = content[0]["top_logprobs"][0]      # under the raw logits (before logit_bias): another token
    assert bytes(top["bytes"]).decode("utf-8", "replace") == top["token"]
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "logprobs": True,
        "logit_bias": {str(eos): 100}}).json()
    special = r["choices"][0]["logprobs"]["content"][0]
    assert special["token"] == decoder.tokenizer.eos_token
    assert special["bytes"] == list(decoder.tokenizer.eos_token.encode())


def test_completion_offsets_start_at_zero_without_echo_and_at_the_prompt_length_with_it(smol):
    _, client = smol
    body = {"prompt": "Two plus two is", "max_tokens": 3, "temperature": 0, "logprobs": 1}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]
    echoed = client.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]
    n_prompt = len(echoed["logprobs"]["tokens"]) - 3
    assert plain["logprobs"]["text_offset"][0] == 0
    assert echoed["text"] == body["prompt"] + plain["text"]
    assert echoed["logprobs"]["text_offset"][n_prompt] == len(body["prompt"])
    assert echoed["logprobs"]["token_logprobs"][n_prompt:] == plain["logprobs"]["token_logprobs"]
