import importlib.util
import json
import os

# torch's and llama.cpp's OpenMP pools both live in the test process; on 2 cores their idle
# threads spin-waiting for work starve each other (a llama.cpp test measured 20 s -> 4 s with
# passive waiting). Only the tests set this: it must be set before either library loads.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from verispec.models.hf import HFModel  # noqa: E402
from verispec.prompts import MT_BENCH_CATEGORIES  # noqa: E402


def tiny_llama(seed: int, vocab: int = 96, layers: int = 2, hidden: int = 32,
               noise: float = 0.0) -> HFModel:
    """A random tiny Llama built from a config (no download).

    noise > 0 gives a draft: the weights of seed's model plus Gaussian noise of
    that relative size, so it agrees with the target often but not always.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
                         pad_token_id=None)
    model = LlamaForCausalLM(config)
    # sharpen the output so greedy argmaxes are well separated (no float near-ties)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        if noise:
            gen = torch.Generator().manual_seed(1000 + seed)
            for param in model.parameters():
                param.add_(noise * param.std() * torch.randn(param.shape, generator=gen))
    return HFModel(model, None, name=f"tiny-{seed}")


@pytest.fixture
def tiny_pair():
    return tiny_llama(0), tiny_llama(0, noise=0.25)


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny tensors: waking a second intra-op thread costs more than the work (and
    is very slow on a loaded 2-core machine). Real-model tests keep all threads."""
    if request.module.__name__.endswith("test_real_models"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# a small Spec-Bench-shaped question.jsonl: Spec-Bench categories and MT-Bench ones (two turns)
SPEC_BENCH_ROWS = (
    [("translation", f"Translate sentence {i}.") for i in range(3)]
    + [("qa", f"Who wrote book {i}?") for i in range(2)]
    + [("writing", "Write a poem."), ("writing", "Write a haiku."), ("roleplay", "Play a pirate."),
       ("coding", "Sort a list."), ("coding", "Reverse a string.")]
)


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "question.jsonl"
    with path.open("w") as f:
        for i, (cat, text) in enumerate(SPEC_BENCH_ROWS, start=1):
            turns = [text, "And now?"] if cat in MT_BENCH_CATEGORIES else [text]
            f.write(json.dumps({"question_id": i, "category": cat, "turns": turns}) + "\n")
    return path


# a model cache under tmp_path ($VERISPEC_CACHE), and a fake converted model directory in it
@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(root))
    return root


def fake_converted(directory, **info) -> None:
    """A directory the registry takes for a finished conversion (config, weights, marker)."""
    from verispec import registry

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"")
    (directory / registry.MARKER_NAME).write_text(json.dumps({"format": registry.CONVERT_FORMAT, **info}))


def successor(wrong_after=None, name="succ", vocab=6):
    """Greedy toy model: next token = last + 1 (mod vocab); after `wrong_after` it says 0 instead."""
    from verispec.models.toy import FunctionModel

    def fn(prefix):
        nxt = 0 if prefix[-1] == wrong_after else (prefix[-1] + 1) % vocab
        out = torch.full((vocab,), -10.0, dtype=torch.float64)
        out[nxt] = 0.0
        return out
    return FunctionModel(fn, vocab, name=name)


class RepeatLast:
    """A point-mass drafter written outside verispec (the README's example): the last token
    again, k times. Shared by the tests that register or pass a drafter object."""

    name, point_mass, alpha_prior = "repeat", True, 0.5
    forwards, seconds, catchup_seconds = 0, 0.0, 0.0

    def available(self, context):
        return 8

    def propose(self, context, k, sample):
        return [context[-1]] * k, None

    def rollback(self, committed):
        pass

    def reset(self):
        pass


# llama.cpp exactness tests: one skip marker, one prompt set, one way to load the model
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python not installed")

LLAMACPP_PROMPTS = [
    "Repeat this list exactly twice: apple, banana, cherry, date, elderberry, fig, grape.",
    "Write a Python function that returns the sum of a list of numbers.",
    "Count from one to twenty in words, separated by commas.",
]


def smol_batch_invariant():
    """SmolLM2-135M on llama.cpp in the batch-invariant mode (a verification forward scores
    its rows bit for bit as single steps), as every llama.cpp exactness test runs it."""
    from verispec.api import load_model

    model = load_model("smollm2-135m", backend="llamacpp", batch_invariant=True)
    assert model.batch_invariant
    return model


def _requantized(tmp_path_factory, ftype_name: str):
    """SmolLM2-135M requantized by llama.cpp itself (`llama_model_quantize`, a few seconds) to
    `llama_cpp.<ftype_name>`; skips where the batch-invariant mode's repacked path is not
    exact (`verispec.models.llamacpp.exact_repack`: an older build, AMX or KleidiAI)."""
    import ctypes

    import llama_cpp

    from verispec.models import llamacpp
    from verispec.registry import resolve

    if not llamacpp.exact_repack():
        pytest.skip("this llama.cpp build has no exact repacked path (patch level < 2, AMX or KleidiAI)")
    source = resolve("smollm2-135m", weights=False).gguf_path
    label = ftype_name.removeprefix("LLAMA_FTYPE_MOSTLY_").lower()
    path = tmp_path_factory.mktemp(label) / f"smollm2-135m-{label}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = getattr(llama_cpp, ftype_name), True, 2
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), ctypes.byref(params)) == 0
    return path


@pytest.fixture(scope="session")
def smol_q4_0_gguf(tmp_path_factory):
    """SmolLM2-135M in Q4_0: a type llama.cpp repacks at load on AVX2 and Arm CPUs
    (CPU_REPACK), so the batch-invariant mode's repacked path is exercised (`_requantized`)."""
    return _requantized(tmp_path_factory, "LLAMA_FTYPE_MOSTLY_Q4_0")


@pytest.fixture(scope="session")
def smol_q4_k_m_gguf(tmp_path_factory):
    """SmolLM2-135M in Q4_K_M, the type of the registry's GGUFs: its Q4_K tensors (the FFN
    down-projections; 576-wide rows fall back to other types) are repacked on AVX2 and, under
    the reference switch, scored by the multi-row Q4_K kernel (`tools/gemv_rows_q4_K.cpp`)."""
    return _requantized(tmp_path_factory, "LLAMA_FTYPE_MOSTLY_Q4_K_M")
