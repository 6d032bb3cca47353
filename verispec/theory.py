"""Closed-form speculative-decoding theory: acceptance rate, expected tokens, speedup.

Notation (used throughout this module and its docstrings):

* ``p`` - target distribution, ``q`` - draft distribution (over the same vocabulary).
* ``alpha`` (α) - acceptance rate, the probability that one draft token is accepted.
* ``k`` - draft length (γ in Leviathan et al. 2023), an integer >= 0; ``k = 0`` is
  plain autoregressive decoding.
* ``E`` (τ) - expected number of tokens produced per target forward pass (the
  accepted drafts plus the one bonus/correction token), so ``1 <= E <= k + 1``.
* ``c`` - cost ratio, draft forward time / target forward time (dimensionless).
* ``T_t(n)`` - seconds for one target forward pass that scores ``n`` new tokens;
  verifying ``k`` drafts costs ``T_t(k + 1)``. ``T_d`` - seconds per draft token.

Speedups are ratios of wall-clock throughput (tokens/second of speculative decoding
over tokens/second of plain decoding with the same target), hence dimensionless,
and are exactly 1 at ``k = 0``.

Sources:
    Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
    Decoding" (ICML 2023): Definition 3.1 and Corollary 3.6 (α = Σ min(p, q) =
    1 − TV), Equation (1) (expected tokens), Theorem 3.8 (walltime speedup).
    Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
    Sampling": the same expected-length argument.

All functions are pure; they accept plain Python numbers (and numpy scalars), and
:func:`alpha` also accepts numpy arrays, lists and torch tensors. Invalid arguments
raise ``ValueError`` whose message names the offending argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np

from .checks import (check_alphas, check_int, check_nonneg, check_positive, check_prob,
                     is_scalar_alpha, to_numpy)

__all__ = [
    "alpha",
    "expected_tokens",
    "expected_tokens_positional",
    "speedup_constant_cost",
    "speedup_cost_curve",
    "optimal_k_constant",
    "optimal_k_cost_curve",
    "fit_linear",
    "CostCurve",
]

AlphaSpec = Union[float, Sequence[float]]
TargetTime = Union[Callable[[int], float], Sequence[float]]

# Relative margin by which a larger k must beat the best smaller k in the optimal_k_*
# searches, so that float rounding never breaks a mathematical tie towards larger k.
_TIE_RTOL = 1e-12


# --------------------------------------------------------------------------- acceptance rate


def alpha(p: object, q: object, *, atol: float = 1e-3) -> Union[float, np.ndarray]:
    """Acceptance rate α = Σ_x min(p(x), q(x)) = 1 − TV(p, q).

    Source: Leviathan et al. 2023, Definition 3.1 and Corollary 3.6 (the probability
    that speculative sampling accepts a token drawn from q when the target is p).

    Args:
        p: target distribution(s), shape ``(..., V)``; numpy array, list or torch tensor.
        q: draft distribution(s), same shape as ``p``.
        atol: tolerance for each distribution summing to 1 (float32/bf16 softmax
            outputs are not exactly normalised).

    Returns:
        α, dimensionless in [0, 1] (clipped there to absorb rounding): a Python float
        for 1-D inputs, otherwise a float64 array of shape ``(...)`` (one α per
        leading index, reduced over the last axis).

    Raises:
        ValueError: naming ``p`` or ``q`` if the shapes differ, are 0-d or have an
            empty last axis, or an entry is negative / non-finite, or a distribution
            does not sum to 1 within ``atol``.
    """
    pa = to_numpy(p, "p")
    qa = to_numpy(q, "q")
    if pa.shape != qa.shape:
        raise ValueError(f"p and q must have equal shapes, got p {pa.shape} and q {qa.shape}")
    if pa.ndim == 0 or pa.shape[-1] == 0:
        raise ValueError(f"p and q must have a non-empty last (vocabulary) axis, got shape {pa.shape}")
    for name, arr in (("p", pa), ("q", qa)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
        if np.any(arr < 0):
            raise ValueError(f"{name} must be non-negative")
        sums = arr.sum(axis=-1)
        if np.any(np.abs(sums - 1.0) > atol):
            raise ValueError(f"{name} must sum to 1 over the last axis (atol={atol}), got sums {sums}")
    a = np.clip(np.minimum(pa, qa).sum(axis=-1), 0.0, 1.0)
    return float(a) if a.ndim == 0 else a


# --------------------------------------------------------------------------- expected tokens


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per target forward, E(α, k) = (1 − α^{k+1}) / (1 − α).

    Source: Leviathan et al. 2023, Equation (1) (i.i.d. acceptance with rate α);
    the limit at α = 1 is k + 1. E(α, 0) = 1 (plain decoding).

    Args:
        alpha: acceptance rate in [0, 1] (dimensionless).
        k: draft length, integer >= 0.

    Returns:
        E in tokens per target forward pass, 1 <= E <= k + 1 (includes the bonus token).

    Raises:
        ValueError: naming ``alpha`` if it is not a finite real in [0, 1], or ``k`` if
            it is not an integer >= 0.
    """
    a = check_prob(alpha, "alpha")
    k = check_int(k, "k", 0)
    if a == 1.0:
        return float(k + 1)
    if a == 0.0 or k == 0:
        return 1.0
    if k <= 64:
        # Horner evaluation of Σ_{i=0..k} α^i: positive terms, no cancellation.
        e = 1.0
        for _ in range(k):
            e = 1.0 + a * e
        return e
    # -expm1((k+1)·ln α) = 1 − α^{k+1} without cancellation when α is close to 1.
    return -math.expm1((k + 1) * math.log(a)) / (1.0 - a)


