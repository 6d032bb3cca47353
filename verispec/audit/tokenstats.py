"""Per-token statistics of an endpoint audit: effects, intervals, p-values, power.

Input: the scored tokens of many completions (`verispec.audit.scoring.stack`). When
the reference is the server's true law, each token x_t is an exact draw from p_t
given everything before it, so the per-token terms below are martingale
differences with known conditional variances: their sums pool across positions,
completions and prompts, and the central limit theorem for martingales (Hall &
Heyde 1980, Thm 3.2) gives normal intervals with the *exact* variance Σ Var_t.

Three statistics, each an `Effect` (estimate, interval, p-value of "no effect",
the smallest effect detectable with 80 % power at the level it is tested at):

* **top-1 excess** (probability units): (1/n) Σ (1[x_t = argmax p_t] − max p_t);
  Var = Σ max p_t (1 − max p_t) / n². The verdict's tolerance is on this effect.
* **log-likelihood excess** (nats/token): (1/n) Σ (log p_t(x_t) + H(p_t));
  Var = Σ Var_{p_t}(log p_t) / n². Positive: the server is too sharp; negative: too flat.
* **PIT uniformity** (Kolmogorov distance D between the randomized PITs' empirical
  CDF and the uniform): p-value of the Kolmogorov–Smirnov test (`scipy.stats.kstest`),
  the interval D̂ ± ε with ε = sqrt(ln(2/a)/(2n)) (Dvoretzky–Kiefer–Wolfowitz with
  Massart's 1990 constant, exact for every n), and the detectable D
  ε(a) + sqrt(ln(1/0.2)/(2n)) (a true D that large is rejected with probability
  >= 0.8 by the same inequality: conservative, not asymptotic). The omnibus test: any
  change of law moves the PIT distribution, including a fault that keeps the top-1
  rate but moves mass among other tokens.

For a normal statistic at two-sided level a the detectable effect is
(z_{1−a/2} + z_{0.8}) · se (Cohen 1988, ch. 12); the tokens needed for an interval of
half-width h are n·(z·se/h)² (se ∝ 1/sqrt n).

Tokens outside the reference's support are not in these statistics (they are
counted apart: `verispec.audit.verdict`), nor are greedy positions (p a point mass:
top-1 excess and PIT carry no information there; the verdict classifies each
divergence instead).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["POWER", "Effect", "per_position", "token_effects"]

POWER = 0.8


@dataclass
class Effect:
    """One statistic (module doc). ``ci`` is at confidence 1 − level (two-sided);
    ``se`` the standard error (0 for the PIT); ``detectable`` at 80 % power at `level`;
    ``df`` the Student t degrees of freedom of ``(estimate − effect) / se`` (None: normal)."""

    name: str
    unit: str
    estimate: float
    ci: tuple[float, float]
    p_value: float
    n: int
    se: float
    level: float
    detectable: float | None
    role: str = "significance"      # "tolerance": the verdict's equivalence statistic
    df: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d


def _z(level: float) -> float:
    from scipy.stats import norm
    return float(norm.isf(level / 2))


def normal_effect(name: str, unit: str, total: float, var: float, n: int, level: float,
                  role: str = "significance", null: float = 0.0) -> Effect:
    """An `Effect` of the mean total/n with variance var/n² (two-sided z test of `null`)."""
    from scipy.stats import norm

    est = total / n if n else 0.0
    se = math.sqrt(var) / n if n else math.inf
    z = _z(level)
    if se > 0:
        p = float(2 * norm.sf(abs(est - null) / se))
    else:
        p = 1.0 if est == null else 0.0
    det = (z + float(norm.isf(1 - POWER))) * se if se < math.inf else None
    return Effect(name, unit, est, (est - z * se, est + z * se), p, n, se, level, det, role)


def pit_effect(u: np.ndarray, level: float) -> Effect:
    """The PIT omnibus: Kolmogorov–Smirnov against Uniform(0, 1), DKW interval (module doc)."""
    from scipy.stats import kstest

    n = len(u)
    if n == 0:
        return Effect("PIT uniformity", "KS distance", 0.0, (0.0, 1.0), 1.0, 0, 0.0, level, None)
    res = kstest(u, "uniform")
    d = float(res.statistic)
    eps = math.sqrt(math.log(2 / level) / (2 * n))
    det = eps + math.sqrt(math.log(1 / (1 - POWER)) / (2 * n))
    return Effect("PIT uniformity", "KS distance", d, (max(0.0, d - eps), min(1.0, d + eps)),
                  float(res.pvalue), n, 0.0, level, det if det <= 1 else None)


def token_effects(tokens: dict[str, np.ndarray], level: float) -> list[Effect]:
    """The three statistics of the module doc over the sampled (non-greedy, in-support) tokens.

    Args:
        tokens: `scoring.stack` output.
        level: the per-statistic two-sided level (after the verdict's correction).

    Returns:
        [top-1 excess (role "tolerance"), log-likelihood excess, PIT uniformity].
    """
    if not tokens:
        return []
    keep = ~tokens["outside"] & (tokens["pmax"] < 1.0)
    n = int(keep.sum())
    pm = tokens["pmax"][keep]
    top = normal_effect("top-1 excess", "probability", float((tokens["top1"][keep] - pm).sum()),
                        float((pm * (1 - pm)).sum()), n, level, role="tolerance")
    ll = normal_effect("log-likelihood excess", "nats/token", float(tokens["llx"][keep].sum()),
                       float(tokens["llvar"][keep].sum()), n, level)
    return [top, ll, pit_effect(tokens["pit"][keep], level)]


def per_position(tokens: dict[str, np.ndarray], level: float, max_positions: int = 512) -> list[dict]:
    """Top-1 excess per position 1..m (for the report's plot and table): dicts with
    position, n, estimate, ci (level `level`, not corrected: descriptive)."""
    if not tokens:
        return []
    keep = ~tokens["outside"] & (tokens["pmax"] < 1.0)
    out = []
    for pos in range(1, min(int(tokens["position"].max()), max_positions) + 1):
        sel = keep & (tokens["position"] == pos)
        n = int(sel.sum())
        if not n:
            continue
        pm = tokens["pmax"][sel]
        e = normal_effect("top-1 excess", "probability", float((tokens["top1"][sel] - pm).sum()),
                          float((pm * (1 - pm)).sum()), n, level)
        out.append({"position": pos, "n": n, "estimate": e.estimate, "ci": list(e.ci)})
    return out


def tokens_needed(effect: Effect, tolerance: float, one_sided_level: float) -> int | None:
    """Units (tokens, or completions for a per-completion statistic) for `effect` to settle
    against ±tolerance by a one-sided normal test at `one_sided_level`, if the estimate
    stays where it is: inside (|e| < tol) z·se must shrink to tol − |e| (the equivalence
    test, pass); outside, to |e| − tol (FAIL). None when the estimate sits on the tolerance."""
    from scipy.stats import norm

    gap = abs(tolerance - abs(effect.estimate))
    if gap <= 0 or not effect.n or not math.isfinite(effect.se):
        return None
    sigma = effect.se * math.sqrt(effect.n)
    return int(math.ceil((float(norm.isf(one_sided_level)) * sigma / gap) ** 2))
