import pytest
import torch

from verispec.decoding import decode
from verispec.drafters.model import ModelDrafter
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, TorchRandomness

from conftest import tiny_llama

GREEDY = SamplingConfig()
PROMPT = [3, 17, 42, 5, 9]


def run(target, draft, k, n=200, sampling=GREEDY, seed=0, **kw):
    policy = FixedPolicy(ModelDrafter(draft) if draft is not None else None, k)
    return decode(target, PROMPT, policy, sampling=sampling, max_new_tokens=n,
                  rng=TorchRandomness(seed), **kw)


def test_greedy_speculative_equals_plain_for_k_1_to_8(tiny_pair):
    target, draft = tiny_pair
    plain = run(target, None, 0).tokens
    assert len(plain) == 200
    for k in range(1, 9):
        spec = run(target, draft, k)
        assert spec.tokens == plain, f"k={k}"
        assert 0 < spec.stats.accepted < spec.stats.drafted  # a real mix of accepts and rejects


def test_caches_hold_exactly_the_committed_sequence_after_every_round(tiny_pair):
    target, draft = tiny_pair
    drafter = ModelDrafter(draft)
    committed = list(PROMPT)
    checks = []

    def on_commit(block):
        committed.extend(block)
        # target holds everything but the pending last token; its KV cache agrees
        checks.append(target.tokens == committed[:-1] and target.cache_length() == len(committed) - 1)
        # draft holds a prefix of the committed sequence, and its KV cache agrees
        checks.append(draft.tokens == committed[:len(draft.tokens)]
                      and draft.cache_length() == len(draft.tokens))

    decode(target, PROMPT, FixedPolicy(drafter, 4), sampling=GREEDY, max_new_tokens=60,
           rng=TorchRandomness(0), on_commit=on_commit)
    assert checks and all(checks)


def test_round_sizes_all_rejected_adds_one_all_accepted_adds_k_plus_one(tiny_pair):
    target, draft = tiny_pair
    records = []
    run(target, draft, 4, n=120, observer=records.append)
    sizes = {(r.accepted, r.committed) for r in records if r.committed == r.accepted + 1}
    assert (0, 1) in sizes          # all rejected: one token (the residual draw)
    assert (4, 5) in sizes          # all accepted: k + 1 tokens (bonus)
    assert all(r.committed == r.accepted + 1 for r in records[:-1])


def test_self_draft_accepts_everything():
    target = tiny_llama(0)
    same = tiny_llama(0)
    result = run(target, same, 5, n=60)
    assert result.stats.accepted == result.stats.drafted
    assert result.stats.tau == pytest.approx(60 / result.stats.target_forwards)
    assert result.tokens == run(target, None, 0, n=60).tokens


def test_max_new_tokens_is_exact_mid_block(tiny_pair):
    target, draft = tiny_pair
    for n in (0, 1, 2, 3, 7):
        result = run(target, draft, 5, n=n)
        assert len(result.tokens) == n
        assert result.tokens == run(target, None, 0, n=n).tokens


def test_one_token_of_budget_left_needs_no_drafting(tiny_pair):
    target, draft = tiny_pair
    result = run(target, draft, 5, n=1)
    assert result.stats.drafted == 0 and result.stats.draft_forwards == 0


def test_eos_mid_block_ends_right_after_eos(tiny_pair):
    target, draft = tiny_pair
    plain = run(target, None, 0, n=80).tokens
    eos = plain[30]                      # make a token of the plain output the EOS
    first = plain.index(eos)
    target.eos_token_ids = frozenset({eos})
    for k in (1, 3, 6):
        result = run(target, draft, k, n=80)
        assert result.tokens == plain[: first + 1]
        assert result.stats.finish_reason == "eos"


def test_stop_callback_cuts_mid_block(tiny_pair):
    target, draft = tiny_pair
    plain = run(target, None, 0, n=80).tokens
    stop_at = 23
    result = run(target, draft, 6, n=80, stop=lambda out: len(out) > stop_at and out[stop_at] == plain[stop_at])
    assert result.tokens == plain[: stop_at + 1]
    assert result.stats.finish_reason == "stop_string"


