"""SeededRandomness.categorical never emits a token of probability 0.

Found by `verispec audit --endpoint` against `verispec serve` (benchmarks/audit/
endpoint-verispec-serve-p1-before-fix.txt): at top-k 10 over Qwen2.5's 151 936-token
vocabulary, ~2 % of samples began with a random token outside the top 10, because a float32
exponential E_i = 0 made p_i / E_i = 0 / 0 = NaN, and argmax returns a NaN's index.
"""

import numpy as np
import torch

from verispec.sampling import SeededRandomness

V = 151_936


def _top10() -> torch.Tensor:
    p = torch.zeros(V)
    p[torch.arange(10) * 97 + 5] = torch.tensor([0.58, 0.16, 0.07, 0.07, 0.05, 0.04, 0.012, 0.006, 0.006, 0.006])
    return p / p.sum()


def test_the_seed_that_drew_an_exponential_of_zero_stays_in_the_support():
    e = SeededRandomness(180).generator(0, "sample").standard_exponential(V, dtype=np.float32)
    assert (e == 0).any()                       # the case itself (a NaN in the race before the fix)
    p = _top10()
    assert p[SeededRandomness(180).categorical(p, 0)] > 0


def test_no_seed_draws_outside_the_support():
    p = _top10()
    drawn = [SeededRandomness(s).categorical(p, 0) for s in range(300)]
    assert all(p[t] > 0 for t in drawn)


def test_the_far_tail_wins_with_its_own_probability_not_the_exponential_grid():
    """Found by the token-level endpoint audit (log-likelihood excess −0.15 nats/token on an
    exact `verispec serve`, replay identical): with float32 exponentials (a grid of ~5e-7
    near 0) a token of p = 1e-9 won with probability ~5e-7, so a 49k vocabulary whose tail
    holds 4.9e-5 of the mass drew from it in ~0.6 % of draws (26 of 4000 seeds here)."""
    v = 49_152
    p = torch.full((v,), 1e-9)
    p[0], p[1:11] = 0.9, (0.1 - (v - 11) * 1e-9) / 10
    n = 4000
    in_tail = sum(SeededRandomness(s).categorical(p, 3) >= 11 for s in range(n))
    # exact: Binomial(4000, 4.9e-5), mean 0.2; P(>= 4) < 1e-4
    assert in_tail <= 3, in_tail
