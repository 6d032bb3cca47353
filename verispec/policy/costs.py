"""The one online model of what a round costs: T_t(n), T_d and the catch-up, learned as it runs.

Vocabulary (as in `verispec.theory`; all times in seconds):

* T_t(n) - one target forward over n new tokens; verifying k drafts needs n = k + 1.
  Each measured n is its own decayed mean (`Decayed`): CPU matmul cost is far from
  linear in n (with torch float32 here, 8 rows cost less than 3), so measuring every n
  beats fitting a line. An unmeasured n <= n_max is guessed optimistically as
  T_t(1) · (1 + explore_slope · (n - 1)), so every draft length that could pay is tried
  once and then judged on its measured cost. Wider forwards (n > n_max) only come from
  several sequences' rows together (`set_load`), too many sums to try one by one, so they
  are guessed from the measured widths around them: between two, on the line through them;
  beyond the widest measured M, T_t(M) + b · (n - M) with b the least-squares slope over the
  measured widths, at least 0 (`theory.CostCurve.target`'s rule). (Guessed from T_t(1) as
  the others, T_t(10) came out at 1.9 T_t(1), under the measured T_t(9) = 4.7 T_t(1), and a
  batching server drafted almost every round on a CPU where one more row costs most of a
  step.)
* verification width w(n) - the measured m >= n (up to n_max) with the smallest T_t(m),
  if it beats T_t(n) by the margin; else n. Filler rows after the drafts cost nothing in
  exactness (causal attention), so a verification of n tokens costs T_t(w(n)).
* T_d - seconds per drafted token, per drafter; catch-up - seconds per context token a
  drafter must read before drafting (a draft model after the prompt or plain rounds).
* round overhead o - a round's wall seconds beyond its timed forwards (wall - T_t(w) -
  k·T_d, catch-up excluded): the loop, the drafter's own bookkeeping, warping k + 1 rows
  of logits, the acceptance rule. One decayed mean for plain rounds (o_0) and one per
  drafter, shrunk towards o_0 with the weight of `prior_weight` rounds (o_d; o_0 before
  its first round), whose weight fades by `relax` for every round the drafter sits out (a
  slow first round - lazy set-up, a cold cache - is not a verdict for good). It is
  measured on the round itself, so the
  forwards' jitter cancels, and it is unbiased by the choice (a per-drafter ratio of
  predicted to wall seconds, tried before, was biased low by choosing the k whose T_t
  estimate is noisily low, and kept drafters away after one slow round).

Its prices come out as a `verispec.theory.CostCurve` (`curve(drafter)`): T_t(1), guarded
against a noisy single-token time (not above the line through T_t(2), T_t(3)), and
T_t(w(n)) for n = 2..n_max, with that drafter's T_d; the speedup and the best k are then
the CostCurve's (Leviathan et al. 2023, Theorem 3.8, with the measured curve in place of
the constant cost ratio c), each round's overhead added to its forward: T_t(1) + o_0 and
T_t(w(n)) + o_d. `from_curve` seeds the model with a curve measured elsewhere
(`verispec analyze`, `verispec.cost.measure_cost_curve`, a planner's prediction), so the
policy, the analysis and the planner share one abstraction.

Under load (a batching server, `verispec.batching`): T_t is learned by the rows of the whole
forward - a round whose forward also carried R rows of other sequences is filed under
T_t(R + width) (`set_load(other_rows=R)`), in a table of its own (`loaded_cost`: rows of
several sequences cost more than as many rows of one, whose solo curve a shared width never
measured is scaled from, `price`) - and priced with the planner's `--batch` maths
(`verispec.plan`): with B sequences sharing the forward, each verifying n tokens, a round
costs T_B(n) = T_t(B·n) (`set_load(sequences=B)`; `price`), and its drafts B·k·T_d: each sequence
drafts in its own thread, one after another (a draft model's forwards are each request's
own; a drafter in Python holds the interpreter), and the shared forward waits for the last,
so one sequence's k drafted tokens hold up all B. Hence S(k) = E·T_t(B) / (B·k·T_d +
T_t(B(k+1))), and a catch-up is charged B times its seconds. Where T_t is flat
(memory-bound) drafting stays nearly free for a drafter with T_d ~ 0; once B·(k+1) rows
leave the flat part, each draft row costs a full row for every sequence and k* falls to 0;
on a 2-core Xeon's curve (T_d ~ T_t(1)/2 for a 0.5B draft of a 1.5B target) a draft model
stops paying at B = 2 even at α = 0.99. B = 1, R = 0 (the default) is the single-sequence
model above, unchanged.

Guard: timings that are not finite, negative, or (for the target) zero are refused
(`accepts`), so no price here is ever NaN, infinite or free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..theory import AlphaSpec, CostCurve, fit_linear
from .decayed import Decayed

__all__ = ["OnlineCostCurve"]


class OnlineCostCurve:
    """T_t(n) for n = 1..n_max, and per drafter T_d and the catch-up cost, learned online.

    Args:
        drafters: the drafter names it prices.
        n_max: largest forward width priced, k_max + 1 (tokens, >= 1).
        decay: weight of the past per new observation, in (0, 1).
        explore_slope: relative cost per extra token guessed for an unmeasured T_t(n).
        margin: relative gain a wider verification must bring to be used.
        prior_weight: weight of o_0 in a drafter's round overhead, in rounds.

    Attributes:
        target_cost: n -> decayed mean of T_t(n) (measured widths only).
        draft_cost: drafter -> decayed mean of T_d (seconds per drafted token).
        catchup_cost: drafter -> decayed mean of seconds per caught-up context token.
        overhead: drafter (None: plain rounds) -> decayed mean of round overhead seconds.
    """

    def __init__(self, drafters: Iterable[str], n_max: int, *, decay: float, explore_slope: float,
                 margin: float, prior_weight: float = 3.0) -> None:
        self.n_max, self.decay, self.explore_slope, self.margin = n_max, decay, explore_slope, margin
        self.prior_weight = prior_weight
        self.target_cost: dict[int, Decayed] = {}
        self.loaded_cost: dict[int, Decayed] = {}   # T_t by the forward's total rows, under load
        self.draft_cost = {name: Decayed() for name in drafters}
        self.catchup_cost = {name: Decayed() for name in self.draft_cost}
        self.overhead: dict[str | None, Decayed] = {name: Decayed() for name in (None, *self.draft_cost)}
        self._curves: dict[str, CostCurve] = {}   # per drafter, until the next observation or load
        # the drafter-independent prices, (guarded T_t(1), [T_t(w(n)) for n = 2..n_max]), until
        # the next target observation or load: every drafter's curve is built on them each round
        self._prices: tuple[float, list[float]] | None = None
        self._slope: float | None = None            # of the solo curve, until its next observation
        self.sequences, self.other_rows = 1, 0     # the load (`set_load`)

    @classmethod
    def from_curve(cls, curve: CostCurve, drafter: str, *, n_max: int | None = None, decay: float = 0.9,
                   explore_slope: float = 0.1, margin: float = 0.03) -> OnlineCostCurve:
        """A model whose first observations are a measured curve: T_t(n) for the curve's
        n = 1..K+1 (up to `n_max`, default K+1), and its T_d for `drafter`."""
        n_max = n_max or len(curve.target_times)
        model = cls([drafter], n_max, decay=decay, explore_slope=explore_slope, margin=margin)
        for n, seconds in enumerate(curve.target_times[:n_max], start=1):
            model.observe_target(n, seconds)
        model.observe_draft(drafter, curve.draft_time)
        return model

    # -- load ------------------------------------------------------------------------------
    def set_load(self, sequences: int = 1, other_rows: int = 0) -> None:
        """Describe the shared forward (module docstring, "Under load").

        Args:
            sequences: B, sequences that share the next forward (this one included), >= 1;
                prices become T_t(B·n).
            other_rows: R, rows the other sequences put in the forward just run, >= 0; the
                next `observe_target(n, s)` is filed under T_t(R + n).

        Raises:
            ValueError: naming the argument when it is not an integer in range.
        """
        for name, value, low in (("sequences", sequences, 1), ("other_rows", other_rows, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if sequences != self.sequences or (sequences == 1 and other_rows == 0) != self.alone:
            self._curves.clear()
            self._prices = None
        self.sequences, self.other_rows = sequences, other_rows

    # -- learning --------------------------------------------------------------------------
    @staticmethod
    def accepts(target_seconds: float, draft_seconds: float = 0.0, catchup_seconds: float = 0.0) -> bool:
        """Whether one round's timings may be learned from: all finite, T_t > 0, the rest >= 0."""
        return (math.isfinite(target_seconds) and target_seconds > 0
                and all(math.isfinite(t) and t >= 0 for t in (draft_seconds, catchup_seconds)))

    def observe_target(self, n: int, seconds: float) -> bool:
        """One forward over n new tokens (plus `other_rows` of other sequences) took
        `seconds`; False (refused) unless finite and > 0."""
        return self._file(n + self.other_rows, seconds)

    def _file(self, rows: int, seconds: float, alone: bool | None = None) -> bool:
        if not self.accepts(seconds):
            return False
        self._curves.clear()
        self._prices = None
        if alone is None:
            alone = self.alone
        if alone:
            self._slope = None
        table = self.target_cost if alone else self.loaded_cost
        return table.setdefault(rows, Decayed()).add(seconds, self.decay)

    def reset_target(self, n: int, seconds: float) -> bool:
        """Replace T_t(n) by one fresh measurement of n rows alone (calibration)."""
        if not self.accepts(seconds):
            return False
        self.target_cost[n] = Decayed()
        return self._file(n, seconds, alone=True)

    def observe_draft(self, name: str, seconds_per_token: float) -> bool:
        """Drafter `name` drafted at `seconds_per_token`; False (refused) unless finite, >= 0."""
        if not self.accepts(1.0, seconds_per_token):
            return False
        self._curves.pop(name, None)
        return self.draft_cost[name].add(seconds_per_token, self.decay)

    def observe_catchup(self, name: str, seconds_per_token: float) -> bool:
        """Drafter `name` read missed context at `seconds_per_token`; refused like `observe_draft`."""
        if not self.accepts(1.0, seconds_per_token):
            return False
        return self.catchup_cost[name].add(seconds_per_token, self.decay)

    def observe_overhead(self, name: str | None, seconds: float) -> bool:
        """A round of drafter `name` (None: a plain round) spent `seconds` beyond its timed
        forwards; False (refused) unless finite and >= 0."""
        if name not in self.overhead or not self.accepts(1.0, seconds):
            return False
        if name is None:
            self._curves.clear()
        else:
            self._curves.pop(name, None)
        return self.overhead[name].add(seconds, self.decay)

    def round_overhead(self, name: str | None) -> float:
        """o_d of drafter `name` (None: o_0 of plain rounds), seconds: its decayed mean
        shrunk towards o_0 with the weight of `prior_weight` rounds; o_0 is 0 before the
        first plain round."""
        plain = self.overhead[None]
        base = plain.mean if plain.weight else 0.0
        stat = self.overhead.get(name) if name is not None else None
        if stat is None or not stat.weight:
            return base
        return (stat.total + self.prior_weight * base) / (stat.weight + self.prior_weight)

    def relax(self, name: str, factor: float) -> None:
        """Drafter `name` sat a round out: its round overhead keeps `factor` (in [0, 1]) of
        its weight, drifting back towards o_0."""
        self.overhead[name].scale(factor)
        self._curves.pop(name, None)

    # -- prices ------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Whether T_t(1) is known (a plain round or calibration has been seen)."""
        return 1 in self.target_cost

    def target(self, n: int) -> float:
        """T_t(n) in seconds: the measured mean, else the optimistic guess (n <= n_max) or one
        from the measured widths around n (module docstring).

        Raises:
            ValueError: before T_t(1) is known (`ready`).
        """
        if not self.ready:
            raise ValueError("T_t(1) is not known yet: observe a plain round or calibrate first")
        cost = self.target_cost.get(n)
        if cost is not None:
            return cost.mean
        optimistic = self.target_cost[1].mean * (1.0 + self.explore_slope * (n - 1))
        if n <= self.n_max:                          # a width one sequence can reach: try it
            return optimistic
        widths = sorted(self.target_cost)
        below = max(m for m in widths if m < n)
        above = min((m for m in widths if m > n), default=None)
        low = self.target_cost[below].mean
        if above is not None:                        # on the line between measured neighbours
            high = self.target_cost[above].mean
            return low + (high - low) * (n - below) / (above - below)
        if len(widths) < 2:
            return optimistic
        # beyond the widest: CostCurve.target's rule (least-squares slope, at least 0), fitted
        # once per change of the curve (a batched policy prices dozens of wide widths a round)
        if self._slope is None:
            self._slope = max(0.0, fit_linear(widths, [self.target_cost[m].mean for m in widths])[1])
        return low + self._slope * (n - below)

    @property
    def alone(self) -> bool:
        """No other sequence shares the forward (`set_load`'s default): prices and
        observations are the single-sequence curve's, else the shared forwards'."""
        return self.sequences == 1 and self.other_rows == 0

    def _measured(self, rows: int) -> Decayed | None:
        """The measured T_t(rows) of the current load: alone, of one sequence's forwards;
        under load, of shared forwards (filed by their total rows)."""
        return (self.target_cost if self.alone else self.loaded_cost).get(rows)

    def price(self, rows: int) -> float:
        """T_t of a forward of `rows` rows under the current load, seconds (module docstring,
        "Under load"): alone, `target(rows)`; under load, the shared forwards' measured mean,
        else the single-sequence curve scaled by the ratio of the two at the nearest width
        measured under load (rows of several sequences cost more than as many rows of one:
        on a 2-core CPU, two sequences' single rows 93 ms against one sequence's two 73 ms),
        or the single-sequence curve itself before any shared forward was timed.

        Raises:
            ValueError: before T_t(1) is known.
        """
        if self.alone:
            return self.target(rows)
        cost = self.loaded_cost.get(rows)
        if cost is not None:
            return cost.mean
        if not self.loaded_cost:
            return self.target(rows)
        near = min(self.loaded_cost, key=lambda m: (abs(m - rows), m))
        return self.target(rows) * self.loaded_cost[near].mean / self.target(near)

    def draft_time(self, name: str) -> float | None:
        """T_d of drafter `name`, seconds per drafted token (None before its first draft)."""
        cost = self.draft_cost[name]
        return cost.mean if cost.weight else None

    def catchup_time(self, name: str) -> float | None:
        """Seconds per context token drafter `name` catches up (None while unknown)."""
        cost = self.catchup_cost[name]
        return cost.mean if cost.weight else None

    def verify_width(self, n: int) -> int:
        """w(n): tokens to verify n = k + 1 positions with (module docstring), >= n;
        n itself until T_t(1) is known."""
        if not self.ready:
            return n
        b = self.sequences
        base = self.price(b * n)
        best, best_t = n, base
        for m in range(n + 1, self.n_max + 1):
            cost = self._measured(b * m)
            if cost is not None and cost.mean < best_t:
                best, best_t = m, cost.mean
        return best if best_t < base * (1.0 - self.margin) else n

    def _verify_prices(self) -> list[float]:
        """[T_t(B·w(n)) for n = 2..n_max] in one pass from the widest down: the same floats
        as `price(B·verify_width(n))` for each n, at O(n_max) instead of O(n_max²) (the price
        of w(n) is the smallest measured T_t(B·m), m > n, where that beats T_t(B·n) by the
        margin, else T_t(B·n) itself)."""
        b, out = self.sequences, []
        least = math.inf                         # smallest measured T_t(B·m) among widths m > n
        for n in range(self.n_max, 1, -1):
            base = self.price(b * n)
            out.append(least if least < base and least < base * (1.0 - self.margin) else base)
            cost = self._measured(b * n)
            if cost is not None and cost.mean < least:
                least = cost.mean
        return out[::-1]

    def single_step(self) -> float:
        """T_t(1) as priced (T_t(B) under a load of B sequences): not above the line through
        T_t(2B), T_t(3B) while it rests on no more observations than either (a noisy single-token
        time must not make drafting look good). Once T_t(1) is the better measured (plain
        rounds are most rounds) it stands: capping it by two rarely measured widths made a
        noisily high T_t(3) price every draft out for good (2·T_t(2) - T_t(3) came out 12 %
        under T_t(1) on a 2-core CPU, whose curve is nearly a line).

        Raises:
            ValueError: before T_t(1) is known.
        """
        b = self.sequences
        t1 = self.price(b)
        one, two, three = (self._measured(n * b) for n in (1, 2, 3))
        if two is not None and three is not None and (one is None or one.weight <= min(two.weight, three.weight)):
            t1 = min(t1, max(2 * two.mean - three.mean, 0.25 * two.mean))
        return t1

    def curve(self, name: str) -> CostCurve | None:
        """The prices of drafting with `name` as a `CostCurve`: target_times[0] the guarded
        T_t(1) + o_0, target_times[n-1] = T_t(w(n)) + o_d for n = 2..n_max, draft_time its
        T_d (under a load of B sequences: T_t(B), T_t(B·w(n)) and B·T_d, the planner's batch
        maths with serial drafts; module docstring). None while T_t(1) or its T_d is unknown."""
        curve = self._curves.get(name)
        if curve is None:
            t_d = self.draft_time(name)
            if not self.ready or t_d is None:
                return None
            if self._prices is None:
                self._prices = (self.single_step(), self._verify_prices())
            single, widths = self._prices
            plain, drafted = self.round_overhead(None), self.round_overhead(name)
            times = [single + plain] + [seconds + drafted for seconds in widths]
            curve = self._curves[name] = CostCurve(tuple(times), self.sequences * t_d)
        return curve

    def _priced(self, drafter: str | None) -> CostCurve:
        if drafter is None:
            if len(self.draft_cost) != 1:
                raise ValueError(f"name the drafter: this model prices {sorted(self.draft_cost)}")
            drafter = next(iter(self.draft_cost))
        curve = self.curve(drafter)
        if curve is None:
            raise ValueError(f"no prices for {drafter!r} yet: T_t(1) and its T_d must be observed first")
        return curve

    def speedup(self, alpha_or_alphas: AlphaSpec, k: int, drafter: str | None = None) -> float:
        """`CostCurve.speedup` on `curve(drafter)`: S(k) = E · T_t(1) / (k · T_d + T_t(w(k+1))).

        Args:
            alpha_or_alphas: scalar α in [0, 1], or α_1..α_K with K >= k.
            k: draft length, >= 0.
            drafter: whose T_d (None: the only drafter priced).

        Raises:
            ValueError: before T_t(1) and the drafter's T_d are known, when `drafter` is
                None among several, or for arguments `theory.speedup_cost_curve` refuses.
        """
        return self._priced(drafter).speedup(alpha_or_alphas, k)

    def optimal_k(self, alpha_or_alphas: AlphaSpec, k_max: int, drafter: str | None = None) -> tuple[int, float]:
        """`CostCurve.optimal_k` on `curve(drafter)`: (k*, S(k*)) over k = 0..k_max
        (k_max <= n_max - 1). Raises as `speedup`."""
        return self._priced(drafter).optimal_k(alpha_or_alphas, k_max)

    def measured(self, draft_time: float = 0.0) -> CostCurve | None:
        """The measured T_t(1..m) as a plain `CostCurve` (m: the widths measured without a
        gap from 1), with `draft_time`; None before T_t(1) is known."""
        times = []
        while len(times) + 1 in self.target_cost:
            times.append(self.target_cost[len(times) + 1].mean)
        return CostCurve(tuple(times), draft_time) if times else None
