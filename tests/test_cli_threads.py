"""`--threads` on generate and serve: llama.cpp's thread count reaches every model loaded,
and a backend that has no such option refuses it by name before loading anything."""

import pytest
import typer
from typer.testing import CliRunner

import verispec.api
from verispec.cli import app
from verispec.cli.common import build_decoder

runner = CliRunner()


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_threads_on_a_backend_without_it_fails_by_name(command):
    extra = ["--port", "0"] if command == "serve" else ["hello"]
    result = runner.invoke(app, [command, *extra, "--target", "no-such-model", "--backend", "transformers",
                                 "--threads", "2"])
    assert result.exit_code == 2, result.output
    assert "--threads" in result.output and "llamacpp" in result.output


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_threads_below_one_is_refused(command):
    extra = ["--port", "0"] if command == "serve" else ["hello"]
    result = runner.invoke(app, [command, *extra, "--target", "no-such-model", "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.output


def test_threads_reach_the_target_and_the_draft(monkeypatch):
    seen = []

    def fake_load(name, **kwargs):
        seen.append((name, kwargs.get("n_threads")))
        if len(seen) == 2:      # the draft: stop before a decoder is built
            raise ValueError("stop here")
        return object()
    monkeypatch.setattr(verispec.api, "load_model", fake_load)
    with pytest.raises(typer.Exit):
        build_decoder("t", "d", "llamacpp", "model", threads=1)
    assert seen == [("t", 1), ("d", 1)]
    seen.clear()
    with pytest.raises(typer.Exit):
        build_decoder("t", "d", "llamacpp", "model")
    assert seen == [("t", None), ("d", None)]
