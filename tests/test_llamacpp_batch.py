"""Several sequences in one llama.cpp forward: each sequence's logits are its solo logits, bit for bit.

The logit-gap test of `test_llamacpp_exactness.py` across sequences: every forward a
slot of `LlamaCppBatchModel` takes part in (other sequences' rows in the same decodes,
staggered joins, rollbacks, slots reused out of arrival order, a cancelled sequence) is
replayed, call for call, on a solo `LlamaCppModel`, and the logits must be equal exactly.
SmolLM2-135M (GGUF), batch-invariant mode.
"""


import pytest
import torch

from conftest import needs_llama_cpp, smol_batch_invariant

pytestmark = needs_llama_cpp

TEXT = ("Write a Python function that returns the sum of a list of numbers. "
        "Count from one to twenty in words, separated by commas. "
        "Repeat this list exactly twice: apple, banana, cherry, date, elderberry. ") * 20


@pytest.fixture(scope="module")
def solo():
    return smol_batch_invariant()


@pytest.fixture(scope="module")
def ids(solo):
    return solo.tokenizer.encode(TEXT)


@pytest.fixture(scope="module")
def batch():
    from verispec import registry
    from verispec.models.llamacpp_batch import LlamaCppBatchModel

    model = LlamaCppBatchModel.load(str(registry.gguf_path("smollm2-135m")), n_seq_max=4,
                                    n_ctx_per_seq=1024)
    assert model.batch_invariant
    yield model
    model.free()


class Replay:
    """Every cache operation of each view, to be replayed on the solo model."""

    def __init__(self, model):
        self.model = model
        self.ops = {}

    def open(self, slot=None):
        view = self.model.open(slot)
        self.ops[view] = []
        return view

    def forward_many(self, rows):
        out = self.model.forward_many(rows)
        for view, value in rows.items():
            tokens, keep = value if isinstance(value, tuple) else (value, None)
            self.ops[view].append(("forward", list(tokens), keep, out[view]))
        return out

    def truncate(self, view, length):
        view.truncate(length)
        self.ops[view].append(("truncate", length, None, None))

    def check(self, solo, view):
        """Replay view's history on `solo`; every forward's logits must be equal."""
        solo.reset()
        compared = 0
        for op, arg, keep, got in self.ops[view]:
            if op == "truncate":
                solo.truncate(arg)
                continue
            want = solo.forward(arg, keep=keep)
            gap = float((want - got).abs().max())
            assert torch.equal(want, got), f"slot {view.slot}: logits differ from solo by {gap}"
            compared += want.shape[0]
        assert solo.tokens == view.tokens
        return compared


def test_staggered_joins_and_rollbacks_equal_solo_forwards_bit_for_bit(batch, solo, ids):
    r = Replay(batch)
    a = r.open()
    r.forward_many({a: (ids[:37], 1)})                            # A alone: prefill
    r.forward_many({a: ids[37:42]})                               # A: 5-row verification
    b = r.open()
    r.forward_many({a: ids[42:46], b: (ids[100:353], 1)})         # B's prefill joins A's rows
    r.truncate(a, 44)                                             # A rejects two drafts
    r.forward_many({a: ids[44:47], b: ids[353:360]})              # 3 + 7 rows: two decodes
    c = r.open()
    r.forward_many({c: (ids[5:18], 1)})
    for step in range(3):                                         # all three, different k
        r.forward_many({a: ids[47 + 4 * step:51 + 4 * step], b: ids[360 + step:361 + step],
                        c: ids[18 + 6 * step:24 + 6 * step]})
        r.truncate(c, len(c.tokens) - step)                       # C rolls back 0, 1, 2
    assert len({len(v.tokens) for v in (a, b, c)}) == 3           # different lengths
    assert batch.decodes > 0
    for view in (a, b, c):
        assert r.check(solo, view) >= 10
    for view in (a, b, c):
        view.close()
    assert batch.free_slots == [0, 1, 2, 3]