def expected_tokens_positional(alphas: Sequence[float]) -> float:
    """Expected tokens per target forward with per-position acceptance rates.

    E = Σ_{i=0..k} Π_{j=1..i} α_j (the empty product for i = 0 is 1), where α_j is
    the probability that draft j is accepted given drafts 1..j−1 were. With all α_j
    equal to α this is Leviathan et al. 2023, Equation (1); the general form is the
    same argument: E = 1 + E[#accepted] = 1 + Σ_{i=1..k} P(#accepted >= i), the
    tail-sum formula plus one bonus/correction token.

    Args:
        alphas: α_1..α_k, each in [0, 1]; its length is the draft length k (may be 0).

    Returns:
        E in tokens per target forward pass, 1 <= E <= k + 1.

    Raises:
        ValueError: naming ``alphas`` (or ``alphas[i]``) if it is not a 1-D sequence
            of finite reals in [0, 1].
    """
    total, prod = 1.0, 1.0
    for a in check_alphas(alphas, "alphas"):
        prod *= a
        total += prod
    return total


# --------------------------------------------------------------------------- speedup models


def speedup_constant_cost(alpha: float, k: int, c: float) -> float:
    """Walltime speedup under a constant cost ratio, S = E(α, k) / (k·c + 1).

    Source: Leviathan et al. 2023, Theorem 3.8. Assumes verifying k + 1 tokens costs
    the same as one target forward (T_t(k+1) = T_t(1)) and each draft token costs c
    target forwards. S(k = 0) = 1.

    Args:
        alpha: acceptance rate in [0, 1].
        k: draft length, integer >= 0.
        c: cost ratio T_d / T_t(1) (dimensionless), finite and >= 0.

    Returns:
        S, dimensionless speedup over plain decoding.

    Raises:
        ValueError: naming ``alpha``, ``k`` or ``c`` when out of range.
    """
    e = expected_tokens(alpha, k)
    c = check_nonneg(c, "c")
    return e / (k * c + 1.0)


def _target_time_fn(target_time: TargetTime, needed: int) -> Callable[[int], float]:
    """Validate ``target_time`` and return n ↦ T_t(n) (checked positive, finite)."""
    if callable(target_time):
        fn = target_time
    elif isinstance(target_time, (str, bytes)) or not hasattr(target_time, "__len__"):
        raise ValueError(
            f"target_time must be a callable n -> seconds or a sequence with T_t(n) at index n-1, "
            f"got {target_time!r}"
        )
    else:
        if np.ndim(target_time) != 1:
            raise ValueError(f"target_time sequence must be one-dimensional, got {target_time!r}")
        seq = list(target_time)
        if len(seq) < needed:
            raise ValueError(
                f"target_time must hold T_t(n) for n = 1..{needed} (length >= {needed}), got length {len(seq)}"
            )
        fn = lambda n: seq[n - 1]  # noqa: E731

    def checked(n: int) -> float:
        return check_positive(fn(n), f"target_time({n})")

    return checked


