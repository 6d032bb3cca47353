"""One default backend rule for the CLI and the Python API (`verispec.models.default_backend`:
llama.cpp on a CPU when installed, transformers on a GPU): `load_model` without `backend`."""

import pytest

from verispec import api


class _Opened(Exception):
    """Raised by the fake backend class instead of loading anything."""


def _fake_backend_class(name):
    class Fake:
        @staticmethod
        def open(spec, **options):
            raise _Opened(name, options)
    return Fake


@pytest.mark.parametrize("device, rule", [("cpu", "llamacpp"), ("cuda", "transformers")])
def test_load_model_without_a_backend_follows_the_clis_rule(monkeypatch, device, rule):
    monkeypatch.setattr(api, "backend_class", _fake_backend_class)
    monkeypatch.setattr(api, "default_backend", lambda device=None: rule if device else "llamacpp")
    with pytest.raises(_Opened) as got:
        api.load_model("some-model", device=None if device == "cpu" else device)
    assert got.value.args[0] == rule


def test_an_option_only_another_backend_takes_chooses_that_backend(monkeypatch):
    monkeypatch.setattr(api, "backend_class", _fake_backend_class)
    monkeypatch.setattr(api, "default_backend", lambda device=None: "llamacpp")
    with pytest.raises(_Opened) as got:
        api.load_model("some-model", num_hidden_layers=4)
    assert got.value.args == ("transformers", {"fetch_missing": True, "num_hidden_layers": 4})
    with pytest.raises(_Opened) as got:
        api.load_model("some-model", n_threads=2)
    assert got.value.args == ("llamacpp", {"fetch_missing": True, "n_threads": 2})


@pytest.mark.parametrize("rule, flag, converts", [
    ("llamacpp", None, False), ("transformers", None, True),
    ("llamacpp", "--convert", True), ("transformers", "--no-convert", False)])
def test_models_fetch_converts_only_for_transformers(monkeypatch, rule, flag, converts):
    """`models fetch` converts to float32 only where transformers is the default backend or when
    asked: on a CPU the llama.cpp path reads the GGUF and 9 GB of conversion is waste (issue 25)."""
    from typer.testing import CliRunner

    from verispec import models, registry
    from verispec.cli import app

    converted = []
    monkeypatch.setattr(models, "default_backend", lambda device=None: rule)
    monkeypatch.setattr(registry, "fetch", lambda name: f"/cache/{name}.gguf")
    monkeypatch.setattr(registry, "convert", lambda name: converted.append(name) or f"/cache/hf/{name}")
    result = CliRunner().invoke(app, ["models", "fetch", "smollm2-135m"] + ([flag] if flag else []))
    assert result.exit_code == 0, result.output
    assert converted == (["smollm2-135m"] if converts else [])
