"""`generate(stop_token_ids=..., ignore_eos=...)`: generation ends at the first listed id
(kept, finish reason "eos"), or runs past EOS to the budget, the same for every k (a
drafted block is cut at the ending id exactly as plain decoding stops there)."""

import pytest
import torch

from verispec.api import SpeculativeDecoder
from verispec.models.toy import FunctionModel

V, EOS = 8, 3


def counting(name: str) -> FunctionModel:
    """Greedy toy: next token = last + 1 (mod V); EOS is 3."""
    def fn(prefix):
        out = torch.full((V,), -10.0, dtype=torch.float64)
        out[(prefix[-1] + 1) % V] = 0.0
        return out
    return FunctionModel(fn, V, eos_token_ids=[EOS], name=name)


@pytest.mark.parametrize("k", [0, 2, 4])
def test_stop_token_ids_and_ignore_eos(k):
    decoder = SpeculativeDecoder(counting("t"), counting("d"), drafter="model")
    plain = decoder.generate([0], max_new_tokens=7, temperature=0, k=k)
    assert plain.token_ids == [1, 2, 3] and plain.stats.finish_reason == "eos"
    early = decoder.generate([0], max_new_tokens=7, temperature=0, k=k, stop_token_ids=[2])
    assert early.token_ids == [1, 2] and early.finish_reason == "stop"
    past = decoder.generate([0], max_new_tokens=7, temperature=0, k=k, ignore_eos=True)
    assert past.token_ids == [1, 2, 3, 4, 5, 6, 7] and past.finish_reason == "length"
    both = decoder.generate([0], max_new_tokens=7, temperature=0, k=k, ignore_eos=True, stop_token_ids=[5])
    assert both.token_ids == [1, 2, 3, 4, 5] and both.finish_reason == "stop"


@pytest.mark.parametrize("kwargs,name", [({"stop_token_ids": [V]}, "stop_token_ids"),
                                         ({"stop_token_ids": [True]}, "stop_token_ids"),
                                         ({"ignore_eos": 1}, "ignore_eos")])
def test_malformed_ending_ids_are_refused_by_name(kwargs, name):
    decoder = SpeculativeDecoder(counting("t"), None, drafter="none")
    with pytest.raises(ValueError, match=name):
        decoder.generate([0], max_new_tokens=2, **kwargs)