def _alpha_spec_E(alpha_or_alphas: AlphaSpec, k: int, k_name: str = "k") -> float:
    if is_scalar_alpha(alpha_or_alphas):
        return expected_tokens(alpha_or_alphas, k)  # type: ignore[arg-type]
    alphas = check_alphas(alpha_or_alphas, "alpha_or_alphas")
    if k > len(alphas):
        raise ValueError(
            f"{k_name}={k} exceeds the number of per-position acceptance rates ({len(alphas)})"
        )
    return expected_tokens_positional(alphas[:k])


def speedup_cost_curve(
    alpha_or_alphas: AlphaSpec,
    k: int,
    target_time: TargetTime,
    draft_time: float,
) -> float:
    """Walltime speedup with a measured target cost curve, S = E·T_t(1) / (k·T_d + T_t(k+1)).

    Generalises Leviathan et al. 2023, Theorem 3.8 (which is the special case
    T_t(n) = T_t(1) for all n and T_d = c·T_t(1)): one speculative round costs k draft
    forwards plus one target forward over k + 1 tokens and yields E tokens on average;
    plain decoding yields one token per T_t(1). S(k = 0) = 1.

    Args:
        alpha_or_alphas: a scalar acceptance rate α in [0, 1] (E = E(α, k), Eq. 1), or a
            sequence of per-position rates α_1..α_K with K >= k (E from
            :func:`expected_tokens_positional` over α_1..α_k).
        k: draft length, integer >= 0.
        target_time: T_t(n) in seconds for a target forward scoring n new tokens;
            either a callable n ↦ seconds or a sequence whose index n−1 holds T_t(n)
            (length >= k + 1). A :class:`CostCurve`'s ``target`` method works.
        draft_time: T_d, seconds per draft token, finite and >= 0.

    Returns:
        S, dimensionless speedup over plain decoding with the same target.

    Raises:
        ValueError: naming ``alpha_or_alphas``, ``k``, ``target_time`` or ``draft_time``
            when out of range (including a too-short ``target_time`` sequence, a
            non-positive T_t(n), or k > len(alphas)).
    """
    k = check_int(k, "k", 0)
    e = _alpha_spec_E(alpha_or_alphas, k)
    t_d = check_nonneg(draft_time, "draft_time")
    t_t = _target_time_fn(target_time, k + 1)
    return e * t_t(1) / (k * t_d + t_t(k + 1))


def _argmax_k(speedup_of_k: Callable[[int], float], k_max: int) -> tuple[int, float]:
    best_k, best_s = 0, speedup_of_k(0)
    for k in range(1, k_max + 1):
        s = speedup_of_k(k)
        if s > best_s * (1.0 + _TIE_RTOL):
            best_k, best_s = k, s
    return best_k, best_s


def optimal_k_constant(alpha: float, c: float, k_max: int) -> tuple[int, float]:
    """Best draft length under the constant-cost model of Leviathan et al. 2023, Thm 3.8.

    Maximises S(k) = E(α, k) / (k·c + 1) over k = 0..k_max by exhaustive search.

    Args:
        alpha: acceptance rate in [0, 1].
        c: cost ratio T_d / T_t(1), finite and >= 0.
        k_max: largest draft length considered, integer >= 0.

    Returns:
        ``(k_star, S(k_star))``. ``k_star = 0`` means plain decoding is best (S(0) = 1).
        Ties go to the smaller k (a larger k must win by a relative margin > 1e-12, so
        float rounding cannot break an exact tie upwards).

    Raises:
        ValueError: naming ``alpha``, ``c`` or ``k_max`` when out of range.
    """
    a = check_prob(alpha, "alpha")
    c = check_nonneg(c, "c")
    k_max = check_int(k_max, "k_max", 0)
    return _argmax_k(lambda k: speedup_constant_cost(a, k, c), k_max)


