"""The server calls the API's own code (toy models, real HTTP on 127.0.0.1): its 400s
carry the API's messages (one validation of each setting), the settings reach
`generate` as one typed `SamplingConfig`, finish reasons are `GenerationResult`'s,
and a drafter object the decoder was given can be asked for by name."""

import httpx
import pytest
from test_serve_toys import toy_decoder

from verispec.api import SpeculativeDecoder
from verispec.encoding import PromptError
from verispec.sampling import SamplingConfig, SettingError
from verispec.serve import BackgroundServer, create_app

from conftest import RepeatLast

PROMPT = [3, 1, 4, 1, 5]


class Recording(SpeculativeDecoder):
    """Records the keyword arguments of every `generate` call."""

    calls: list

    def generate(self, prompt, **kw):
        self.calls.append(kw)
        return super().generate(prompt, **kw)


@pytest.fixture(scope="module")
def served():
    toy = toy_decoder(eos_token_ids=(7,))
    decoder = Recording(toy.target, toy.draft, drafter="auto")
    decoder.calls = []
    with BackgroundServer(create_app(decoder, k=3)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield decoder, client


@pytest.mark.parametrize("field,value,argument", [
    ("temperature", -0.5, "temperature"), ("top_p", 1.5, "top_p"), ("top_k", -2, "top_k"),
    ("min_p", 2.0, "min_p"), ("repetition_penalty", 0.0, "repetition_penalty"),
    ("presence_penalty", 3.0, "presence_penalty"), ("frequency_penalty", -2.5, "frequency_penalty"),
    ("min_tokens", -1, "min_new_tokens")])
def test_a_bad_setting_is_refused_with_the_apis_own_message(served, field, value, argument):
    decoder, client = served
    with pytest.raises(SettingError) as api:
        decoder.sampling_config(**{argument: value})
    assert api.value.name == argument
    r = client.post("/v1/completions", json={"prompt": PROMPT, field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    assert r.json()["error"]["message"] == str(api.value)


def test_a_bad_prompt_id_is_refused_with_the_apis_own_message(served):
    decoder, client = served
    with pytest.raises(PromptError) as api:
        decoder.encode([1, 99])
    assert api.value.param == "prompt[1]"
    r = client.post("/v1/completions", json={"prompt": [1, 99]})
    assert r.status_code == 400
    assert r.json()["error"] == {**r.json()["error"], "param": "prompt[1]", "message": str(api.value)}


def test_settings_reach_generate_as_one_sampling_config_and_give_generates_output(served):
    decoder, client = served
    decoder.calls.clear()
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10, "temperature": 0.7,
                                             "top_k": 3, "seed": 5, "min_tokens": 2,
                                             "return_token_ids": True})
    assert r.status_code == 200, r.text
    (kw,) = decoder.calls
    assert isinstance(kw["sampling"], SamplingConfig)
    assert (kw["sampling"].temperature, kw["sampling"].top_k, kw["sampling"].min_new_tokens) == (0.7, 3, 2)
    assert "temperature" not in kw and kw["seed"] == 5 and kw["k"] == 3
    ref = decoder.generate(PROMPT, max_new_tokens=10, temperature=0.7, top_k=3, seed=5, k=3, min_new_tokens=2)
    assert r.json()["choices"][0]["token_ids"] == ref.token_ids


def test_finish_reasons_are_the_apis(served):
    decoder, client = served
    seen = set()
    for seed in range(12):
        body = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "seed": seed,
                                                    "k": 0}).json()
        ref = decoder.generate(PROMPT, max_new_tokens=6, temperature=1.0, seed=seed, k=0)
        assert body["choices"][0]["finish_reason"] == ref.finish_reason
        seen.add(ref.stats.finish_reason)
    assert seen == {"eos", "length"}      # both mappings were exercised


def test_generate_takes_the_settings_as_keywords_or_as_one_config_not_both():
    decoder = toy_decoder()
    config = decoder.sampling_config(temperature=0.8, top_p=0.9)
    a = decoder.generate(PROMPT, max_new_tokens=8, sampling=config, seed=3, k=2)
    b = decoder.generate(PROMPT, max_new_tokens=8, temperature=0.8, top_p=0.9, seed=3, k=2)
    assert a.token_ids == b.token_ids
    with pytest.raises(ValueError, match="not both"):
        decoder.generate(PROMPT, max_new_tokens=8, sampling=config, temperature=0.5)


def test_a_drafter_object_is_served_under_its_name():
    toy = toy_decoder(draft=False)
    decoder = SpeculativeDecoder(toy.target, drafter=RepeatLast())
    assert decoder.drafter == "repeat" and decoder.drafter_names() == ("repeat",)
    with BackgroundServer(create_app(decoder, k=2)) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                 "drafter": "repeat", "return_token_ids": True})
        assert r.status_code == 200, r.text
        spec = r.json()["metrics"]["speculative_decoding"]
        plain = decoder.generate(PROMPT, max_new_tokens=6, temperature=0, k=0)
        assert r.json()["choices"][0]["token_ids"] == plain.token_ids
        bad = client.post("/v1/completions", json={"prompt": PROMPT, "drafter": "model"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "drafter"
    assert spec["num_draft_tokens"] > 0 and spec["num_accepted_tokens_by_drafter"].keys() <= {"repeat"}
