"""The adaptive policy: each round, the drafter d and draft length k expected to be fastest.

Decision rule (per round, from the past only, so the output distribution never depends
on it: every round is exact for any k). For each drafter d and k = 1..min(k_max, what d
can draft now) the predicted speedup over plain decoding is

    S_d(k) = E(α̂_d,1..α̂_d,k) · T_t(1) / (k · T_d + T_t(w(k + 1))),
    E = Σ_{i=0..k} Π_{j≤i} α̂_d,j                      (per-position, not i.i.d.)

(Leviathan et al. 2023, Theorem 3.8, with a measured cost curve in place of the constant
cost ratio c; `theory.CostCurve.speedup` on the prices of `costs.OnlineCostCurve`; the
α̂ from `alphas.AlphaEstimates`; w the padded verification width). Then:

* plain (k = 0) on the first round and once every `refresh_every` drafted rounds, to
  measure T_t(1) as the context grows, and when fewer than 2 tokens of budget are left;
* else the best (d, k) if its S > 1 + margin and its catch-up pays (`budget.Budget`);
* else, after `probe_every` plain rounds in a row, a *probe*: the drafters in turn, each
  with the shortest k whose S would beat 1 + margin were α̂ at least `probe_alpha`, if
  its catch-up would pay and it fits the exploration ration. Each probe doubles the
  interval to the next (up to 64 rounds) until drafting pays again. (A probe is for
  learning α: a long one, k = 3..8, lost 1.5..3.5 plain steps when rejected where each
  verified row costs half a step, as on a 2-core CPU, on texts where nothing pays.)
  Never under load (`OnlineCostCurve.set_load`, B > 1 sequences sharing the forward):
  a probe's drafts and rows hold up every sequence in the forward, while what it learns
  serves one request; there the policy drafts only on the α̂ it has (a batching server
  drafting with probes under 2 clients ran 20-30 % below --k 0, `benchmarks/serve/`).

Two corrections keep `auto` from losing what a single drafter wins:

* a decaying prior: every round a drafter does not draft, its positional α̂ (and the
  regime offset of an evidence drafter) and its round overhead keep `relax` of their
  weight (`AlphaEstimates.relax`, `OnlineCostCurve.relax`), so after an early rejection
  or one slow round the drafter drifts back towards its prior and is tried again (it is
  not written off for the rest of the text);
* measured goodput (with a `clock`; `make_policy` gives it the wall clock): each round's
  wall time from `choose` to `observe`, less its timed forwards and its catch-up, is the
  round overhead the curve adds to its prices (`OnlineCostCurve.observe_overhead`: o_0
  for plain rounds, o_d per drafter), so a drafter whose rounds carry costs its T_d and
  T_t miss (bookkeeping, warping k + 1 rows) is priced at what its rounds really take,
  and loses to one whose acceptance turns into tokens per second. Acceptance itself is
  the α̂'s job, not counted twice.

A round teaches the estimates only if all its measurements are finite (a request with
broken numerics must not change how later requests are drafted): see `observe`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..decoding import Policy, RoundRecord
from ..drafters.base import Confidence, Drafter, SupportsCatchup, SupportsConfidences
from ..models.base import CausalLM
from ..theory import CostCurve
from ..timing import Clock
from .alphas import AlphaEstimates
from .budget import Budget
from .calibration import time_drafters, time_target
from .costs import OnlineCostCurve

__all__ = ["AdaptivePolicy", "check_k_max"]

Offer = tuple[int, "list[Confidence] | None"]   # (most tokens a drafter can draft now, its evidence)


def check_k_max(k_max) -> None:
    """Raise ValueError naming `k_max` unless it is an integer >= 1."""
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise ValueError(f"k_max must be an integer >= 1, got {k_max!r}")


class AdaptivePolicy(Policy):
    """Choose (drafter, k) each round to maximise expected tokens per second (module docstring).

    State, one room each: `estimates` (α̂ per position or evidence cell, `AlphaEstimates`),
    `costs` (T_t(n), T_d, catch-up, `OnlineCostCurve`), `budget` (tokens left, the probe
    ration, `Budget`); here only the schedule: plain streak, probe interval, refresh.

    Between generations (`start`) the α̂ keep `carry` of their weight (the previous text
    is a weak prior for the next); the cost curve, catch-up costs, probe losses and
    evidence tables are kept whole (they belong to the machine and the model pair).

    Args:
        drafters: name -> drafter (e.g. {"model": ModelDrafter(...), "lookup": LookupDrafter()}).
        k_max: largest draft length considered, >= 1.
        decay: weight of the past per new observation, in (0, 1).
        alpha_prior: initial per-position α guess for drafters that declare none
            (weighted as `prior_weight` observations).
        prior_weight: weight of the prior (and of the previous position's α), in observations.
        probe_every: plain rounds in a row before the first probe (rounds).
        probe_alpha: the α a probe assumes when judging whether, and with which k, it
            would pay, in [0, 1].
        explore_slope: relative cost per extra token guessed for unmeasured T_t(n).
        refresh_every: drafted rounds between plain rounds that refresh T_t(1).
        margin: predicted speedup a choice must beat plain decoding by.
        explore_fraction: largest share of a generation's decoding seconds that
            probes may lose, in [0, 1].
        carry: weight kept by the α estimates from one generation to the next,
            in [0, 1] (0 = start each generation from `alpha_prior`).
        evidence_decay: weight of the past per new observation in an evidence
            cell, in (0, 1) (slower than `decay`: cells see few observations each).
        relax: weight a drafter's positional α̂ keep per round it does not draft,
            in [0, 1] (1 = never forget a rejection).
        clock: seconds (e.g. `time.perf_counter`) to measure each round's wall time for
            the round overhead; None: no overhead (prices from the timed forwards alone).

    Raises:
        ValueError: for k_max < 1, decay outside (0, 1), or explore_fraction,
            carry or relax outside [0, 1], or evidence_decay outside (0, 1).
    """

    def __init__(self, drafters: dict[str, Drafter], *, k_max: int = 8, decay: float = 0.9,
                 alpha_prior: float = 0.6, prior_weight: float = 3.0, margin: float = 0.03,
                 probe_every: int = 8, probe_alpha: float = 0.9, explore_slope: float = 0.1,
                 refresh_every: int = 32, explore_fraction: float = 0.1,
                 carry: float = 0.3, evidence_decay: float = 0.98, relax: float = 0.97,
                 clock: Clock | None = None) -> None:
        check_k_max(k_max)
        for label, value in (("decay", decay), ("evidence_decay", evidence_decay)):
            if not 0 < value < 1:
                raise ValueError(f"{label} must be in (0, 1), got {value!r}")
        for label, value in (("explore_fraction", explore_fraction), ("carry", carry), ("relax", relax)):
            if not 0 <= value <= 1:
                raise ValueError(f"{label} must be in [0, 1], got {value!r}")
        self.drafters = dict(drafters)
        self.k_max, self.margin, self.carry, self.relax = k_max, margin, carry, relax
        self.prior_weight, self.decay = prior_weight, decay
        self.clock, self._started = clock, None
        self.probe_every, self.probe_alpha, self.refresh_every = probe_every, probe_alpha, refresh_every
        priors = {name: getattr(d, "alpha_prior", alpha_prior) for name, d in self.drafters.items()}
        self.estimates = AlphaEstimates(priors, k_max, decay=decay, evidence_decay=evidence_decay,
                                        prior_weight=prior_weight)
        self.costs = OnlineCostCurve(self.drafters, k_max + 1, decay=decay, explore_slope=explore_slope,
                                     margin=margin, prior_weight=prior_weight)
        self.budget = Budget(self.drafters, explore_fraction=explore_fraction, decay=decay)
        # the optional parts each drafter has (asked once: a runtime Protocol check is slow)
        self.evidence_of = {name for name, d in self.drafters.items() if isinstance(d, SupportsConfidences)}
        self.catching_up = {name for name, d in self.drafters.items() if isinstance(d, SupportsCatchup)}
        self.calibrated = False
        self.probes = 0                      # probes so far (whose turn is next)
        self.probe_interval = probe_every    # plain rounds in a row before the next probe
        self.plain_streak = 0
        self.rounds_since_plain = 0
        self.probing: str | None = None      # the drafter this round probes
        # (name, evidence, catch-up tokens missing) of the round `choose` drafted
        self._round: tuple[str, list[Confidence] | None, int] | None = None

    # -- generations and calibration -----------------------------------------------------
    def start(self, max_new_tokens: int | None = None) -> None:
        """A new generation of at most `max_new_tokens` tokens (None: unknown, never short):
        α̂ keep `carry` of their weight; the probe back-off and the budget start afresh."""
        self.estimates.carry_over(self.carry)
        self.budget.start(max_new_tokens)
        self.probe_interval, self.plain_streak = self.probe_every, 0
        self.probing, self._round = None, None

    def calibrate(self, target: CausalLM, context: Sequence[int], repeats: int = 3, *,
                  clock: Clock = time.perf_counter) -> dict[int, float]:
        """Time T_t(n), n = 1..k_max+1, and the drafters that can time themselves, as the
        cost model's prior (`calibration.time_target`, `calibrate_drafters`).

        Returns:
            {n: seconds} as stored.

        Raises:
            ValueError: if `context` is empty.
        """
        timed = time_target(target, context, self.k_max + 1, repeats=repeats, clock=clock)
        for n, seconds in timed.items():
            self.costs.reset_target(n, seconds)
        self.calibrate_drafters(context)
        self.calibrated = True
        return {n: self.costs.target(n) for n in timed}

    def seed_costs(self, curve: CostCurve, drafter: str | None = None) -> None:
        """Take a cost curve measured elsewhere (`verispec.cost.measure_cost_curve`, an
        analysis, a planner's prediction) as the prior instead of calibrating: T_t(n) for
        its n <= k_max + 1, and its T_d for `drafter` (None: T_t only).

        Raises:
            KeyError: if `drafter` is not one of the policy's drafters.
        """
        for n, seconds in enumerate(curve.target_times[:self.k_max + 1], start=1):
            self.costs.reset_target(n, seconds)
        if drafter is not None:
            if drafter not in self.drafters:
                raise KeyError(f"drafter {drafter!r} is not one of the policy's {sorted(self.drafters)}")
            self.costs.observe_draft(drafter, curve.draft_time)
        self.calibrated = True

    def calibrate_drafters(self, context: Sequence[int]) -> dict[str, tuple[float, float]]:
        """Priors of each self-timing drafter's catch-up cost and T_d (`time_drafters`).

        Returns:
            {name: (seconds per caught-up token, seconds per drafted token)}.
        """
        timed = time_drafters(self.drafters, context)
        for name, (catchup, draft) in timed.items():
            self.costs.observe_catchup(name, catchup)
            self.costs.observe_draft(name, draft)
        return timed

    # -- prices --------------------------------------------------------------------------
    def verify_width(self, n: int) -> int:
        """Tokens to verify n = k + 1 positions with (`OnlineCostCurve.verify_width`), >= n."""
        return self.costs.verify_width(n)

    def alphas(self, name: str, k: int, evidence: Sequence[Confidence] | None = None,
               floor: float = 0.0) -> list[float]:
        """α̂_1..α̂_k of drafter `name` (`AlphaEstimates.estimate`)."""
        return self.estimates.estimate(name, k, evidence, floor)

    def predict(self, name: str, k: int, floor: float = 0.0,
                evidence: Sequence[Confidence] | None = None) -> float:
        """Predicted speedup S of drafting k tokens with drafter `name` (1.0 for k = 0;
        1 + 2·margin, "try it", before its costs are known), on the curve with the round
        overheads (`OnlineCostCurve.curve`). `floor`, `evidence`: as in `alphas`.

        Raises:
            KeyError: if `name` is not one of the policy's drafters.
        """
        if k == 0:
            return 1.0
        curve = self.costs.curve(name)
        if curve is None:
            return 1.0 + self.margin * 2
        return curve.speedup(self.alphas(name, k, evidence, floor), k)

    def predictions(self, name: str, limit: int, floor: float = 0.0,
                    evidence: Sequence[Confidence] | None = None) -> list[float]:
        """[S(1), ..., S(limit)]: `predict` for every k up to `limit` in one pass
        (`CostCurve.speedups`: the same floats; `choose` prices every k of every drafter
        each round, and k calls cost k times as much Python as one). Shorter where
        `evidence` covers fewer than `limit` tokens (no α̂ to price the rest by).

        Raises:
            KeyError: if `name` is not one of the policy's drafters.
        """
        curve = self.costs.curve(name)
        if curve is None:
            return [1.0 + self.margin * 2] * limit
        return curve.speedups(self.alphas(name, limit, evidence, floor))

    def catchup_charge(self, name: str, seq: Sequence[int]) -> tuple[float, int]:
        """(seconds, tokens) of the catch-up drafter `name` needs before drafting after
        `seq`: its `catchup_tokens` × its seconds per token, × B under a load of B sequences
        (every other sequence waits for it; `costs`). While the seconds per token are
        unknown: 0 s alone (try it), and under load 0 s for at most 2 missing tokens (a
        draft step's worth), else infinite (every sequence would wait for a catch-up nobody
        has timed: a draft model's first draft read a 700-token prompt while the other
        request waited, `benchmarks/serve/README.md`)."""
        if name not in self.catching_up:
            return 0.0, 0
        missing = self.drafters[name].catchup_tokens(seq)
        per_token = self.costs.catchup_time(name)
        if per_token is None:
            return (math.inf if self.costs.sequences > 1 and missing > 2 else 0.0), missing
        return missing * per_token * self.costs.sequences, missing

    def pays_for(self, speedup: float, charge: float, seq: Sequence[int]) -> bool:
        """Whether drafting at `speedup` for the rest of the budget pays `charge` seconds
        (`Budget.pays_for` at the measured T_t(1))."""
        t1 = self.costs.target(1) if self.costs.ready else 0.0
        return self.budget.pays_for(speedup, charge, seq, t1)

    # -- the schedule --------------------------------------------------------------------
    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        self._round = None
        self._started = self.clock() if self.clock is not None else None
        remaining = self.budget.remaining(seq)   # (fixes the prompt length at the first round)
        if not self.costs.ready or self.rounds_since_plain >= self.refresh_every or remaining < 2:
            return None, 0                        # measure (or refresh) T_t(1) with a plain round
        offers = self._offers(seq)
        best = self._best(offers, seq)
        if best is not None:
            self.plain_streak = 0
            self.probe_interval = self.probe_every   # drafting pays again: probe eagerly next time
            return self._draft(*best, offers, seq)
        self.plain_streak += 1
        if self.plain_streak < self.probe_interval or not self.drafters or self.costs.sequences > 1:
            return None, 0                        # no probe under load: all B sequences would wait
        self.plain_streak = 0   # probe now, or (none may be probed) ask again after another interval
        probe = self._probe(offers, seq)
        if probe is None:
            return None, 0
        self.probe_interval = min(self.probe_interval * 2, 64)
        self.probes += 1
        self.probing = probe[0]
        return self._draft(*probe, offers, seq)

    def _offers(self, seq: Sequence[int]) -> dict[str, Offer]:
        """Per drafter: the most tokens it can draft now (<= k_max), and its evidence."""
        offers = {}
        for name, drafter in self.drafters.items():
            evidence = drafter.confidences(seq) if name in self.evidence_of else None
            offers[name] = (min(self.k_max, drafter.available(seq)), evidence)
        return offers

    def _best(self, offers: dict[str, Offer], seq: Sequence[int]) -> tuple[str, int] | None:
        """The (drafter, k) with the largest predicted S above 1 + margin whose catch-up pays."""
        best, best_s = None, 1.0 + self.margin
        for name, (limit, evidence) in offers.items():
            charge = None        # computed once, when some k of this drafter first wins
            for k, s in enumerate(self.predictions(name, limit, evidence=evidence), start=1):
                if s <= best_s:
                    continue
                charge = self.catchup_charge(name, seq)[0] if charge is None else charge
                if self.pays_for(s, charge, seq):
                    best, best_s = (name, k), s
        return best

    def _probe(self, offers: dict[str, Offer], seq: Sequence[int]) -> tuple[str, int] | None:
        """The next drafter in turn worth probing, with the shortest k that would pay if
        its α̂ were at least `probe_alpha`; None when none is worth it or fits the ration."""
        names = list(self.drafters)
        turn = self.probes % len(names)
        for name in names[turn:] + names[:turn]:
            limit, evidence = offers[name]
            if limit <= 0:
                continue
            optimistic = self.predictions(name, limit, self.probe_alpha, evidence)
            if not optimistic:
                continue
            best = 1 + max(range(len(optimistic)), key=optimistic.__getitem__)
            k = next(j for j in range(1, best + 1) if optimistic[j - 1] > 1.0 + self.margin or j == best)
            if self._worth_probing(name, optimistic[k - 1], seq):
                return name, k
        return None

    def _worth_probing(self, name: str, optimistic: float, seq: Sequence[int]) -> bool:
        """A probe at optimistic speedup S pays if good (S > 1 + margin), its catch-up
        would pay at that S, and it fits the exploration ration now."""
        if optimistic <= 1.0 + self.margin:
            return False     # would not pay even with a good draft: never worth probing
        charge = self.catchup_charge(name, seq)[0]
        return self.pays_for(optimistic, charge, seq) and self.budget.may_probe(name, charge)

    def _draft(self, name: str, k: int, offers: dict[str, Offer], seq: Sequence[int]) -> tuple[Drafter, int]:
        """Remember what this round drafts (for `observe`) and return it."""
        self._round = (name, offers[name][1], self.catchup_charge(name, seq)[1])
        return self.drafters[name], k

    # -- learning ------------------------------------------------------------------------
    def _wall(self, record: RoundRecord) -> float | None:
        """Wall seconds since `choose`, catch-up and the wait for other sequences (batched
        mode) excluded; None without a clock or > 0 value."""
        started, self._started = self._started, None
        if started is None or self.clock is None:
            return None
        wall = self.clock() - started - record.catchup_seconds - record.waited_seconds
        return wall if wall > 0 and math.isfinite(wall) else None

    def observe(self, record: RoundRecord) -> None:
        """Learn from the round just finished: its time (spent, probe loss), T_t(width),
        and for a drafted round α̂ (exact α at the verified positions), T_d and catch-up.

        A round with a non-finite α or timing, or a negative timing, teaches nothing
        (`AlphaEstimates.accepts`, `OnlineCostCurve.accepts`): no estimate is ever NaN.
        """
        chosen, self._round = self._round, None
        probing, self.probing = self.probing, None
        alphas = [float(a) for a in record.alphas]
        if not (self.estimates.accepts(alphas) and self.costs.accepts(
                record.target_seconds, record.draft_seconds, record.catchup_seconds)):
            return
        seconds = record.target_seconds + record.draft_seconds + record.catchup_seconds
        self.budget.spend(seconds)
        if probing is not None and record.drafter == probing:
            t1 = self.costs.target(1) if self.costs.ready else 0.0
            self.budget.lose(probing, max(0.0, seconds - record.committed * t1))
        self.costs.observe_target(record.width, record.target_seconds)
        self.rounds_since_plain = 0 if record.k == 0 else self.rounds_since_plain + 1
        wall = self._wall(record)
        if wall is not None and (record.k == 0 or record.drafter in self.drafters):
            self.costs.observe_overhead(record.drafter if record.k else None,
                                        max(0.0, wall - record.target_seconds - record.draft_seconds))
        for name in self.drafters:
            if name != record.drafter or record.k == 0:
                self.estimates.relax(name, self.relax)
                self.costs.relax(name, self.relax)
        if record.k == 0 or record.drafter not in self.drafters:
            return
        mine = chosen is not None and chosen[0] == record.drafter   # drafted as `choose` said
        verified = min(record.accepted + 1, record.k)
        self.estimates.observe(record.drafter, alphas, verified, chosen[1] if mine else None)
        self.costs.observe_draft(record.drafter, record.draft_seconds / record.k)
        missing = chosen[2] if mine else 0
        if missing > 2 and record.catchup_seconds > 0:   # it fed missing - 1 tokens
            self.costs.observe_catchup(record.drafter, record.catchup_seconds / (missing - 1))
