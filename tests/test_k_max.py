"""`k_max` (the largest draft length k="auto" considers) reaches the adaptive policy from
the API (`SpeculativeDecoder(k_max=...)`) and the CLI (`--k-max`, shared by `generate`
and `serve` through `build_decoder`)."""

import pytest
from test_tables import registered  # noqa: F401 - the fixture: a toy backend and drafter
from typer.testing import CliRunner

from verispec import api
from verispec.api import SpeculativeDecoder
from verispec.cli import app


@pytest.fixture
def k_maxes(monkeypatch):
    """The k_max of every policy `generate` builds."""
    seen, real = [], api.make_policy

    def spy(k, drafters, **kw):
        seen.append(kw.get("k_max"))
        return real(k, drafters, **kw)

    monkeypatch.setattr(api, "make_policy", spy)
    return seen


def test_the_api_passes_k_max_to_the_adaptive_policy(registered, k_maxes):  # noqa: F811
    sd = SpeculativeDecoder("anything", backend="chars", drafter="repeat", k_max=2)
    ks = []
    sd.generate("abcabcabc", max_new_tokens=40, k="auto", use_chat_template=False,
                observer=lambda record: ks.append(record.k))
    assert k_maxes == [2] and max(ks) <= 2
    with pytest.raises(ValueError, match="k_max"):
        SpeculativeDecoder("anything", backend="chars", k_max=0)


def test_the_cli_passes_k_max(registered, k_maxes):  # noqa: F811
    result = CliRunner().invoke(app, ["generate", "abcabc", "--target", "anything", "--backend", "chars",
                                      "--drafter", "repeat", "--k-max", "3", "--max-new-tokens", "8",
                                      "--no-chat-template", "--json"])
    assert result.exit_code == 0, result.output
    assert k_maxes and set(k_maxes) == {3}
    bad = CliRunner().invoke(app, ["generate", "abc", "--k-max", "0"])
    assert bad.exit_code == 2 and "--k-max" in bad.output