def test_slot_reuse_out_of_arrival_order_and_cancellation(batch, solo, ids):
    """A middle slot freed and reused (the TensorRT-LLM #3456 class): no stale cache, no cross-talk."""
    r = Replay(batch)
    a, b, c = r.open(), r.open(), r.open()
    assert [a.slot, b.slot, c.slot] == [0, 1, 2]
    r.forward_many({a: (ids[:60], 1), b: (ids[200:290], 1), c: (ids[400:430], 1)})
    r.forward_many({a: ids[60:64], b: ids[290:296], c: ids[430:432]})
    b.close()                                                     # B cancelled mid-generation
    d = r.open()                                                  # takes B's slot, not slot 3
    assert d.slot == 1 and d.tokens == []
    r.forward_many({a: ids[64:67], c: ids[432:437], d: (ids[30:50], 1)})
    r.forward_many({d: ids[50:55], a: ids[67:68]})
    a.close()                                                     # the first arrival leaves first
    e = r.open(slot=3)
    r.forward_many({c: ids[437:440], d: ids[55:57], e: (ids[500:520], 1)})
    r.forward_many({e: ids[520:526], c: ids[440:441]})
    f = r.open()
    assert f.slot == 0                                            # A's old slot, after E
    r.forward_many({f: (ids[:60], 1), c: ids[441:443]})           # A's exact history again
    r.forward_many({f: ids[60:64]})
    for view in (c, d, e, f):
        assert r.check(solo, view) >= 5
    assert torch.equal(r.ops[f][-1][3], r.ops[a][1][3])           # same history, same logits
    for view in (c, d, e, f):
        view.close()


def test_a_view_is_a_causal_lm_and_bad_use_is_refused(batch, solo, ids):
    view = batch.open()
    try:
        got = view.sync(ids[:20], keep=1)
        solo.reset()
        assert torch.equal(got, solo.forward(ids[:20], keep=1))
        view.rollback_to(ids[:10] + [1, 2])
        assert view.tokens == ids[:10]
        with pytest.raises(ValueError, match="context length"):
            batch.forward_many({view: [1] * 2000})
        with pytest.raises(ValueError, match="at least one token"):
            batch.forward_many({view: []})
        with pytest.raises(ValueError, match="not free"):
            batch.open(slot=view.slot)
    finally:
        view.close()
    with pytest.raises(ValueError, match="not an open sequence"):
        batch.forward_many({view: [1]})
    views = [batch.open() for _ in range(batch.n_seq_max)]
    with pytest.raises(RuntimeError, match="slots are in use"):
        batch.open()
    for v in views:
        v.close()


def test_repacking_in_the_invariant_mode_only_where_the_switch_covers_it(monkeypatch):
    """`use_extra_buffers`: the batch-invariant mode loads repacked weights only on a build whose
    reference switch scores them row by row (patch level 2) and where no AMX or KleidiAI buffer
    would take the weights first; outside it always; VERISPEC_LLAMACPP_REPACK=0 keeps them off
    everywhere (llama-server's --no-repack), and a value other than 0/1 is an error naming it."""
    import llama_cpp

    from verispec.models import llamacpp
    from verispec.models.llamacpp import REPACK_ENV, use_extra_buffers

    monkeypatch.delenv(REPACK_ENV, raising=False)
    info = b"CPU : AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info)
    monkeypatch.setattr(llamacpp, "patch_level", lambda: 2)
    assert use_extra_buffers(False) and use_extra_buffers(True)
    monkeypatch.setattr(llamacpp, "patch_level", lambda: 1)      # the switch alone: gemm under it
    assert use_extra_buffers(False) and not use_extra_buffers(True)
    monkeypatch.setattr(llamacpp, "patch_level", lambda: 2)
    for flag in (b"AMX_INT8 = 1 | ", b"KLEIDIAI = 1 | "):
        monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda flag=flag: info + flag)
        assert use_extra_buffers(False) and not use_extra_buffers(True)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info.replace(b"REPACK = 1 | ", b""))
    assert not use_extra_buffers(True)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info)
    monkeypatch.setenv(REPACK_ENV, "0")
    assert not use_extra_buffers(False) and not use_extra_buffers(True)
    monkeypatch.setenv(REPACK_ENV, "off")
    with pytest.raises(ValueError, match=REPACK_ENV):
        use_extra_buffers(False)


