"""Choosing the drafter and the draft length k each round.

How many tokens are drafted never changes the output distribution (each round
is exact for any k, and k is chosen from the past only), so a policy is free to
optimise speed alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from .decoding import Policy, RoundRecord
from .drafters.base import Confidence, Drafter
from .theory import speedup_cost_curve
from .timing import time_forwards


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0 (0 = plain decoding) or 'auto', got {k!r}")


class FixedPolicy(Policy):
    """Always the same drafter and k (k = 0 or drafter None: plain decoding).

    Raises:
        ValueError: if k is negative or not an integer.
    """

    def __init__(self, drafter: Drafter | None, k: int) -> None:
        _check_k(k)
        self.drafter = drafter if k > 0 else None
        self.k = k if drafter is not None else 0

    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        return self.drafter, self.k

    def observe(self, record: RoundRecord) -> None:
        pass


class _Decayed:
    """Exponentially decayed mean: weight `decay`**age for each observation."""

    __slots__ = ("total", "weight")

    def __init__(self) -> None:
        self.total, self.weight = 0.0, 0.0

    def add(self, value: float, decay: float) -> None:
        self.total = self.total * decay + value
        self.weight = self.weight * decay + 1.0

    @property
    def mean(self) -> float:
        return self.total / self.weight


class _EvidenceTable:
    """One drafter's α as a function of its evidence (`Confidence.cell`: match length ×
    frequency bin): a decayed mean of the exact α per cell, shrunk towards the mean of
    its match-length bin, itself shrunk towards a base guess (empirical Bayes with
    pseudo-counts: each level weighs `weight` observations)."""

    __slots__ = ("cells", "lengths")

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], _Decayed] = {}
        self.lengths: dict[int, _Decayed] = {}

    def add(self, confidence: Confidence, alpha: float, decay: float) -> None:
        cell = confidence.cell
        self.cells.setdefault(cell, _Decayed()).add(alpha, decay)
        self.lengths.setdefault(cell[0], _Decayed()).add(alpha, decay)

    def estimate(self, confidence: Confidence, base: float, weight: float, floor: float = 0.0) -> float:
        """α for a drafted token with this evidence; `floor` raises the shrinkage target
        (optimistic probes), so only cells without much data of their own look good."""
        cell = confidence.cell
        row = self.lengths.get(cell[0])
        prior = base if row is None else (row.total + weight * base) / (row.weight + weight)
        prior = max(prior, floor)
        stat = self.cells.get(cell)
        return prior if stat is None else (stat.total + weight * prior) / (stat.weight + weight)


class AdaptivePolicy(Policy):
    """Choose (drafter, k) each round to maximise expected tokens per second.

    For each drafter d and k = 1..k_max the predicted speedup over plain decoding
    is (cost-curve form of Leviathan et al. 2023, Theorem 3.8):

        S_d(k) = E(α_d,1..α_d,k) · T_t(1) / (k · T_d + T_t(k+1)),
        E = Σ_{i=0..k} Π_{j≤i} α_d,j          (per-position acceptance, not i.i.d.)

    with online estimates, decayed so they follow the text:
      * α_d,i: mean of the exact Σ min(p_i, q_i) at every verified position i
        (lower variance than counting accepts), shrunk towards α_d,i-1 (and
        α_d,1 towards the drafter's own `alpha_prior`, else `alpha_prior`) with
        the weight of `prior_weight` observations, so rarely reached positions
        borrow from shallower ones;
      * T_t(n): mean verification-forward time for n = k+1 new tokens, each n
        measured on its own (unmeasured n get an optimistic guess, so they are
        tried once); T_t(1) comes from plain rounds: the first round is plain,
        and one in `refresh_every` rounds is plain to follow the growing context;
      * T_d: drafting seconds per drafted token.
    A drafter that reports its evidence per drafted token (`confidences`: the
    continuation's frequency and the match length it is conditioned on, as the
    suffix drafter does) gets α_d,i from its evidence instead of its position:
    the exact α learned per (match length, frequency) bin (`_EvidenceTable`), so
    it drafts on the rounds whose evidence has paid and skips the rest.
    T_t(k+1) above is the cheapest measured T_t(m) over m >= k+1 (`verify_width`):
    the decode loop pads the verification forward to that width.
    The best (d, k) is used if its S > 1 + margin; otherwise the round is plain
    (k = 0). After `probe_every` plain rounds in a row it probes the (drafter, k)
    that would pay if α were at least `probe_alpha`, once, so it can switch back
    when the text becomes predictable; each failed probe doubles the interval
    (up to 64 rounds) until drafting pays again. Probes are rationed: a
    drafter is probed only while the seconds lost to probes in this generation,
    plus that drafter's typical probe loss (decayed mean over past probes: its
    draft and catch-up time plus the verification time beyond the tokens it
    committed at T_t(1) each), stay within `explore_fraction` of the seconds
    spent so far, so a short answer is not slowed down by a probe of a draft
    model that has to read the whole prompt first.

    A drafter that must first read context it lacks (`catchup_tokens`: a draft
    model after the prompt or plain rounds) is charged that catch-up *before* it
    is chosen or probed: missing tokens × its seconds per caught-up token (timed
    at `calibrate`, then learned from catch-ups). It is taken only when drafting
    at the predicted speedup S (the optimistic one for a probe) for the rest of
    the budget would save more: R · T_t(1) · (1 - 1/S) > charge, R the tokens left
    (`start(max_new_tokens)`); the charge also counts against the probe ration.

    Between generations (`start`) the α estimates are not reset but kept with
    `carry` of their weight, so the previous text's acceptance is a weak prior
    for the next one; the cost curve, the catch-up costs, the probe losses and
    the evidence tables (the model pair's, not the text's; they follow drift
    through `evidence_decay`) are kept whole.

    Args:
        drafters: name -> drafter (e.g. {"model": ModelDrafter(...), "lookup": LookupDrafter()}).
        k_max: largest draft length considered, >= 1.
        decay: weight of the past per new observation, in (0, 1).
        alpha_prior: initial per-position α guess for drafters that declare none
            (weighted as `prior_weight` observations).
        prior_weight: weight of the prior (and of the previous position's α), in observations.
        probe_every: plain rounds in a row before the first probe (rounds).
        probe_alpha: the α a probe assumes when choosing its k, in [0, 1].
        explore_slope: relative cost per extra token guessed for unmeasured T_t(n).
        refresh_every: rounds between plain rounds that refresh T_t(1).
        margin: predicted speedup a choice must beat plain decoding by.
        explore_fraction: largest share of a generation's decoding seconds that
            probes may lose, in [0, 1].
        carry: weight kept by the α estimates from one generation to the next,
            in [0, 1] (0 = start each generation from `alpha_prior`).
        evidence_decay: weight of the past per new observation in an evidence
            cell, in (0, 1) (slower than `decay`: cells see few observations each).

    Raises:
        ValueError: for k_max < 1, decay outside (0, 1), or explore_fraction or
            carry outside [0, 1], or evidence_decay outside (0, 1).
    """

    def __init__(self, drafters: dict[str, Drafter], *, k_max: int = 8, decay: float = 0.9,
                 alpha_prior: float = 0.6, prior_weight: float = 3.0, margin: float = 0.03,
                 probe_every: int = 8, probe_alpha: float = 0.9, explore_slope: float = 0.1,
                 refresh_every: int = 32, explore_fraction: float = 0.1,
                 carry: float = 0.3, evidence_decay: float = 0.98) -> None:
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"k_max must be an integer >= 1, got {k_max!r}")
        for label, value in (("decay", decay), ("evidence_decay", evidence_decay)):
            if not 0 < value < 1:
                raise ValueError(f"{label} must be in (0, 1), got {value!r}")
        for label, value in (("explore_fraction", explore_fraction), ("carry", carry)):
            if not 0 <= value <= 1:
                raise ValueError(f"{label} must be in [0, 1], got {value!r}")
        self.drafters = dict(drafters)
        self.k_max, self.decay, self.margin = k_max, decay, margin
        self.alpha_prior, self.prior_weight = alpha_prior, prior_weight
        self.alpha = {name: [_Decayed() for _ in range(k_max)] for name in self.drafters}
        self.draft_cost = {name: _Decayed() for name in self.drafters}
        self.target_cost: dict[int, _Decayed] = {}
        self.probe_every = self.probe_interval = probe_every
        self.probe_alpha = probe_alpha
        self.probes = 0
        self.explore_slope, self.refresh_every = explore_slope, refresh_every
        self.plain_streak = 0
        self.rounds_since_plain = 0
        self.calibrated = False
        self.last_prediction: float = 1.0
        self.explore_fraction, self.carry = explore_fraction, carry
        self.probe_loss = {name: _Decayed() for name in self.drafters}
        self.spent = 0.0        # decoding seconds observed in this generation
        self.explored = 0.0     # of which lost to probes
        self.probing: str | None = None
        self.evidence_decay = evidence_decay
        self.evidence = {name: _EvidenceTable() for name in self.drafters}
        self.prefill_cost = {name: _Decayed() for name in self.drafters}   # s per caught-up token
        self.budget: int | None = None          # max_new_tokens of this generation
        self.prompt_length: int | None = None   # len(seq) at its first round
        self._round: tuple[str, list[Confidence] | None, int] | None = None   # what choose() drafted

    # -- estimates -----------------------------------------------------------
    def target_time(self, n: int) -> float | None:
        """Estimated seconds of a target forward over n new tokens (None before T_t(1) is known).

        Measured n: the decayed mean of its verification forwards. Unmeasured n:
        an optimistic T_t(1)·(1 + explore_slope·(n-1)), so every draft length
        that could pay is tried once and then judged on its measured cost (CPU
        matmul cost is far from linear in n: on one machine here T_t(8) < T_t(3)).
        """
        if 1 not in self.target_cost:
            return None
        cost = self.target_cost.get(n)
        if cost is not None:
            return cost.mean
        return self.target_cost[1].mean * (1.0 + self.explore_slope * (n - 1))

    def verify_width(self, n: int) -> int:
        """Tokens to verify n = k + 1 positions with: the measured width m >= n
        (up to k_max + 1) with the smallest T_t(m), if it beats T_t(n) by the
        margin; else n. Filler rows after the drafts cost nothing in exactness
        (causal attention) and, on CPUs whose GEMM kernels change with the row
        count, can make a 3-token verification as cheap as an 8-token one.

        Args:
            n: tokens the verification needs (k + 1), >= 1.

        Returns:
            The width in tokens, >= n (n itself until T_t(n) is known).
        """
        base = self.target_time(n)
        if base is None:
            return n
        best, best_t = n, base
        for m in range(n + 1, self.k_max + 2):
            cost = self.target_cost.get(m)
            if cost is not None and cost.mean < best_t:
                best, best_t = m, cost.mean
        return best if best_t < base * (1.0 - self.margin) else n

    def calibrate(self, target, context: Sequence[int], repeats: int = 3) -> dict[int, float]:
        """Time target forwards over n = 1..k_max+1 new tokens once, as the cost-curve prior.

        CPU matmul cost is far from linear in the batch size (with torch float32
        here, 8 rows cost less than 3), so measuring every n beats
        extrapolating. Leaves the target's cache holding context[:-1] (the state
        `decode` starts from). Costs about (repeats + 1) · Σ_n T_t(n) seconds.
        Drafters with a `calibrate` method (a draft model) also time reading a
        prefix of the context (work their first catch-up does anyway): the priors
        of their catch-up cost per token and of T_d.

        Args:
            target: the target `CausalLM`.
            context: prompt token ids (len >= 1).
            repeats: timed runs per n after one warm-up run; the median is kept.

        Returns:
            {n: seconds} as stored in the policy.

        Raises:
            ValueError: if `context` is empty.
        """
        import statistics

        context = list(context)
        if not context:
            raise ValueError("calibrate needs a context of at least one token")
        target.rollback_to(context)
        if len(target.tokens) < len(context) - 1:
            target.forward(context[len(target.tokens):-1], keep=1)
        base = len(target.tokens)
        filler = [context[-1]] * (self.k_max + 1)
        ns = [n for n in range(1, self.k_max + 2) if base + n <= target.context_length]
        timed = time_forwards(target, [filler[:n] for n in ns], repeats=repeats, warmup=1)
        samples = dict(zip(ns, timed))
        for n, values in samples.items():
            self.target_cost[n] = _Decayed()
            self.target_cost[n].add(statistics.median(values), self.decay)
        self.calibrate_drafters(context)
        self.calibrated = True
        return {n: self.target_cost[n].mean for n in ns}

    def calibrate_drafters(self, context: Sequence[int]) -> dict[str, tuple[float, float]]:
        """Ask each drafter with a `calibrate` method (a draft model) to time reading a
        prefix of `context`: the priors of its catch-up cost per token and of T_d.

        Returns:
            {name: (seconds per caught-up token, seconds per drafted token)} for the
            drafters that measured something.
        """
        out = {}
        for name, drafter in self.drafters.items():
            timed = drafter.calibrate(context) if hasattr(drafter, "calibrate") else None
            if timed is not None:
                self.prefill_cost[name].add(timed[0], self.decay)
                self.draft_cost[name].add(timed[1], self.decay)
                out[name] = timed
        return out

    def start(self, max_new_tokens: int | None = None) -> None:
        """A new generation of at most `max_new_tokens` tokens (None: unknown, never
        short): weaken α to `carry` of its weight and reset the probe back-off and
        budget (they belong to the text); keep the cost curve, the catch-up costs,
        the probe losses (they belong to the machine) and the evidence tables."""
        for stats in self.alpha.values():
            for stat in stats:
                stat.total *= self.carry
                stat.weight *= self.carry
        self.probe_interval, self.plain_streak = self.probe_every, 0
        self.spent = self.explored = 0.0
        self.probing = None
        self.budget, self.prompt_length, self._round = max_new_tokens, None, None

    def remaining(self, seq: Sequence[int]) -> float:
        """Tokens left in this generation's budget (inf when `start` was not told it)."""
        if self.budget is None:
            return float("inf")
        if self.prompt_length is None:
            self.prompt_length = len(seq)
        return max(0, self.budget - (len(seq) - self.prompt_length))

    def catchup_charge(self, name: str, seq: Sequence[int]) -> tuple[float, int]:
        """(seconds, tokens): the catch-up drafter `name` needs before drafting after
        `seq` (its `catchup_tokens` × its measured seconds per caught-up token; 0
        while that cost is unknown or the drafter never catches up)."""
        drafter, cost = self.drafters[name], self.prefill_cost[name]
        if not hasattr(drafter, "catchup_tokens"):
            return 0.0, 0
        missing = drafter.catchup_tokens(seq)
        return (missing * cost.mean if cost.weight else 0.0), missing

    def pays_for(self, speedup: float, charge: float, seq: Sequence[int]) -> bool:
        """Whether drafting at `speedup` for the rest of the budget saves more than
        `charge` seconds: R · T_t(1) · (1 - 1/S) > charge (R = `remaining(seq)`)."""
        if charge <= 0:
            return True
        if speedup <= 1.0:
            return False
        return self.remaining(seq) * (self.target_time(1) or 0.0) * (1.0 - 1.0 / speedup) > charge

    def may_probe(self, name: str, charge: float = 0.0) -> bool:
        """Whether a probe of drafter `name` fits the exploration budget now (its
        typical loss, or the catch-up `charge` in seconds it would pay now if larger)."""
        loss = self.probe_loss[name]
        expected = max(loss.mean if loss.weight else 0.0, charge)
        return self.explored + expected <= self.explore_fraction * self.spent

    def alphas(self, name: str, k: int, evidence: Sequence[Confidence] | None = None,
               floor: float = 0.0) -> list[float]:
        """Estimated per-position acceptance α_1..α_k of drafter `name`.

        With `evidence` (the drafter's `confidences` for this proposal, len >= k), α_i
        is learned per evidence cell (`_EvidenceTable`; base guess min(the drafter's
        `alpha_prior`, frequency_i)); otherwise per position. `floor` raises the
        estimates (per position) or the cells' shrinkage targets (evidence) to at least
        that value: optimistic probes.
        """
        base = getattr(self.drafters[name], "alpha_prior", self.alpha_prior)
        if evidence is not None:
            table, weight = self.evidence[name], self.prior_weight
            return [table.estimate(c, min(base, c.frequency), weight, floor) for c in evidence[:k]]
        out, previous = [], base
        for stat in self.alpha[name][:k]:
            previous = (stat.total + self.prior_weight * previous) / (stat.weight + self.prior_weight)
            out.append(max(previous, floor))
        return out

    def predict(self, name: str, k: int, floor: float = 0.0,
                evidence: Sequence[Confidence] | None = None) -> float:
        """Predicted speedup S of drafting k tokens with drafter `name` (1.0 for k = 0).

        S = E(α_1..α_k) · T_t(1) / (k · T_d + T_t(w)), w = `verify_width(k + 1)`
        (Leviathan et al. 2023, Theorem 3.8, with a measured cost curve in place of
        the constant cost ratio c). `floor` and `evidence`: as in `alphas`.

        Raises:
            KeyError: if `name` is not one of the policy's drafters.
        """
        if k == 0:
            return 1.0
        t1, tk = self.target_time(1), self.target_time(self.verify_width(k + 1))
        if t1 is not None and 2 in self.target_cost and 3 in self.target_cost:
            # guard against a noisy T_t(1): not above the line through T_t(2), T_t(3)
            t2, t3 = self.target_cost[2].mean, self.target_cost[3].mean
            t1 = min(t1, max(2 * t2 - t3, 0.25 * t2))
        cost = self.draft_cost[name]
        if t1 is None or tk is None or cost.weight == 0:
            return 1.0 + self.margin * 2   # no data yet: try it
        alphas = self.alphas(name, k, evidence, floor)
        # T_t(n) for n = k + 1 is the padded width's cost; T_t(1) the guarded one
        return speedup_cost_curve(alphas, k, lambda n: t1 if n == 1 else tk, cost.mean)

    # -- protocol --------------------------------------------------------------
    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        self._round = None
        remaining = self.remaining(seq)   # (fixes the prompt length at the first round)
        if 1 not in self.target_cost or self.rounds_since_plain >= self.refresh_every or remaining < 2:
            self.last_prediction = 1.0
            return None, 0                    # measure (or refresh) T_t(1) with a plain round
        offers = {}   # name -> (most tokens it can draft now, its evidence or None)
        for name, drafter in self.drafters.items():
            evidence = drafter.confidences(seq) if hasattr(drafter, "confidences") else None
            offers[name] = (min(self.k_max, drafter.available(seq)), evidence)
        best_name, best_k, best_s = None, 0, 1.0 + self.margin
        for name, (limit, evidence) in offers.items():
            charge = None
            for k in range(1, limit + 1):
                s = self.predict(name, k, evidence=evidence)
                if s > best_s:
                    if charge is None:
                        charge = self.catchup_charge(name, seq)[0]
                    if self.pays_for(s, charge, seq):
                        best_name, best_k, best_s = name, k, s
        if best_name is None:
            self.plain_streak += 1
            if self.plain_streak >= self.probe_interval and self.drafters:
                # probe the drafters in turn (those that can propose now), each with
                # the k that would pay if α were at least `probe_alpha`, so one probe
                # can reveal a good draft; if none may be probed now, ask again after
                # another interval (choose() is on every round's path: keep it cheap)
                self.plain_streak = 0
                names = list(self.drafters)
                names = names[self.probes % len(names):] + names[:self.probes % len(names)]
                for name in names:
                    limit, evidence = offers[name]
                    if limit <= 0:
                        continue
                    optimistic = [self.predict(name, k, self.probe_alpha, evidence)
                                  for k in range(1, limit + 1)]
                    k = 1 + max(range(limit), key=optimistic.__getitem__)
                    if optimistic[k - 1] <= 1.0 + self.margin:
                        continue   # would not pay even with a good draft: never worth probing
                    charge = self.catchup_charge(name, seq)[0]
                    if not self.pays_for(optimistic[k - 1], charge, seq):
                        continue   # its catch-up costs more than a good draft could save
                    if not self.may_probe(name, charge):
                        continue   # too costly for the time spent so far: later
                    self.probe_interval = min(self.probe_interval * 2, 64)
                    self.probes += 1
                    self.last_prediction = self.predict(name, k, evidence=evidence)
                    self.probing = name
                    return self._draft(name, k, evidence, seq)
            self.last_prediction = 1.0
            return None, 0
        self.plain_streak = 0
        self.probe_interval = self.probe_every   # drafting pays again: probe eagerly next time
        self.last_prediction = best_s
        return self._draft(best_name, best_k, offers[best_name][1], seq)

    def _draft(self, name: str, k: int, evidence, seq: Sequence[int]) -> tuple[Drafter, int]:
        """Remember what this round drafts (for `observe`) and return it."""
        self._round = (name, evidence, self.catchup_charge(name, seq)[1])
        return self.drafters[name], k

    def observe(self, record: RoundRecord) -> None:
        seconds = record.target_seconds + record.draft_seconds + record.catchup_seconds
        self.spent += seconds
        if self.probing is not None and record.drafter == self.probing:
            t1 = self.target_time(1) or 0.0
            loss = max(0.0, seconds - record.committed * t1)
            self.explored += loss
            self.probe_loss[record.drafter].add(loss, self.decay)
        self.probing = None
        self.target_cost.setdefault(record.width, _Decayed()).add(record.target_seconds, self.decay)
        self.rounds_since_plain = 0 if record.k == 0 else self.rounds_since_plain + 1
        chosen, self._round = self._round, None
        if record.k == 0 or record.drafter not in self.alpha:
            return
        verified = min(record.accepted + 1, record.k)
        for i in range(verified):
            self.alpha[record.drafter][i].add(float(record.alphas[i]), self.decay)
        self.draft_cost[record.drafter].add(record.draft_seconds / record.k, self.decay)
        if chosen is not None and chosen[0] == record.drafter:
            _, evidence, missing = chosen
            if evidence is not None:
                for i in range(min(verified, len(evidence))):
                    self.evidence[record.drafter].add(evidence[i], float(record.alphas[i]),
                                                      self.evidence_decay)
            if missing > 2 and record.catchup_seconds > 0:   # it fed missing - 1 tokens
                self.prefill_cost[record.drafter].add(record.catchup_seconds / (missing - 1), self.decay)


def make_policy(k: int | str, drafters: dict[str, Drafter], *, k_max: int = 8, **kwargs):
    """Build the policy for `generate(k=...)`.

    Args:
        k: an integer >= 0 (fixed; the first available drafter, model before
            lookup) or "auto" (`AdaptivePolicy`, which may also pick k = 0).
        drafters: name -> drafter; may be empty (then always plain decoding).
        k_max: largest draft length the adaptive policy considers (tokens).
        **kwargs: further `AdaptivePolicy` options (ignored for a fixed k).

    Returns:
        A `FixedPolicy` or an `AdaptivePolicy`.

    Raises:
        ValueError: naming `k` when it is neither.
    """
    if k == "auto":
        return AdaptivePolicy(drafters, k_max=k_max, **kwargs)
    _check_k(k)
    drafter = next(iter(drafters.values()), None)
    return FixedPolicy(drafter, k)
