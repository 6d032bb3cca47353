"""The planner: predicted cost curve → E(α, k), S(k), k*, break-even α and the ceiling.

The roofline (:mod:`verispec.plan.roofline`) predicts T_t(n) for n = 1..k_max+1 and
T_d; everything after that is :mod:`verispec.theory`, unchanged:

    S(k) = E · T_t(1) / (k · T_d + T_t(k + 1))        (speedup_cost_curve, generalising
                                                       Leviathan et al. 2023, Thm 3.8)
    E(α, k) = (1 − α^{k+1}) / (1 − α)                  (Leviathan et al. 2023, Eq. 1)

with per-position α_1..α_K (from an analysis.json) in place of one α when given. The
break-even α is the smallest α for which some k in 1..k_max has S(k) > 1 (E rises with
α, so each k's crossing is found by bisection); the ceiling is max_k S(k) at α = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..theory import CostCurve, expected_tokens, expected_tokens_positional
from .device import Hardware
from .hardware import parse_hardware
from .intervals import PlanInterval, speedup_interval
from .resolve import load_shape
from .roofline import ForwardTime, Stack, forward_time
from .shapes import ModelShape
from .stacks import default_stack, get_stack

__all__ = ["Plan", "alpha_from_tau", "break_even_alpha", "ceiling", "plan"]


@dataclass
class Plan:
    """A plan: predicted costs and speedups for one target/draft pair on one machine.

    Attributes:
        target, draft: the models' sizes (``draft`` is None for prompt lookup).
        hardware, stack: where and how it runs.
        alpha: the scalar α used (mean of the per-position rates when those are given).
        alphas: per-position α_1..α_{k_max}, or None for i.i.d. α.
        alpha_source: "--alpha", "--tau" or the analysis.json it came from.
        context, batch, k_max: the forward's cache length, sequences, largest k.
        target_forwards: predicted T_t(n), n = 1..k_max+1, with their parts.
        draft_forward: predicted T_d (None for prompt lookup: T_d = 0).
        target_times: seconds, T_t(n) at index n−1. draft_time: T_d seconds.
        c: T_d / T_t(1).
        expected_tokens, speedups: E and S(k) for k = 0..k_max.
        k_star, speedup_star: the best k and S(k*) (k* = 0: plain decoding).
        break_even_alpha: smallest α at which speculation pays (None: never, even at α=1).
        ceiling_k, ceiling_speedup: the best k and S at α = 1.
        interval: the 80 % (``level``) prediction intervals of S(k) and k*, and the
            verdict in words (:mod:`verispec.plan.intervals`).
        notes: plain-language remarks.
    """

    target: ModelShape
    draft: ModelShape | None
    hardware: Hardware
    stack: Stack
    alpha: float
    alphas: list[float] | None
    alpha_source: str
    context: int
    batch: int
    k_max: int
    target_forwards: list[ForwardTime]
    draft_forward: ForwardTime | None
    target_times: list[float]
    draft_time: float
    c: float
    expected_tokens: list[float]
    speedups: list[float]
    k_star: int
    speedup_star: float
    break_even_alpha: float | None
    ceiling_k: int
    ceiling_speedup: float
    interval: PlanInterval | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cost_curve(self) -> CostCurve:
        return CostCurve(tuple(self.target_times), self.draft_time)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: plain numbers, lists and dicts (seconds, dimensionless ratios)."""
        out = asdict(self)
        out["target_ratios"] = [t / self.target_times[0] for t in self.target_times]
        return out


def _check_k(k_max: int) -> int:
    if isinstance(k_max, bool) or not isinstance(k_max, int) or not 1 <= k_max <= 64:
        raise ValueError(f"--k-max must be an integer in 1..64, got {k_max!r}")
    return k_max