def optimal_k_cost_curve(
    alpha_or_alphas: AlphaSpec,
    target_time: TargetTime,
    draft_time: float,
    k_max: int,
) -> tuple[int, float]:
    """Best draft length under the cost-curve model (see :func:`speedup_cost_curve`).

    Maximises S(k) = E·T_t(1) / (k·T_d + T_t(k+1)) over k = 0..k_max by exhaustive
    search (generalising Leviathan et al. 2023, Theorem 3.8).

    Args:
        alpha_or_alphas: scalar α in [0, 1], or per-position α_1..α_K with K >= k_max.
        target_time: callable n ↦ seconds, or sequence with T_t(n) at index n−1 of
            length >= k_max + 1.
        draft_time: T_d, seconds per draft token, >= 0.
        k_max: largest draft length considered, integer >= 0.

    Returns:
        ``(k_star, S(k_star))``; ``k_star = 0`` means plain decoding is best (S(0) = 1).
        Ties go to the smaller k (relative margin 1e-12, as in :func:`optimal_k_constant`).

    Raises:
        ValueError: naming ``alpha_or_alphas``, ``target_time``, ``draft_time`` or
            ``k_max`` when out of range (k_max > len(alphas) included).
    """
    k_max = check_int(k_max, "k_max", 0)
    _alpha_spec_E(alpha_or_alphas, k_max, "k_max")  # validates alphas and their length
    check_nonneg(draft_time, "draft_time")
    _target_time_fn(target_time, k_max + 1)  # validates sequence length up front
    return _argmax_k(lambda k: speedup_cost_curve(alpha_or_alphas, k, target_time, draft_time), k_max)


# --------------------------------------------------------------------------- cost curves


