"""Spec-on vs spec-off: a two-sample comparison with the completion as the unit.

When the reference endpoint is the same server with speculation off, the question is
"does speculation change the law?", and the local model is only a *scoring function*.
A scorer that is not the server's true law makes the tokens of one completion
dependent (a mis-scored prefix shifts every later token's score), so tokens cannot be
pooled as independent. The completion is the unit instead: each completion is reduced
to summaries of its token statistics (`SUMMARIES`), and the two arms are compared
within each prompt.

Test: a stratified permutation test (Fisher 1935; Good 2005, "Permutation, Parametric
and Bootstrap Tests of Hypotheses", §3.5 for strata). Under H0 (same law on both arms,
each completion an independent draw given its prompt: the arms use disjoint seeds), the
arm labels are exchangeable within a prompt. Each summary's statistic is
Σ_j w_j (mean_on,j − mean_off,j) with w_j ∝ n_on,j n_off,j / (n_on,j + n_off,j); the
omnibus statistic is the largest |standardised| one over the summaries (Westfall &
Young 1993, max-T), so one p-value covers all of them. Valid whatever the scorer (exact
level up to Monte Carlo error), more powerful the closer the scorer is to the server.

The effect that carries the tolerance is the difference of the top-1 excess rate (per
token, averaged per completion), with a normal interval from the permutation
distribution's spread (its standard error under exchangeability).

**Paired** (`paired_effects`, ``--paired``): both arms request the *same* seeds, and
completion i of the spec-on arm is compared with completion i of the spec-off arm.
For any fixed summary f, D_i = f(on_i) − f(off_i) has mean E f(on) − E f(off), which
is 0 under H0 (the same law on both arms) *whatever the coupling between the two
arms that the shared seed creates* (linearity of expectation): the pairing is valid
for a server whose sampler ignores seeds, mixes them differently under speculation, or
couples them perfectly. Pairs of different seeds are independent, so the mean of D_i
has a normal interval by the central limit theorem, with the sample variance of D
(Student's t, n − 1 degrees of freedom). The gain is variance: a server whose seeded
draw is unchanged by speculation gives D_i = 0 for most pairs (llama-server with and
without a draft agreed seed by seed on 671 of 700 samples), so far fewer tokens reach
a verdict. An empty completion's summaries are 0 (a fixed function of the completion,
so E D = 0 still holds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .scoring import TokenScores
from .tokenstats import Effect, _z

__all__ = ["SUMMARIES", "completion_summaries", "paired_effects", "two_sample_effects"]

#: per-completion summaries: name -> function of a `TokenScores`
SUMMARIES = {
    "top-1 excess": lambda s: float(np.mean(s.top1 - s.pmax)),
    "log-likelihood excess": lambda s: float(np.mean(np.where(s.outside, 0.0, s.llx))),
    "PIT mean": lambda s: float(np.mean(s.pit)),
    "PIT spread": lambda s: float(np.mean(np.abs(s.pit - 0.5))),
}


def completion_summaries(scores: Sequence[TokenScores]) -> np.ndarray:
    """[n, len(SUMMARIES)] float64, one row per completion."""
    return np.array([[f(s) for f in SUMMARIES.values()] for s in scores], dtype=float).reshape(-1, len(SUMMARIES))


def _stat(x: np.ndarray, on: np.ndarray, strata: list[np.ndarray]) -> np.ndarray:
    """[R, S] weighted stratified mean differences for label matrix on [R, n] (bool)."""
    total = np.zeros((on.shape[0], x.shape[1]))
    wsum = 0.0
    for idx in strata:
        lab = on[:, idx]
        n1 = lab.sum(1, keepdims=True).astype(float)
        n0 = len(idx) - n1
        if n1.min() == 0 or n0.min() == 0:
            continue
        w = float((n1 * n0 / len(idx))[0, 0])
        xs = x[idx]
        m1 = lab.astype(float) @ xs / n1
        m0 = (~lab).astype(float) @ xs / n0
        total += w * (m1 - m0)
        wsum += w
    return total / wsum if wsum else total


def two_sample_effects(on: Sequence[TokenScores], off: Sequence[TokenScores], level: float, *,
                       permutations: int = 2000, seed: int = 0) -> list[Effect]:
    """The spec-on vs spec-off comparison (module doc).

    Args:
        on, off: the scored completions of the audited and the reference endpoint
            (``prompt_index`` says the stratum).
        level: the per-statistic level after the verdict's correction.
        permutations: Monte Carlo permutations (within prompts).

    Returns:
        [the top-1 excess difference (role "tolerance"), the permutation omnibus (max-T
        over `SUMMARIES`; its name lists each summary's spec-on − spec-off difference)].

    Raises:
        ValueError: when an arm is empty.
    """
    if not on or not off:
        raise ValueError("two_sample_effects needs completions on both arms")
    x = np.vstack([completion_summaries(on), completion_summaries(off)])
    labels = np.array([True] * len(on) + [False] * len(off))
    prompts = np.array([s.prompt_index for s in on] + [s.prompt_index for s in off])
    strata = [np.flatnonzero(prompts == p) for p in np.unique(prompts)]
    rng = np.random.default_rng(seed)
    perm = np.tile(labels, (permutations, 1))
    for idx in strata:
        sub = perm[:, idx]
        perm[:, idx] = rng.permuted(sub, axis=1)
    observed = _stat(x, labels[None], strata)[0]
    null = _stat(x, perm, strata)
    sd = null.std(0)
    sd = np.where(sd > 0, sd, np.inf)
    t_obs = np.abs(observed / sd)
    t_null = np.abs(null / sd).max(1)
    p_omni = float((1 + (t_null >= t_obs.max() - 1e-12).sum()) / (permutations + 1))
    z = _z(level)
    from scipy.stats import norm
    se = float(sd[0]) if np.isfinite(sd[0]) else 0.0
    n = len(on) + len(off)
    top = Effect("Δ top-1 excess (spec-on − spec-off)", "probability", float(observed[0]),
                 (float(observed[0] - z * se), float(observed[0] + z * se)),
                 float((1 + (np.abs(null[:, 0]) >= abs(observed[0]) - 1e-12).sum()) / (permutations + 1)),
                 n, se, level, (z + float(norm.isf(0.2))) * se if se else None, role="tolerance")
    names = ", ".join(f"{k} {v:+.3g}" for k, v in zip(SUMMARIES, observed))
    omni = Effect(f"permutation omnibus ({names})", "max |t|", float(t_obs.max()), (0.0, float(t_obs.max())),
                  p_omni, n, 0.0, level, None)
    return [top, omni]


def _paired_rows(scores: Sequence[TokenScores], keys: list[tuple[int, int]]) -> np.ndarray:
    """[len(keys), len(SUMMARIES)]: summaries of the completion (prompt_index, index), 0 if absent."""
    by_key = {(s.prompt_index, s.index): s for s in scores}
    rows = np.zeros((len(keys), len(SUMMARIES)))
    for r, key in enumerate(keys):
        if key in by_key:
            rows[r] = completion_summaries([by_key[key]])[0]
    return rows


def paired_effects(on: Sequence[TokenScores], off: Sequence[TokenScores], level: float,
                   keys: Sequence[tuple[int, int]]) -> list[Effect]:
    """The spec-on vs spec-off comparison with shared seeds (module doc, "Paired").

    Args:
        on, off: scored completions of the audited and the reference endpoint, drawn
            with the same seed for the same (prompt_index, index).
        level: the per-statistic level after the verdict's correction.
        keys: every (prompt_index, index) requested, empty completions included (they
            count with summaries 0).

    Returns:
        [the mean paired difference of the top-1 excess (role "tolerance"; t interval),
        the omnibus: the largest |t| over `SUMMARIES`, Bonferroni over them].

    Raises:
        ValueError: fewer than 2 pairs.
    """
    from scipy.stats import t as student

    keys = list(keys)
    if len(keys) < 2:
        raise ValueError(f"paired_effects needs at least 2 pairs, got {len(keys)}")
    d = _paired_rows(on, keys) - _paired_rows(off, keys)
    n = len(keys)
    mean = d.mean(0)
    se = d.std(0, ddof=1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_obs = np.where(se > 0, np.abs(mean) / se, np.where(mean == 0, 0.0, np.inf))
    p_each = 2 * student.sf(t_obs, n - 1)
    q = float(student.isf(level / 2, n - 1))
    power = q + float(student.isf(0.2, n - 1))
    top = Effect("Δ top-1 excess (spec-on − spec-off, paired)", "probability", float(mean[0]),
                 (float(mean[0] - q * se[0]), float(mean[0] + q * se[0])), float(p_each[0]), n, float(se[0]),
                 level, power * float(se[0]) if se[0] > 0 else None, role="tolerance", df=n - 1)
    names = ", ".join(f"{k} {v:+.3g}" for k, v in zip(SUMMARIES, mean))
    omni = Effect(f"paired omnibus ({names})", "max |t|", float(t_obs.max()), (0.0, float(t_obs.max())),
                  float(min(1.0, p_each.min() * len(SUMMARIES))), n, 0.0, level, None)
    return [top, omni]
