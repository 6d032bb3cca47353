"""A drafter of one's own is an object, not a name in verispec: the optional capabilities
are runtime-checkable protocols, and `SpeculativeDecoder` / `generate` take the object."""

import pytest
from conftest import successor
from test_tables import RepeatLast

from verispec.api import SpeculativeDecoder
from verispec.drafters import (Drafter, LookupDrafter, ModelDrafter, SuffixDrafter, SupportsCalibrate,
                               SupportsCatchup, SupportsConfidences)


def test_capabilities_are_protocols_the_built_in_drafters_satisfy():
    model, suffix, lookup, mine = ModelDrafter(successor()), SuffixDrafter(), LookupDrafter(), RepeatLast()
    assert all(isinstance(d, Drafter) for d in (model, suffix, lookup, mine))
    assert isinstance(model, SupportsCatchup) and isinstance(model, SupportsCalibrate)
    assert not isinstance(model, SupportsConfidences)
    assert isinstance(suffix, SupportsConfidences) and isinstance(lookup, SupportsConfidences)
    assert not any(isinstance(mine, p) for p in (SupportsConfidences, SupportsCatchup, SupportsCalibrate))


def test_a_drafter_object_per_call_or_per_decoder_keeps_greedy_output():
    """successor() counts up by one: RepeatLast is always wrong, so every draft is rejected,
    and the output is still the target's."""
    sd = SpeculativeDecoder(successor(), drafter="none")
    plain = sd.generate([1], max_new_tokens=12, k=0)
    mine = RepeatLast()
    out = sd.generate([1], max_new_tokens=12, k=3, drafter=mine)
    assert out.token_ids == plain.token_ids
    assert out.stats.by_drafter["repeat"]["drafted"] > 0 and out.stats.by_drafter["repeat"]["accepted"] == 0
    again = sd.generate([1], max_new_tokens=12, k=3, drafter="repeat")    # by name, once given
    assert again.token_ids == plain.token_ids and sd.drafter_names("repeat") == ("repeat",)
    own = SpeculativeDecoder(successor(), drafter=mine)
    assert own.drafter == "repeat" and own.drafters == {"repeat": mine}
    assert own.generate([1], max_new_tokens=12, k="auto").token_ids == plain.token_ids


def test_a_drafter_object_is_checked_by_name():
    with pytest.raises(ValueError, match="drafter must be a name .* or a verispec.drafters.Drafter"):
        SpeculativeDecoder(successor(), drafter=object())
    clash = RepeatLast()
    clash.name = "model"
    with pytest.raises(ValueError, match="name of its own"):
        SpeculativeDecoder(successor(), drafter=clash)
