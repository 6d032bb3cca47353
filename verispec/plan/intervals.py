"""Prediction intervals for S(k) and k*, and the verdict in words.

Two things are uncertain in a plan: the cost model (how far the fitted stack's T_t(n)
and T_d miss on a machine it was not fitted on) and, when α was measured, α itself.
Both are drawn, and the speedup follows each draw through the one formula of
:mod:`verispec.theory`:

    S_j(k) = E_j(k) / (k · c_j + r_j(k + 1))          r(n) = T_t(n) / T_t(1), c = T_d / T_t(1)

* r_j(n) = max(1, r(n) · exp(σ_r · z_j)) for n >= 2, one z_j per draw for all n (the
  kernel rate that a stack gets wrong is wrong for every n alike); σ_r is the stack's
  fitted scatter of log T(n)/T(1) (``Stack.sigma_log_ratio``);
* c_j = c · exp(σ_t · z'_j), σ_t the scatter of log T(1) (``Stack.sigma_log_time``);
* E_j(k) = Σ_{i=0..k} Π_{m<=i} α_{m,j} with α drawn from its posterior when it was
  measured (:meth:`verispec.plan.server_alpha.ServerAcceptance.draw`), else fixed.

The interval at ``level`` is the central quantile range of S_j(k); k* has one too (the
quantiles of argmax_k S_j(k)). The verdict is about speculating at the best k >= 1:
"likely a gain" when the interval's lower end is above 1, "likely a loss" when its upper
end is below 1, else "uncertain". ``benchmarks/plan/consumer.md`` reports how often
published measurements fall inside the 80 % interval, which is how σ is checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

__all__ = ["PlanInterval", "ratio_interval", "speedup_interval", "verdict"]


@dataclass(frozen=True)
class PlanInterval:
    """Intervals of a plan at one level.

    Attributes:
        level: e.g. 0.8 for the central 80 %.
        low, high: S(k) bounds for k = 0..k_max (1, 1 at k = 0).
        k_star_low, k_star_high: bounds of the best draft length.
        best_k: the k >= 1 with the highest point speedup (what the verdict is about).
        gain_probability: share of draws with S(best_k) > 1.
        verdict: "likely a gain", "likely a loss" or "uncertain".
        draws: draws used.
        sources: what was drawn (sigmas, α).
    """

    level: float
    low: list[float]
    high: list[float]
    k_star_low: int
    k_star_high: int
    best_k: int
    gain_probability: float
    verdict: str
    draws: int
    sources: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(low: float, high: float) -> str:
    """"likely a gain" if low > 1, "likely a loss" if high < 1, else "uncertain"."""
    if low > 1.0:
        return "likely a gain"
    if high < 1.0:
        return "likely a loss"
    return "uncertain"


def ratio_interval(ratio: float, sigma: float, level: float = 0.8) -> tuple[float, float]:
    """Interval of a predicted T(n)/T(1) given the stack's log scatter σ (log-normal)."""
    z = float(norm.ppf(0.5 + level / 2.0))
    return max(1.0, ratio * float(np.exp(-z * sigma))), ratio * float(np.exp(z * sigma))


def _expected(alphas: np.ndarray) -> np.ndarray:
    """E for k = 0..K from α draws of shape (draws, K): 1 + cumulative sums of Π α."""
    prods = np.cumprod(alphas, axis=1)
    return np.concatenate([np.ones((alphas.shape[0], 1)), 1.0 + np.cumsum(prods, axis=1)], axis=1)


def speedup_interval(ratios: list[float], c: float, k_max: int, *, alpha: float | None = None,
                     alphas: list[float] | None = None, alpha_draws: np.ndarray | None = None,
                     tau: float | None = None, tau_k: int | None = None, sigma_ratio: float = 0.0,
                     sigma_time: float = 0.0, level: float = 0.8, draws: int = 4000,
                     seed: int = 0) -> PlanInterval:
    """Monte-Carlo interval of S(k), k = 0..k_max, and of k* (see the module doc).

    Args:
        ratios: predicted T_t(n)/T_t(1) for n = 1..k_max+1 (dimensionless).
        c: predicted T_d / T_t(1) (0 for prompt lookup).
        k_max: largest draft length.
        alpha, alphas, alpha_draws: one of: i.i.d. α; per-position α_1..α_{k_max};
            draws of shape (draws, k_max).
        tau, tau_k: instead of α: the measured tokens per round at draft length tau_k
            (only S(tau_k) is then defined; the others are left at the point values).
        sigma_ratio, sigma_time: the stack's log scatters (>= 0).
        level: interval level in (0, 1).
        draws: Monte-Carlo draws; seed: numpy seed (results are reproducible).

    Returns:
        PlanInterval.

    Raises:
        ValueError: naming ``level`` or ``draws`` when out of range, or when no α is given.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if draws < 100:
        raise ValueError(f"draws must be >= 100, got {draws!r}")
    rng = np.random.default_rng(seed)
    if alpha_draws is not None:
        draws = alpha_draws.shape[0]
    r = np.asarray(ratios[: k_max + 1], dtype=float)
    z = rng.standard_normal(draws)
    r_j = np.maximum(1.0, r[None, :] * np.exp(sigma_ratio * z)[:, None])
    r_j[:, 0] = 1.0
    c_j = c * np.exp(sigma_time * rng.standard_normal(draws))
    ks = np.arange(k_max + 1)
    if tau is not None:
        k = int(tau_k)
        e = np.ones((draws, k_max + 1))
        e[:, k] = tau
    elif alpha_draws is not None:
        e = _expected(np.asarray(alpha_draws[:, :k_max], dtype=float))
    elif alphas is not None:
        e = np.repeat(_expected(np.asarray([alphas[:k_max]], dtype=float)), draws, axis=0)
    elif alpha is not None:
        e = np.repeat(_expected(np.full((1, k_max), float(alpha))), draws, axis=0)
    else:
        raise ValueError("speedup_interval needs alpha, alphas, alpha_draws or tau")
    s = e / (ks[None, :] * c_j[:, None] + r_j)
    tail = (1.0 - level) / 2.0
    low = np.quantile(s, tail, axis=0)
    high = np.quantile(s, 1.0 - tail, axis=0)
    point = np.median(s, axis=0)
    best = int(tau_k) if tau is not None else int(np.argmax(point[1:]) + 1)
    k_star = np.argmax(s * (1.0 + 1e-12 * -ks[None, :]), axis=1)    # ties → smaller k
    sources = [f"cost model: σ(log T(n)/T(1)) = {sigma_ratio:.3f}, σ(log T(1)) = {sigma_time:.3f}"]
    if alpha_draws is not None:
        sources.append("α: drawn from the measured per-position posteriors")
    return PlanInterval(level=level, low=low.tolist(), high=high.tolist(),
                        k_star_low=int(np.quantile(k_star, tail, method="lower")),
                        k_star_high=int(np.quantile(k_star, 1.0 - tail, method="higher")), best_k=best,
                        gain_probability=float(np.mean(s[:, best] > 1.0)),
                        verdict=verdict(float(low[best]), float(high[best])), draws=draws, sources=sources)