@pytest.mark.parametrize("gguf", ["smol_q4_0_gguf", "smol_q4_k_m_gguf"])
@pytest.mark.parametrize("prefill", ["repacked", "plain"])
def test_repacked_weights_keep_every_sequence_its_solo_logits(request, gguf, ids, prefill, monkeypatch):
    """With llama.cpp's repacked weights (Q4_0 and Q4_K_M models; the batch-invariant mode keeps
    them where its switch scores them row by row, Q4_K rows through the multi-row kernel) two
    sequences' rows in shared decodes, 1 + 1 rows and
    1 + 4 rows (4 rows of one decode would go through repack's 4-row gemm), replay bit for bit
    on a solo model of the same layout; with prompts prefilled on the plain layout (a prefill
    twin in both, `llamacpp_prefill`) too, also when a sequence rolls back into its prompt,
    decodes and prefills again (the twin must take the decoded cells from the main context)."""
    from verispec.models import llamacpp
    from verispec.models.llamacpp_batch import LlamaCppBatchModel

    path = request.getfixturevalue(gguf)
    monkeypatch.setenv("VERISPEC_LLAMACPP_PREFILL", prefill)
    batch = LlamaCppBatchModel.load(str(path), n_seq_max=2, n_ctx_per_seq=1024)
    solo = llamacpp.LlamaCppModel.load(str(path), n_ctx=1024, batch_invariant=True)
    try:
        assert batch.extra_buffers and solo.extra_buffers
        assert (batch._twin is not None) == (solo._twin is not None) == (prefill == "plain")
        r = Replay(batch)
        a, b = r.open(), r.open()
        r.forward_many({a: (ids[:90], 1)})
        r.forward_many({b: (ids[200:330], 1)})
        n = 90
        for step in range(6):
            width = 4 if step % 2 else 1
            r.forward_many({a: ids[n:n + width], b: [ids[330 + step]]})
            n += 1
            r.truncate(a, n)                 # a keeps one token of its block per round
        r.forward_many({a: ids[n:n + 4], b: ids[336:340]})   # 8 rows in one decode
        r.truncate(b, 100)                                    # b back into its prompt
        r.forward_many({b: [ids[400]]})
        r.forward_many({b: (ids[500:560], 1), a: [ids[n + 4]]})   # b prefills again beside a's step
        for view in (a, b):
            r.check(solo, view)
    finally:
        batch.free()


def test_rows_are_grouped_by_block_width(batch, solo, ids):
    """Sequences with equal blocks share one decode; a wider block runs in a decode of its own
    (llama.cpp would cut a mixed decode into ubatches of equal rows per sequence: [A1+B1+C1]
    then [A3], dearer than [B1+C1] then [A4]); the logits stay the solo ones."""
    r = Replay(batch)
    a, b, c = r.open(), r.open(), r.open()
    r.forward_many({a: (ids[:30], 1), b: (ids[100:140], 1), c: (ids[200:220], 1)})
    before = batch.decodes
    r.forward_many({a: ids[30:34], b: ids[140:141], c: ids[220:221]})        # widths 4, 1, 1
    assert batch.decodes - before == 2
    before = batch.decodes
    r.forward_many({a: ids[34:36], b: ids[141:143], c: ids[221:223]})        # one width
    assert batch.decodes - before == 1
    for view in (a, b, c):
        assert r.check(solo, view) >= 3
        view.close()
