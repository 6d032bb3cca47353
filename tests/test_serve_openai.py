"""End to end with the official `openai` client against a real model (SmolLM2-135M on
transformers) served on 127.0.0.1: the server returns what `SpeculativeDecoder.generate`
returns for the same request, streamed or not."""

import httpx
import openai
import pytest

from verispec.api import SpeculativeDecoder, load_model
from verispec.serve import BackgroundServer, create_app

MODEL = "smollm2-135m"
QUESTION = "Write a Python function that returns the sum of a list."


@pytest.fixture(scope="module")
def smol():
    target = load_model(MODEL, backend="transformers", device="cpu")
    decoder = SpeculativeDecoder(target, None, drafter="lookup")     # one model: lean on a shared CPU
    with BackgroundServer(create_app(decoder, k=3)) as url:
        yield decoder, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900), url


def test_chat_greedy_equals_generate_streamed_or_not(smol):
    decoder, client, _ = smol
    messages = [{"role": "user", "content": QUESTION}]
    ref = decoder.generate(QUESTION, max_new_tokens=10, temperature=0, k=3)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                       extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.message.content == ref.text and choice.message.role == "assistant"
    assert choice.model_extra["token_ids"] == ref.token_ids
    assert r.model_extra["prompt_token_ids"] == ref.prompt_ids
    assert r.usage.completion_tokens == len(ref.token_ids) and r.usage.prompt_tokens == len(ref.prompt_ids)
    assert choice.finish_reason == "length"
    spec = r.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] == ref.stats.drafted and spec["num_rounds"] == ref.stats.target_forwards
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        else:
            usage = chunk.usage
    assert "".join(pieces) == ref.text
    assert usage.completion_tokens == len(ref.token_ids)


def test_completion_stop_string_text_ids_and_usage_agree_with_generate(smol):
    decoder, client, _ = smol
    prompt = "The three primary colours are"
    free = decoder.generate(prompt, max_new_tokens=16, temperature=0, k=3, use_chat_template=False)
    words = free.text.split()
    assert len(words) >= 3, free.text
    stop = words[2]
    ref = decoder.generate(prompt, max_new_tokens=16, temperature=0, k=3, use_chat_template=False,
                           stop_strings=[stop])
    assert ref.stats.finish_reason == "stop_string"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop],
                                  extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.text == ref.text and choice.finish_reason == "stop"
    assert choice.model_extra["token_ids"] == ref.token_ids == free.token_ids[:len(ref.token_ids)]
    assert r.usage.completion_tokens == len(ref.token_ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop], stream=True) if c.choices)
    assert streamed == ref.text


def test_seeded_sampling_reproduces_across_requests(smol):
    decoder, client, _ = smol
    prompt = "Once upon a time"

    def sample(seed):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0.9, top_p=0.95,
                                      seed=seed, extra_body={"return_token_ids": True})
        return r.choices[0].model_extra["token_ids"]

    first = sample(11)
    sample(12)
    assert sample(11) == first
    ref = decoder.generate(prompt, max_new_tokens=8, temperature=0.9, top_p=0.95, seed=11, k=3,
                           use_chat_template=False)
    assert first == ref.token_ids


def test_second_chat_turn_reuses_the_cached_prefix_and_equals_a_fresh_prefill(smol):
    decoder, client, url = smol
    turn1 = [{"role": "system", "content": "Answer in one short sentence."},
             {"role": "user", "content": "What is the capital of France?"}]
    first = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=8, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=8, temperature=0,
                                            extra_body={"return_token_ids": True})
    ids1 = httpx.post(url + "/tokenize", json={"messages": turn1}).json()["tokens"]
    ids2 = httpx.post(url + "/tokenize", json={"messages": turn2}).json()["tokens"]
    assert second.model_extra["prompt_token_ids"] == ids2 and ids2[:len(ids1)] == ids1
    assert second.usage.prompt_tokens_details.cached_tokens >= len(ids1)     # turn 1 was not prefilled again
    decoder.target.reset()                                                   # no reuse: prefill everything
    fresh = decoder.generate(ids2, max_new_tokens=8, temperature=0, k=3)
    assert second.choices[0].model_extra["token_ids"] == fresh.token_ids


def test_a_bad_chat_request_is_a_400_naming_the_field_and_the_server_goes_on(smol):
    _, client, _ = smol
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}], max_tokens=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model"
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_the_sdk_retrieves_the_served_model_and_a_clear_404_for_another(smol):
    """`client.models.retrieve(id)` (GET /v1/models/{id}) was a 404 for the served model too."""
    _, client, _ = smol
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4")
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_found"
