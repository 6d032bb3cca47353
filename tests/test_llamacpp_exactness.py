"""llama.cpp's batch-invariant mode: a verification forward is plain decoding, bit for bit.

By default llama.cpp's CPU backend scores a batch of k+1 tokens with other kernels
than one token (AMX / repacked weights, the tiled K-quant matmul, llamafile's
sgemm, split-KV flash attention from 512 KV cells), and logits differ by up to ~0.9
(docs/exactness.md). In the
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


# 253 + 8 crosses the KV-cache padding of 256 cells; 600 puts a single token's attention over
# >= 512 cells, where flash attention splits the KV across threads unless on the reference kernels;
# 16 rows reach the tiled K-quant matmul (from 8) in one decode where the reference switch exists
@pytest.mark.parametrize("context_len", [40, 253, 600])
@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9, 16])
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
        assert spec.stats.drafted >= 4 * (len(plain.token_ids) // 5)   # every round drafted k = 4
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
    """A stock llama.cpp with llamafile's sgemm compiled in cannot be batch-invariant: a clear
    error, before loading; with the reference switch it can (sgemm is then off per decode)."""
    import llama_cpp

    from verispec.models import llamacpp

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | LLAMAFILE = 1 |")
    if llamacpp.reference_switch() is not None:
        assert llamacpp.batch_invariance_blocker() is None
    monkeypatch.setattr(llamacpp, "reference_switch", lambda: None)     # a stock build
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


def test_flash_attention_reaches_llama_cpp_and_refuses_the_batch_invariant_mode(monkeypatch):
    """`flash_attn=True` (llama-server's default kernels, for an audit's reference) turns the
    batch-invariant mode off, is refused with it on a stock llama.cpp (no reference switch),
    and really changes the attention kernel."""
    from verispec.api import load_model
    from verispec.models import llamacpp

    monkeypatch.setenv("VERISPEC_LLAMACPP_REPACK", "0")   # no repacked (AMX) weights: SIGILL here

    with monkeypatch.context() as stock:
        stock.setattr(llamacpp, "reference_switch", lambda: None)
        with pytest.raises(ValueError, match="batch_invariant=False"):
            llamacpp.LlamaCppModel.load("no-such-file.gguf", batch_invariant=True, flash_attn=True)
    fa = load_model("smollm2-135m", backend="llamacpp", flash_attn=True)
    off = load_model("smollm2-135m", backend="llamacpp", flash_attn=False, batch_invariant=False)
    assert fa.batch_invariant is False
    ids = _context(fa, 40)
    plain, flash = off.sync(ids, keep=8), fa.sync(ids, keep=8)
    assert torch.isfinite(flash).all() and not torch.equal(plain, flash)


def test_reference_switch_makes_long_context_rows_exact_and_leaves_prefill_fast(smol, monkeypatch):
    """With the reference switch (tools/install_llama_cpp.py) the batch-invariant mode runs flash
    attention and llamafile's sgemm, and stays exact only because every decode but a prefill
    runs on llama.cpp's reference kernels: with the switch held off, a 5-row forward after
    600 tokens leaves single-token steps (split-KV attention for one query, sgemm for 5);
    and a prefill does run on the fast kernels (its last row differs from the same row
    scored on the reference kernels)."""
    from verispec.models import llamacpp

    if llamacpp.reference_switch() is None:
        pytest.skip("a stock llama.cpp without the reference switch (make setup builds it in)")
    import llama_cpp

    assert smol.batch_invariant
    assert smol.llama.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ids = _context(smol, 605)

    def rows(model):
        model.reset()
        model.forward(ids[:600], keep=1)
        single = torch.cat([model.forward([t]) for t in ids[600:]])
        model.reset()
        model.forward(ids[:600], keep=1)
        return single, model.forward(ids[600:])

    single, batch = rows(smol)
    assert torch.equal(single, batch)
    switch = smol._use_reference
    with monkeypatch.context() as held_off:
        held_off.setattr(smol, "_use_reference", lambda on: switch(False))
        single_off, batch_off = rows(smol)
    assert not torch.equal(single_off, batch_off)
    smol.reset()
    prefilled = smol.forward(ids[:600], keep=1)
    smol.reset()
    referenced = smol.forward(ids[:600], keep=2)[-1:]
    smol.reset()
    assert not torch.equal(prefilled, referenced)


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


def _spy(forward, returned: list):
    def spy(tokens, keep=None):
        out = forward(tokens, keep)
        returned.append(out)
        return out
    return spy


def test_token_audit_reference_computes_the_generation_logits_bit_for_bit(smol, monkeypatch):
    """`score_completion` (via `decoded_logits`) prefills the prompt but its last token as
    `decode` does, then scores the rest in one forward: on a batch-invariant llama.cpp that is
    exactly the logits plain decoding computed (prefill, then one step per token), also after a
    rollback to a shorter prefix (the per-position references). Scoring prompt and completion in one
    forward instead computes the prompt on the decode kernels, not the prefill's (an 80-token
    prompt reaches tiled flash attention), and the logits move."""
    from verispec.audit.scoring import score_completion
    from verispec.decoding import decoded_logits
    from verispec.sampling import SamplingConfig

    ids = _context(smol, 100)
    prompt, completion = ids[:80], ids[80:100]
    smol.reset()
    smol.forward(prompt[:-1], keep=1)
    steps = torch.cat([smol.forward([t]) for t in [prompt[-1]] + completion[:-1]])
    returned = []
    monkeypatch.setattr(smol, "forward", _spy(smol.forward, returned))
    score_completion(smol, prompt, completion, SamplingConfig(temperature=1.0))
    assert torch.equal(returned[-1], steps)
    monkeypatch.undo()
    # the per-position references (exact, reference, replay) use the same helper, also after
    # a rollback to a shorter prefix
    smol.reset()
    assert torch.equal(decoded_logits(smol, prompt, completion[:5]), steps[:6])
    assert torch.equal(decoded_logits(smol, prompt, completion[:3])[-1], steps[3])
    assert torch.equal(decoded_logits(smol, prompt, completion[:9])[-1], steps[9])
    smol.reset()
    assert not torch.equal(smol.sync(prompt + completion[:-1], keep=20), steps)   # the test has teeth
    smol.reset()


def _repacked_and_plain(gguf):
    """`gguf` loaded twice in the batch-invariant mode: with llama.cpp's repacked weights and,
    for comparison, without."""
    from verispec.models import llamacpp

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv(llamacpp.REPACK_ENV, "0")
        plain = llamacpp.LlamaCppModel.load(str(gguf), n_ctx=2048, batch_invariant=True)
        mp.setenv(llamacpp.REPACK_ENV, "1")
        repacked = llamacpp.LlamaCppModel.load(str(gguf), n_ctx=2048, batch_invariant=True)
    finally:
        mp.undo()
    assert repacked.extra_buffers and not plain.extra_buffers
    return repacked, plain


@pytest.fixture(scope="module")
def smol_q4_0(smol_q4_0_gguf):
    """The Q4_0 SmolLM2 (`smol_q4_0_gguf`), repacked and plain (`_repacked_and_plain`; the
    SmolLM2 GGUF of the other tests is Q4_1, which llama.cpp does not repack)."""
    return _repacked_and_plain(smol_q4_0_gguf)


@pytest.fixture(scope="module")
def smol_q4_k_m(smol_q4_k_m_gguf):
    """The Q4_K_M SmolLM2 (`smol_q4_k_m_gguf`), repacked and plain."""
    return _repacked_and_plain(smol_q4_k_m_gguf)


@pytest.mark.parametrize("quant", ["smol_q4_0", "smol_q4_k_m"])
@pytest.mark.parametrize("context_len", [40, 600])
def test_repacked_weights_score_a_batch_as_single_tokens(request, quant, smol, context_len):
    """With the weights in llama.cpp's repacked layout (its default on AVX2 and Arm, 1.2-1.45x
    faster decode on a 2-core AMD EPYC), the batch-invariant mode stays bit-exact: forwards of
    2..17 rows (4-row groups would go through repack's gemm, another accumulation order than
    a single token's gemv; Q4_K rows go through the multi-row kernel, one unpack of each
    weight block for all rows, in tiles of 16) equal single-token steps. The repacked layout
    really is in use: its single steps differ from the same model's without repacking. (On a
    build whose switch does not reach repack.cpp the load itself fails: its 8-row probe goes
    through the gemm.)"""
    repacked, plain = request.getfixturevalue(quant)
    ids = _context(smol, context_len + 17)
    prefix, new = ids[:context_len], ids[context_len:]
    steps = {}
    for name, model in (("repacked", repacked), ("plain", plain)):
        model.reset()
        model.forward(prefix, keep=1)
        steps[name] = torch.cat([model.forward([t]) for t in new])
        for rows in (2, 3, 4, 5, 8, 9, 16, 17):
            model.truncate(context_len)
            batch = model.forward(new[:rows])
            assert torch.equal(batch, steps[name][:rows]), (name, rows, float((batch - steps[name][:rows]).abs().max()))
        model.reset()
    assert not torch.equal(steps["repacked"], steps["plain"])     # the repacked kernels ran


@pytest.fixture(scope="module")
def smol_q4_0_twin(smol_q4_0_gguf):
    """The Q4_0 SmolLM2 with repacked weights and a prefill twin (VERISPEC_LLAMACPP_PREFILL=plain:
    prompts on the plain layout, decoding on the repacked one), and the same file in the plain
    layout alone (no twin: one layout, nothing to choose)."""
    from verispec.models import llamacpp

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("VERISPEC_LLAMACPP_PREFILL", "plain")
        twinned = llamacpp.LlamaCppModel.load(str(smol_q4_0_gguf), n_ctx=2048, batch_invariant=True)
        mp.setenv(llamacpp.REPACK_ENV, "0")
        plain = llamacpp.LlamaCppModel.load(str(smol_q4_0_gguf), n_ctx=2048, batch_invariant=True)
    finally:
        mp.undo()
    assert twinned._twin is not None and plain._twin is None
    return twinned, plain


def test_prefill_twin_prefills_on_the_plain_layout_and_decodes_on_the_repacked_one(
        smol_q4_0_twin, smol_q4_0, smol):
    """A prompt prefilled through the twin gives the plain layout's prefill logits bit for bit
    (not the repacked layout's: the twin really ran it); the decode rows after it run on the
    repacked weights (they differ from the plain layout's) and stay batch-invariant."""
    twinned, plain = smol_q4_0_twin
    repacked, _ = smol_q4_0
    ids = _context(smol, 330)
    prompt, new = ids[:300], ids[300:310]
    got = {}
    for name, model in (("twin", twinned), ("plain", plain), ("repacked", repacked)):
        model.reset()
        got[name] = model.forward(prompt, keep=1)
    assert torch.equal(got["twin"], got["plain"]) and not torch.equal(got["twin"], got["repacked"])
    steps = {}
    for name, model in (("twin", twinned), ("plain", plain)):
        steps[name] = torch.cat([model.forward([t]) for t in new])
    assert not torch.equal(steps["twin"], steps["plain"])        # decoding on the repacked weights
    twinned.truncate(300)
    assert torch.equal(twinned.forward(new), steps["twin"])      # a verification forward = single steps
    for model in (twinned, plain, repacked):
        model.reset()



def test_prefill_twin_without_the_batch_invariant_mode(smol_q4_0_gguf, smol, monkeypatch):
    """Without the mode (repacked weights on llama.cpp's default kernels) a twin prefills too:
    the prompt's logits are the plain layout's bit for bit, the steps after it decode on the
    repacked weights, and a batch model's slot, twinned the same way, gives a solo model's
    prefill and single steps bit for bit (the same cells copied, the same one-row decodes)."""
    from verispec.models import llamacpp
    from verispec.models.llamacpp_batch import LlamaCppBatchModel

    monkeypatch.setenv("VERISPEC_LLAMACPP_PREFILL", "plain")
    solo = llamacpp.LlamaCppModel.load(str(smol_q4_0_gguf), n_ctx=1024, batch_invariant=False)
    batch = LlamaCppBatchModel.load(str(smol_q4_0_gguf), n_seq_max=2, n_ctx_per_seq=1024, batch_invariant=False)
    monkeypatch.setenv(llamacpp.REPACK_ENV, "0")         # the plain layout alone, same kernels (no mode)
    plain = llamacpp.LlamaCppModel.load(str(smol_q4_0_gguf), n_ctx=1024, batch_invariant=False)
    try:
        assert solo._twin is not None and batch._twin is not None and solo.extra_buffers
        assert plain._twin is None and not plain.extra_buffers
        ids = _context(smol, 330)
        prompt, new = ids[:300], ids[300:306]
        plain.reset()
        expected = plain.forward(prompt, keep=1)
        got = solo.forward(prompt, keep=1)
        assert torch.equal(got, expected)                   # the twin ran the prompt
        steps = torch.cat([solo.forward([t]) for t in new])
        plain_steps = torch.cat([plain.forward([t]) for t in new])
        assert not torch.equal(steps, plain_steps)          # decoding on the repacked weights
        view = batch.open(1)
        try:
            assert torch.equal(view.forward(prompt, keep=1), got)
            assert torch.equal(torch.cat([view.forward([t]) for t in new]), steps)
        finally:
            view.close()
    finally:
        batch.free()

def test_prefill_twin_never_uses_cells_the_main_context_rolled_back(smol_q4_0_twin, smol, monkeypatch):
    """The twin reuses the cells it mirrors only while the main context still holds them:
    after a prefill, a rollback into the prompt, decode steps and a second prefill, every
    logit equals the same script with the twin made to copy the whole sequence before each
    prefill (no reuse). A twin that kept its own cells for the rolled-back positions would
    attend over the first prefill's tokens there instead of the decoded ones."""
    twinned, _ = smol_q4_0_twin
    ids = _context(smol, 400)
    a, b = ids[:200], ids[200:260]

    def script():
        twinned.reset()
        out = [twinned.forward(a, keep=1), twinned.forward(b, keep=1)]   # two prefills: twin mirrors 260
        twinned.truncate(230)                                          # into the second prompt
        out += [twinned.forward([t]) for t in ids[300:304]]            # decoded on the main context
        out.append(twinned.forward(ids[320:380], keep=1))             # a third prefill after them
        twinned.reset()
        return out

    reused = script()
    twin = twinned._twin
    prefill = twin.prefill
    monkeypatch.setattr(twin, "prefill", lambda main, seq, *a: (twin.mirrored.pop(seq, None), prefill(main, seq, *a))[1])
    copied = script()
    assert all(torch.equal(x, y) for x, y in zip(reused, copied))
    assert twin.seconds > 0


def test_prefill_layout_key_tells_apart_cpus_of_one_name(tmp_path, monkeypatch):
    """A layout decision measured on an AVX-512 "AMD EPYC" is not reused on an AVX2 one (the
    plain layout prefilled 1.5x faster on the first and no faster on the second): the key
    holds the SIMD level as well as the CPU's name."""
    from verispec.models import llamacpp_prefill as lp

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\0" * 16)
    monkeypatch.setattr(lp, "cpu_name", lambda: "AMD EPYC")
    keys = []
    for level in ("avx2", "avx512", "avx2"):
        monkeypatch.setattr(lp, "cpu_vector", lambda level=level: level)
        keys.append(lp.layout_key(str(gguf), 2, 3))
    assert keys[0] != keys[1] and keys[0] == keys[2]
    assert "avx512" in keys[1]


def test_prefill_layout_choice_is_measured_once_and_kept(tmp_path, monkeypatch):
    """`choose_layout` keeps the twin only when it saved >= 10 % of the main prefill, stores the
    decision under its key, and later answers from the store without measuring; a bad
    VERISPEC_LLAMACPP_PREFILL is an error naming it."""
    from verispec.models import llamacpp_prefill as lp

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    calls = []
    clock = iter(range(100))
    monkeypatch.setattr(lp.time, "perf_counter", lambda: next(clock) * 1.0)

    def run(name, seconds):
        def go():
            calls.append(name)
            for _ in range(seconds - 1):
                next(clock)
        return go

    decision = lp.choose_layout("k1", run("main", 10), run("twin", 5))
    assert decision["twin"] and decision["main_seconds"] == 10 and decision["twin_seconds"] == 5
    assert calls == ["main", "twin", "main", "twin"]
    assert lp.choose_layout("k1", run("main", 1), run("twin", 50)) == decision    # from the store
    assert len(calls) == 4
    assert not lp.choose_layout("k2", run("main", 10), run("twin", 10))["twin"]   # < 10 % saved
    monkeypatch.setenv(lp.PREFILL_ENV, "fast")
    with pytest.raises(ValueError, match=lp.PREFILL_ENV):
        lp.prefill_choice()
