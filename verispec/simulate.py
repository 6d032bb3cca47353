"""A Monte-Carlo check of the closed forms in :mod:`verispec.theory` (tests only, not decoding):
rounds of k drafts with Bernoulli acceptance, whose mean tokens per round must match
E(α, k) (Leviathan et al. 2023, Eq. 1) and its per-position form."""

from __future__ import annotations

import numbers
from typing import Union

import numpy as np

from .checks import check_alphas, check_int, check_prob, is_scalar_alpha
from .theory import AlphaSpec

__all__ = ["simulate_rounds"]

def simulate_rounds(
    alpha: AlphaSpec,
    k: int,
    rounds: int,
    rng: Union[np.random.Generator, int, None] = None,
) -> float:
    """Monte-Carlo engine: mean tokens per round with Bernoulli acceptance.

    Each round proposes k drafts; draft j is accepted independently with probability
    α (or α_j for per-position rates), the round stops at the first rejection, and
    yields (accepted + 1) tokens (the bonus/correction token). Its expectation is
    E(α, k) (Leviathan et al. 2023, Eq. 1) or :func:`expected_tokens_positional`.
    For tests of the closed forms; not part of decoding.

    Args:
        alpha: scalar α in [0, 1] or per-position α_1..α_K with K >= k.
        k: draft length, integer >= 0.
        rounds: number of simulated rounds, integer >= 1.
        rng: a ``numpy.random.Generator`` (or a seed / None for ``default_rng``).

    Returns:
        Mean tokens per round (tokens per target forward).

    Raises:
        ValueError: naming ``alpha``/``alpha_or_alphas``, ``k``, ``rounds`` or ``rng``.
    """
    k = check_int(k, "k", 0)
    rounds = check_int(rounds, "rounds", 1)
    if is_scalar_alpha(alpha):
        probs = np.full(k, check_prob(alpha, "alpha"))
    else:
        alphas = check_alphas(alpha, "alpha")
        if k > len(alphas):
            raise ValueError(f"k={k} exceeds the number of per-position acceptance rates ({len(alphas)})")
        probs = np.asarray(alphas[:k], dtype=np.float64)
    if rng is None or (isinstance(rng, numbers.Integral) and not isinstance(rng, bool)):
        rng = np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, an int seed or None, got {rng!r}")
    if k == 0:
        return 1.0
    accepted = rng.random((rounds, k)) < probs  # (rounds, k) Bernoulli draws
    n_accepted = np.cumprod(accepted, axis=1).sum(axis=1)  # leading run of acceptances
    return float(n_accepted.mean() + 1.0)
