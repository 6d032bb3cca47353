"""llama.cpp's batch-invariant mode: a verification forward is plain decoding, bit for bit.

By default llama.cpp's CPU backend scores a batch of k+1 tokens with other kernels
than one token (AMX / repacked weights, the tiled K-quant matmul, llamafile's
sgemm), and logits differ by up to ~0.9 (docs/exactness.md). In the
batch-invariant mode every row of a forward that returns several rows must equal
a single-token forward exactly, so speculative decoding on llama.cpp is token-for-token plain decoding
and a model used as its own draft is never rejected. All on SmolLM2-135M (GGUF).
"""


import pytest
import torch

from conftest import LLAMACPP_PROMPTS, needs_llama_cpp, smol_batch_invariant

pytestmark = needs_llama_cpp

PROMPTS = LLAMACPP_PROMPTS


@pytest.fixture(scope="module")
def smol():
    return smol_batch_invariant()


@pytest.fixture(scope="module")
def smol_self_pair(smol):
    """SmolLM2 as its own draft: a second instance of the same GGUF."""
    from verispec.api import SpeculativeDecoder, load_model

    draft = load_model("smollm2-135m", backend="llamacpp", batch_invariant=True)
    return SpeculativeDecoder(smol, draft, drafter="model")


def _context(model, n: int) -> list[int]:
    ids = model.tokenizer.encode(" ".join(PROMPTS) * 20)
    assert len(ids) >= n
    return ids[:n]


@pytest.mark.parametrize("context_len", [40, 253])   # 253 + 8 crosses the KV-cache padding of 256 cells
@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9])
def test_batch_forward_equals_single_token_forwards_bit_for_bit(smol, context_len, rows):
    context = _context(smol, context_len + rows)
    prefix, new = context[:context_len], context[context_len:]
    smol.reset()
    smol.forward(prefix, keep=1)
    single = torch.cat([smol.forward([t]) for t in new])
    smol.reset()
    smol.forward(prefix, keep=1)
    batch = smol.forward(new)
    assert batch.shape == single.shape == (rows, smol.vocab_size)
    gap = float((batch - single).abs().max())
    assert torch.equal(batch, single), f"{rows}-token forward differs from single tokens by {gap}"


def test_self_speculation_greedy_accepts_every_draft(smol_self_pair):
    for prompt in PROMPTS[:2]:
        plain = smol_self_pair.generate(prompt, max_new_tokens=40, k=0)
        spec = smol_self_pair.generate(prompt, max_new_tokens=40, k=4)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.drafted > 20
        assert spec.stats.accepted == spec.stats.drafted   # acceptance exactly 1.0
        assert spec.stats.draft_acceptance_rate == 1.0


def test_self_speculation_sampled_has_exact_alpha_one(smol_self_pair):
    """p and q are the same numbers, so Σ min(p, q) = Σ p = 1 at every position and u·q(x) < p(x) always."""
    records = []
    out = smol_self_pair.generate(PROMPTS[1], max_new_tokens=40, k=4, temperature=1.0, seed=3,
                                  observer=records.append)
    assert out.stats.drafted > 20 and out.stats.accepted == out.stats.drafted
    assert abs(out.stats.alpha_exact - 1.0) < 1e-5
    drafted = [r for r in records if r.k]
    assert drafted
    for r in drafted:
        assert torch.equal(r.px, r.qx)                        # bit-identical probabilities
        assert torch.allclose(r.alphas, torch.ones_like(r.alphas), atol=1e-5)


def test_greedy_speculative_equals_plain_with_rejections(smol):
    """Prompt lookup drafts that are partly rejected (rollback exercised); output must not move."""
    from verispec.api import SpeculativeDecoder

    decoder = SpeculativeDecoder(smol, None, drafter="lookup")
    rejected = 0
    for prompt in PROMPTS:
        plain = decoder.generate(prompt, max_new_tokens=48, k=0)
        spec = decoder.generate(prompt, max_new_tokens=48, k=4)
        assert spec.token_ids == plain.token_ids, prompt
        rejected += spec.stats.drafted - spec.stats.accepted
    assert rejected > 0


def test_batch_invariant_refused_where_impossible(monkeypatch):
    """A llama.cpp with llamafile's sgemm compiled in cannot be batch-invariant: a clear error, before loading."""
    import llama_cpp

    from verispec.models import llamacpp

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | LLAMAFILE = 1 |")
    with pytest.raises(RuntimeError, match="GGML_LLAMAFILE=OFF"):
        llamacpp.LlamaCppModel.load("no-such-file.gguf", batch_invariant=True)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 |")
    assert llamacpp.batch_invariance_blocker() is None
    monkeypatch.setenv("GGML_CPU_TILED_MM_FORCE", "1")
    assert "GGML_CPU_TILED_MM_FORCE" in llamacpp.batch_invariance_blocker()


def test_batch_invariant_is_a_llamacpp_option():
    from verispec.api import load_model

    with pytest.raises(ValueError, match="llama.cpp option"):
        load_model("smollm2-135m", backend="transformers", batch_invariant=True)


def test_flash_attention_reaches_llama_cpp_and_refuses_the_batch_invariant_mode(smol, monkeypatch):
    """`flash_attn=True` (llama-server's default kernels, for an audit's reference) turns the
    batch-invariant mode off, is refused with it, and really changes the attention kernel."""
    from verispec.api import load_model
    from verispec.models import llamacpp

    monkeypatch.setenv("VERISPEC_LLAMACPP_REPACK", "0")   # no repacked (AMX) weights: SIGILL here

    with pytest.raises(ValueError, match="batch_invariant=False"):
        llamacpp.LlamaCppModel.load("no-such-file.gguf", batch_invariant=True, flash_attn=True)
    fa = load_model("smollm2-135m", backend="llamacpp", flash_attn=True)
    assert fa.batch_invariant is False
    ids = _context(smol, 40)
    smol.reset()
    fa.reset()
    plain, flash = smol.sync(ids, keep=8), fa.sync(ids, keep=8)
    assert torch.isfinite(flash).all() and not torch.equal(plain, flash)


def test_stepwise_scoring_returns_each_row_from_a_forward_of_its_own(smol, monkeypatch):
    """`stepwise` (an audit reference computing as llama-server decodes): the rows a forward
    returns equal single-token steps bit for bit, on kernels where one batch does not
    (flash attention); the rows before the first returned one still go in one batch."""
    from verispec.api import load_model

    monkeypatch.setenv("VERISPEC_LLAMACPP_REPACK", "0")   # no repacked (AMX) weights: SIGILL here
    fa = load_model("smollm2-135m", backend="llamacpp", flash_attn=True)
    ids = _context(smol, 80)
    steps = []
    fa.reset()
    for i in range(50, 81):
        steps.append(fa.sync(ids[:i], keep=1)[-1])
    steps = torch.stack(steps)
    fa.reset()
    batch = fa.sync(ids[:80], keep=31)
    fa.reset()
    fa.stepwise = True
    forwards = fa.forwards
    stepwise = fa.sync(ids[:80], keep=31)
    assert fa.forwards == forwards + 1 and torch.equal(stepwise, steps)
    assert not torch.equal(batch, steps)     # the test has teeth: one 80-row batch differs here