def fit_linear(ns: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares line T_t(n) ≈ a + b·n through measured target forward times.

    Uses ``numpy.polyfit(ns, times, 1)``. Used by :meth:`CostCurve.target` for the
    slope beyond the measured range.

    Args:
        ns: numbers of new tokens per forward (dimensionless), at least two distinct values.
        times: seconds, same length as ``ns``.

    Returns:
        ``(a, b)``: intercept a in seconds and slope b in seconds per token.

    Raises:
        ValueError: naming ``ns`` or ``times`` if lengths differ, fewer than two points
            or fewer than two distinct ``ns`` are given, or a value is non-finite.
    """
    x = np.asarray(ns, dtype=np.float64).reshape(-1)
    y = np.asarray(times, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"ns and times must have equal lengths, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x))):
        raise ValueError("ns must be finite")
    if not (np.all(np.isfinite(y))):
        raise ValueError("times must be finite")
    if np.unique(x).size < 2:
        raise ValueError(f"ns must contain at least two distinct values, got {x.tolist()}")
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


@dataclass(frozen=True)
class CostCurve:
    """Measured target cost curve T_t(n) for n = 1..K+1 and draft cost T_d.

    Attributes:
        target_times: seconds; ``target_times[n-1]`` = T_t(n), one target forward that
            scores n new tokens (n = 1..K+1). Non-empty, each > 0 and finite.
        draft_time: T_d, seconds per draft token (one draft forward), finite and >= 0.

    Raises:
        ValueError: naming ``target_times`` or ``draft_time`` when out of range.
    """

    target_times: tuple[float, ...]
    draft_time: float

    def __post_init__(self) -> None:
        tt = self.target_times
        if isinstance(tt, (str, bytes)) or not hasattr(tt, "__len__") or len(tt) == 0:
            raise ValueError(f"target_times must be a non-empty sequence of seconds, got {tt!r}")
        vals = tuple(check_positive(t, f"target_times[{i}]") for i, t in enumerate(tt))
        object.__setattr__(self, "target_times", vals)
        object.__setattr__(self, "draft_time", check_nonneg(self.draft_time, "draft_time"))

    @classmethod
    def from_measurements(
        cls, target_samples: Sequence[Sequence[float]], draft_samples: Union[float, Sequence[float]]
    ) -> "CostCurve":
        """Build a curve from repeated timings, taking the median of each list.

        Args:
            target_samples: ``target_samples[n-1]`` is a non-empty list of seconds
                measured for T_t(n), n = 1..K+1.
            draft_samples: a non-empty list of seconds per draft token (or one number).

        Raises:
            ValueError: naming ``target_samples`` / ``draft_samples`` if empty,
                non-finite or out of range.
        """
        if isinstance(target_samples, (str, bytes)) or not hasattr(target_samples, "__len__") or len(target_samples) == 0:
            raise ValueError("target_samples must be a non-empty sequence of per-n sample lists")
        meds = []
        for i, s in enumerate(target_samples):
            arr = np.asarray(s, dtype=np.float64).reshape(-1)
            if arr.size == 0 or not np.all(np.isfinite(arr)):
                raise ValueError(f"target_samples[{i}] must be a non-empty list of finite seconds")
            meds.append(float(np.median(arr)))
        if is_scalar_alpha(draft_samples):
            t_d = check_nonneg(draft_samples, "draft_samples")
        else:
            arr = np.asarray(draft_samples, dtype=np.float64).reshape(-1)
            if arr.size == 0 or not np.all(np.isfinite(arr)):
                raise ValueError("draft_samples must be a non-empty list of finite seconds")
            t_d = check_nonneg(float(np.median(arr)), "draft_samples")
        return cls(tuple(meds), t_d)

    @property
    def k_measured(self) -> int:
        """K: the largest draft length whose verification cost T_t(K+1) was measured."""
        return len(self.target_times) - 1

    def target(self, n: int) -> float:
        """T_t(n) in seconds for integer n >= 1.

        Measured value for n <= K+1. Beyond it, linear extrapolation from the last
        measured point, T_t(K+1) + b·(n − K − 1), with b the :func:`fit_linear`
        least-squares slope over all measured points, clamped to >= 0 (a longer
        forward is never assumed cheaper); with a single measured point b = 0.

        Raises:
            ValueError: naming ``n`` if it is not an integer >= 1.
        """
        n = check_int(n, "n", 1)
        tt = self.target_times
        if n <= len(tt):
            return tt[n - 1]
        slope = 0.0
        if len(tt) >= 2:
            _, b = fit_linear(range(1, len(tt) + 1), tt)
            slope = max(b, 0.0)
        return tt[-1] + slope * (n - len(tt))

    def constant_c(self) -> float:
        """Cost ratio c = T_d / T_t(1) (dimensionless) for :func:`speedup_constant_cost`."""
        return self.draft_time / self.target_times[0]

    def speedup(self, alpha_or_alphas: AlphaSpec, k: int) -> float:
        """:func:`speedup_cost_curve` with this curve's T_t and T_d."""
        return speedup_cost_curve(alpha_or_alphas, k, self.target, self.draft_time)

    def speedups(self, alphas: Sequence[float]) -> list[float]:
        """S(1), ..., S(k) of :func:`speedup_cost_curve` for per-position rates α_1..α_k, in
        one pass (E accumulated position by position, Leviathan et al. 2023, Theorem 3.8
        with this curve's T_t and T_d): the same floats as k calls of :meth:`speedup`,
        for the price of one. An adaptive policy prices every k of every drafter each round.

        Args:
            alphas: α_1..α_k, each in [0, 1] (k may be 0: an empty list comes back).

        Raises:
            ValueError: naming ``alphas`` as :func:`expected_tokens_positional` does.
        """
        out, total, prod = [], 1.0, 1.0
        t1, t_d = self.target_times[0], self.draft_time
        for k, a in enumerate(check_alphas(alphas, "alphas"), start=1):
            prod *= a
            total += prod
            out.append(total * t1 / (k * t_d + self.target(k + 1)))
        return out

    def optimal_k(self, alpha_or_alphas: AlphaSpec, k_max: int) -> tuple[int, float]:
        """:func:`optimal_k_cost_curve` with this curve's T_t and T_d."""
        return optimal_k_cost_curve(alpha_or_alphas, self.target, self.draft_time, k_max)
