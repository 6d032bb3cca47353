"""The small core extensions the server relies on, tested on the core itself (tiny
transformers models with real KV caches): the round's ids and raw logits in
`RoundRecord`, cancellation by an observer's exception, the per-call drafter."""

import pytest
import torch
from conftest import tiny_llama

from verispec.api import SpeculativeDecoder

PROMPT = [3, 17, 42, 5, 9]


class Stop(Exception):
    pass


@pytest.fixture
def decoder():
    return SpeculativeDecoder(tiny_llama(0), tiny_llama(0, noise=0.25))


def test_round_records_carry_the_committed_ids_and_the_raw_target_logits(decoder):
    records = []
    out = decoder.generate(PROMPT, max_new_tokens=40, temperature=0, k=3, observer=records.append)
    assert [t for r in records for t in r.tokens] == out.token_ids
    assert all(len(r.tokens) == r.committed and r.logits.shape[0] == r.k + 1 for r in records)
    seq = list(PROMPT)
    for r in records:
        for i, token in enumerate(r.tokens):
            assert int(r.logits[i].argmax()) == token           # greedy: row i chose token i
            fresh = decoder.target
            fresh.reset()
            expected = fresh.forward(seq, keep=1)[-1]           # the raw logits, computed alone
            assert torch.allclose(r.logits[i], expected, atol=1e-4)
            seq.append(token)


def test_an_observer_exception_stops_after_that_round_with_consistent_caches(decoder):
    whole = decoder.generate(PROMPT, max_new_tokens=40, temperature=0, k=3)
    seen = []

    def observer(record):
        seen.append(record)
        if len(seen) == 3:
            raise Stop()

    with pytest.raises(Stop):
        decoder.generate(PROMPT, max_new_tokens=40, temperature=0, k=3, observer=observer)
    committed = PROMPT + [t for r in seen for t in r.tokens]
    assert decoder.target.tokens == committed[:-1]              # the target holds all but the last
    assert decoder.target.cache_length() == len(committed) - 1
    assert decoder.draft.tokens == committed[:len(decoder.draft.tokens)]
    assert decoder.draft.cache_length() == len(decoder.draft.tokens)
    again = decoder.generate(PROMPT, max_new_tokens=40, temperature=0, k=3)    # reuses those caches
    assert again.token_ids == whole.token_ids


def test_a_per_call_drafter_choice_is_used_and_checked(decoder):
    plain = decoder.generate(PROMPT, max_new_tokens=30, temperature=0, k=0)
    for choice in ("model", "lookup", "none"):
        records = []
        out = decoder.generate(PROMPT, max_new_tokens=30, temperature=0, k=3, drafter=choice,
                               observer=records.append)
        assert out.token_ids == plain.token_ids
        used = {r.drafter for r in records}
        assert used <= {choice, "none"}
        if choice == "model":
            assert "model" in used
    assert used == {"none"}
    with pytest.raises(ValueError, match="drafter"):
        decoder.generate(PROMPT, max_new_tokens=4, drafter="psychic")
    no_draft = SpeculativeDecoder(tiny_llama(0), None, drafter="lookup")
    with pytest.raises(ValueError, match="drafter"):
        no_draft.generate(PROMPT, max_new_tokens=4, drafter="model")