def test_seed_reproducible_and_seed_sensitive(tiny_pair):
    target, draft = tiny_pair
    sampling = SamplingConfig(temperature=1.0)
    a = run(target, draft, 4, n=40, sampling=sampling, seed=123).tokens
    b = run(target, draft, 4, n=40, sampling=sampling, seed=123).tokens
    c = run(target, draft, 4, n=40, sampling=sampling, seed=124).tokens
    assert a == b and a != c


def test_no_global_rng_use(tiny_pair):
    target, draft = tiny_pair
    sampling = SamplingConfig(temperature=1.0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    run(target, draft, 4, n=20, sampling=sampling, seed=5)
    assert torch.equal(before, torch.get_rng_state())


def test_draft_vocab_prefix_is_zero_padded():
    target = tiny_llama(0, vocab=96)
    draft = tiny_llama(0, vocab=80)
    with torch.no_grad():  # the target's extra ids are padding, as in real checkpoints
        target.model.lm_head.weight[80:] = 0.0
        for name, param in draft.model.state_dict().items():  # draft = target's first 80 ids
            source = target.model.state_dict()[name]
            param.copy_(source[:80] if param.shape != source.shape else source)
        draft.model.model.layers[1].mlp.down_proj.weight.mul_(0.5)  # ...made imperfect
    plain = run(target, None, 0, n=80).tokens
    spec = run(target, draft, 4, n=80)
    assert spec.tokens == plain
    assert spec.stats.accepted > 0


class WideVerification(FixedPolicy):
    """Fixed k, but the verification forward is padded to k + 1 + extra tokens."""

    def __init__(self, drafter, k, extra):
        super().__init__(drafter, k)
        self.extra, self.widths = extra, []

    def verify_width(self, n):
        return n + self.extra

    def observe(self, record):
        self.widths.append(record.width)


@pytest.mark.parametrize("k,extra", [(1, 3), (2, 5), (4, 1)])
def test_padded_verification_keeps_greedy_output_and_caches_exact(tiny_pair, k, extra):
    # guards the filler rows: the first k + 1 rows must be used and the filler's
    # cache entries dropped; either mistake changes the output or the cache
    target, draft = tiny_pair
    plain = run(target, None, 0, n=80).tokens
    policy = WideVerification(ModelDrafter(draft), k, extra)
    committed, checks = list(PROMPT), []

    def on_commit(block):
        committed.extend(block)
        checks.append(target.tokens == committed[:-1] and target.cache_length() == len(committed) - 1)

    spec = decode(target, PROMPT, policy, sampling=GREEDY, max_new_tokens=80,
                  rng=TorchRandomness(0), on_commit=on_commit)
    assert spec.tokens == plain
    assert checks and all(checks)
    drafted = [w for w in policy.widths if w > 1]
    assert drafted and all(w == k + 1 + extra for w in drafted[:-1])
    assert 0 < spec.stats.accepted < spec.stats.drafted


def test_padding_never_passes_the_context_length():
    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    target.context_length = len(PROMPT) + 12
    policy = WideVerification(ModelDrafter(draft), 3, 50)
    res = decode(target, PROMPT, policy, sampling=GREEDY, max_new_tokens=40, rng=TorchRandomness(0))
    assert res.stats.finish_reason == "context"
    assert max(policy.widths) <= 12


def test_prompt_ids_outside_the_vocabulary_are_refused_by_name(tiny_pair):
    from verispec.api import SpeculativeDecoder

    target, draft = tiny_pair
    sd = SpeculativeDecoder(target, draft)
    for bad in ([10**9], [-1], [target.vocab_size]):
        with pytest.raises(ValueError, match="prompt holds token id .* vocabulary 0..95"):
            sd.generate(bad, max_new_tokens=2)
    for bad in (None, 123):
        with pytest.raises(ValueError, match="prompt must be text or a list of token ids"):
            sd.generate(bad, max_new_tokens=2)
    assert len(sd.generate(torch.tensor([3, 17, 42]), max_new_tokens=2).token_ids) == 2


def test_infinite_temperature_is_refused():
    with pytest.raises(ValueError, match="temperature must be finite"):
        SamplingConfig(temperature=float("inf"))