def _check_alpha(alpha: float, flag: str = "--alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) \
            or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"{flag} must be in (0, 1) (exclusive), got {alpha!r}")
    return float(alpha)


def alpha_from_tau(tau: float, k: int) -> float:
    """The i.i.d. α whose E(α, k) equals τ (bisection; E is increasing in α).

    Args:
        tau: mean tokens per target forward, bonus included, in (1, k + 1).
        k: the draft length τ was measured at, integer >= 1.

    Raises:
        ValueError: naming ``--tau`` / ``--tau-k`` when out of range.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--tau-k must be an integer >= 1, got {k!r}")
    if not isinstance(tau, (int, float)) or not math.isfinite(tau) or not 1.0 < tau < k + 1:
        raise ValueError(f"--tau must be in (1, {k + 1}) for draft length {k} (τ counts the bonus token), got {tau!r}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def break_even_alpha(curve: CostCurve, k_max: int) -> float | None:
    """Smallest i.i.d. α at which some k in 1..k_max gives S(k) > 1; None if none does at α = 1.

    For each k, S(k; α) = E(α, k) · T_t(1) / (k · T_d + T_t(k + 1)) rises with α, so
    its crossing of 1 is found by bisection; the answer is the smallest crossing.
    """
    best = None
    for k in range(1, k_max + 1):
        need = (k * curve.draft_time + curve.target(k + 1)) / curve.target(1)   # E needed for S = 1
        if need >= k + 1:          # even α = 1 (E = k + 1) does not pay
            continue
        if need <= 1.0:
            return 0.0
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if expected_tokens(mid, k) < need:
                lo = mid
            else:
                hi = mid
        best = hi if best is None else min(best, hi)
    return best


def ceiling(curve: CostCurve, k_max: int) -> tuple[int, float]:
    """(k, S) maximising S(k) at α = 1 (every draft accepted): (k+1)·T_t(1) / (k·T_d + T_t(k+1))."""
    return curve.optimal_k(1.0, k_max)


def _fits(target: ModelShape, draft: ModelShape | None, hardware: Hardware, context: int, batch: int,
          k_max: int) -> None:
    if hardware.memory is None:
        return
    held = target.memory_bytes + (draft.memory_bytes if draft else 0.0)
    tokens = batch * (context + k_max + 1)
    held += tokens * (target.kv_bytes_per_token() + (draft.kv_bytes_per_token() if draft else 0.0))
    room = hardware.memory * hardware.n_devices
    if held > room:
        raise ValueError(
            f"--target {target.name} ({target.dtype}) with --draft {draft.name if draft else 'none'} needs "
            f"{held / 1e9:.1f} GB (weights + KV cache for {tokens} tokens) but --hardware {hardware.label} holds "
            f"{room / 1e9:.1f} GB; use more devices (',n=N'), a smaller --dtype, or a shorter --context")


def plan(target: str | ModelShape, draft: str | ModelShape | None, hardware: str | Hardware, *,
         alpha: float | None = None, alphas: Sequence[float] | None = None, tau: float | None = None,
         tau_k: int | None = None, context: int = 512, batch: int = 1, k_max: int = 8,
         dtype: str | None = None, draft_dtype: str | None = None, stack: str | Stack | None = None,
         alpha_source: str | None = None, alpha_draws=None, level: float = 0.8) -> Plan:
    """Predict T_t(n), T_d, c, E(α, k), S(k), k*, the break-even α and the ceiling.

    Args:
        target: model spec (registered name, preset, config.json / HF directory, .gguf)
            or a ModelShape.
        draft: the same for the draft model, or None for prompt lookup (T_d = 0).
        hardware: catalogue name, spec string (``"bw=2039GB/s,flops=312T,n=2"``),
            ``"local"`` or a Hardware.
        alpha: i.i.d. acceptance rate in (0, 1). Exactly one of ``alpha``, ``alphas``, ``tau``.
        alphas: per-position α_1..α_K, each in [0, 1]; positions beyond K reuse α_K.
        tau: mean tokens per target forward (bonus included) measured at draft length
            ``tau_k`` (default ``k_max``); α is solved from E(α, tau_k) = τ.
        context: tokens in the KV cache when drafting (>= 0).
        batch: sequences decoded together (>= 1).
        k_max: largest draft length considered (1..64).
        dtype, draft_dtype: override the stored dtype (``draft_dtype`` defaults to ``dtype``).
        stack: software stack name / file / Stack (default: the machine's usual stack,
            :func:`verispec.plan.stacks.default_stack`).
        alpha_source: label recorded in the plan.
        alpha_draws: optional samples of α_1..α_{k_max}, shape (draws, k_max), e.g. from
            :meth:`verispec.plan.server_alpha.ServerAcceptance.draw`, for the interval.
        level: interval level (default 0.8).

    Returns:
        Plan.

    Raises:
        ValueError: naming the flag (--alpha, --tau, --k-max, --context, --batch, --dtype,
            --target, --draft, --hardware, --stack) for anything it cannot model, including
            models larger than the devices' memory.
    """
    k_max = _check_k(k_max)
    for name, value, low in (("--context", context, 0), ("--batch", batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    given = [x is not None for x in (alpha, alphas, tau)]
    if sum(given) != 1:
        raise ValueError("give exactly one of --alpha, --alpha-from or --tau")
    per_position: list[float] | None = None
    if alpha is not None:
        a = _check_alpha(alpha)
        source = alpha_source or "--alpha"
    elif tau is not None:
        a = alpha_from_tau(tau, k_max if tau_k is None else tau_k)
        source = alpha_source or f"--tau {tau} at k={k_max if tau_k is None else tau_k}"
    else:
        seq = [float(x) for x in alphas]  # type: ignore[union-attr]
        if not seq or any(not (0.0 <= x <= 1.0) or not math.isfinite(x) for x in seq):
            raise ValueError(f"--alpha-from: per-position α must be a non-empty list in [0, 1], got {seq!r}")
        if not 0.0 < seq[0] < 1.0:
            raise ValueError(f"--alpha-from: α_1 must be in (0, 1), got {seq[0]!r}")
        per_position = (seq + [seq[-1]] * k_max)[:k_max]
        a = sum(per_position) / len(per_position)
        source = alpha_source or "per-position α"
    hw = parse_hardware(hardware)
    st = get_stack(stack, default=default_stack(hw))
    t_shape = load_shape(target, dtype=dtype, flag="--target")
    d_shape = None if draft is None else load_shape(draft, dtype=draft_dtype or dtype, flag="--draft",
                                                    dtype_flag="--draft-dtype" if draft_dtype else "--dtype")
    _fits(t_shape, d_shape, hw, context, batch, k_max)

    forwards = [forward_time(t_shape, hw, st, n, context, batch) for n in range(1, k_max + 2)]
    d_forward = None if d_shape is None else forward_time(d_shape, hw, st, 1, context, batch)
    times = [f.total_s for f in forwards]
    t_d = 0.0 if d_forward is None else d_forward.total_s
    curve = CostCurve(tuple(times), t_d)
    spec = per_position if per_position is not None else a
    if per_position is not None:
        es = [expected_tokens_positional(per_position[:k]) for k in range(k_max + 1)]
    else:
        es = [expected_tokens(a, k) for k in range(k_max + 1)]
    speedups = [curve.speedup(spec, k) for k in range(k_max + 1)]
    k_star, s_star = curve.optimal_k(spec, k_max)
    ck, cs = ceiling(curve, k_max)
    be = break_even_alpha(curve, k_max)
    ratios = [t / times[0] for t in times]
    interval = speedup_interval(ratios, curve.constant_c(), k_max, alpha=None if per_position else a,
                                alphas=per_position, alpha_draws=alpha_draws, sigma_ratio=st.sigma_log_ratio,
                                sigma_time=st.sigma_log_time if d_shape is not None else 0.0, level=level)
    notes = _notes(forwards, d_forward, curve, k_star, be, a)
    if st.sigma_log_ratio == 0.0:
        notes.append(f"stack {st.name} has no fitted scatter: the interval covers α only")
    return Plan(target=t_shape, draft=d_shape, hardware=hw, stack=st, alpha=a, alphas=per_position,
                alpha_source=source, context=context, batch=batch, k_max=k_max, target_forwards=forwards,
                draft_forward=d_forward, target_times=times, draft_time=t_d, c=curve.constant_c(),
                expected_tokens=es, speedups=speedups, k_star=k_star, speedup_star=s_star,
                break_even_alpha=be, ceiling_k=ck, ceiling_speedup=cs, interval=interval, notes=notes)


def _notes(forwards: list[ForwardTime], draft: ForwardTime | None, curve: CostCurve, k_star: int,
           be: float | None, alpha: float) -> list[str]:
    notes = []
    t1 = forwards[0]
    notes.append(f"one target forward is {t1.bound}-bound ({t1.memory_s * 1e3:.3g} ms memory, "
                 f"{t1.compute_s * 1e3:.3g} ms compute, {t1.overhead_s * 1e3:.3g} ms overhead)")
    last = forwards[-1]
    notes.append(f"scoring {last.n} tokens costs {last.total_s / t1.total_s:.2f}x one")
    crossing = next((f.n for f in forwards if f.compute_s > f.memory_s), None)
    if crossing is not None:
        notes.append(f"the target turns compute-bound at n = {crossing} new tokens")
    if draft is not None:
        notes.append(f"the draft costs c = {curve.constant_c():.3f} of a target step ({draft.bound}-bound)")
    if be is None:
        notes.append("speculation cannot pay on this machine with this pair, even at α = 1")
    elif k_star == 0:
        notes.append(f"at α = {alpha:.2f} plain decoding is best; speculation starts to pay at α > {be:.2f}")
    return notes
