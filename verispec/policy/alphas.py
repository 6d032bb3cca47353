"""The acceptance-rate estimates α̂_d,i the policy prices drafts with, per drafter d.

Vocabulary (as in `verispec.theory`):

* α_i - the probability that draft i is accepted given drafts 1..i-1 were; a round
  measures it exactly as Σ_x min(p_i(x), q_i(x)) at every *verified* position
  i = 1..min(n + 1, k) (n accepted), a lower-variance signal than counting accepts
  (Leviathan et al. 2023, Definition 3.1 / Corollary 3.6).
* positional estimate - one decayed mean per position i (`Decayed`), shrunk towards the
  estimate of position i-1 (and α_1 towards the drafter's `alpha_prior`) with the weight
  of `prior_weight` observations:

      α̂_i = (total_i + w · α̂_{i-1}) / (weight_i + w),   α̂_0 = alpha_prior,

  so rarely reached deep positions borrow from shallower ones (empirical Bayes with
  pseudo-counts).
* evidence estimate - for a drafter that reports its evidence per drafted token
  (`Confidence`: match length, frequency, support; the suffix drafter), α is learned per
  evidence cell (`Confidence.cell`) instead of per position: `EvidenceTable`.
* regime offset δ - what the cells miss about the text at hand: the same evidence (a
  3-token match seen once) is a good bet in a copy-heavy edit and a poor one in prose.
  Per evidence drafter, a decayed mean (at the positional `decay`) of the residuals
  α_i - α̂_cell(i) at its verified positions, shrunk towards 0 with the weight of
  `prior_weight` observations; the estimate is clip(α̂_cell + δ, 0, 1). Without it, cells
  taught by earlier prose kept a drafter from a later copy-heavy text even after its
  probes there were all accepted (`benchmarks/llamacpp-native/replay_policy.py`).

Between generations the positional means and the regime offsets keep `carry` of their
weight (the previous text is a weak prior for the next); the evidence tables are kept
whole (they describe the model pair, not the text, and follow drift through their slower
decay). A round in which a drafter does not draft relaxes its positional means and its
offset alike (`relax`).

Guard: a round whose exact α is not finite (a request with broken numerics, e.g.
temperature 1e-310) is refused whole (`AlphaEstimates.accepts`), and `Decayed` refuses
non-finite values, so no estimate here is ever NaN or infinite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..drafters.base import Confidence
from .decayed import Decayed

__all__ = ["AlphaEstimates", "EvidenceTable"]


class EvidenceTable:
    """One drafter's α as a function of its evidence (`Confidence.cell`: match length ×
    frequency bin): a decayed mean of the exact α per cell, shrunk towards the mean of
    its match-length bin, itself shrunk towards a base guess (empirical Bayes with
    pseudo-counts: each level weighs `weight` observations)."""

    __slots__ = ("cells", "lengths")

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], Decayed] = {}
        self.lengths: dict[int, Decayed] = {}

    def add(self, confidence: Confidence, alpha: float, decay: float) -> None:
        """Learn the exact `alpha` (in [0, 1]) of a token drafted with this evidence."""
        cell = confidence.cell
        self.cells.setdefault(cell, Decayed()).add(alpha, decay)
        self.lengths.setdefault(cell[0], Decayed()).add(alpha, decay)

    def estimate(self, confidence: Confidence, base: float, weight: float) -> float:
        """α for a drafted token with this evidence (in [0, 1])."""
        cell = confidence.cell
        row = self.lengths.get(cell[0])
        prior = base if row is None else (row.total + weight * base) / (row.weight + weight)
        stat = self.cells.get(cell)
        return prior if stat is None else (stat.total + weight * prior) / (stat.weight + weight)


class AlphaEstimates:
    """α̂_d,1..α̂_d,K for each drafter d: per position, or per evidence cell.

    Args:
        priors: drafter name -> its `alpha_prior` (α̂_0, in [0, 1]).
        k_max: K, the deepest position estimated (>= 1).
        decay: weight of the past per new positional observation, in (0, 1).
        evidence_decay: the same for evidence cells, in (0, 1) (slower: cells see
            few observations each).
        prior_weight: w, the weight of a prior (and of position i-1's α̂), in observations.
    """

    def __init__(self, priors: dict[str, float], k_max: int, *, decay: float, evidence_decay: float,
                 prior_weight: float) -> None:
        self.priors = dict(priors)
        self.decay, self.evidence_decay, self.prior_weight = decay, evidence_decay, prior_weight
        self.positional = {name: [Decayed() for _ in range(k_max)] for name in self.priors}
        self.evidence = {name: EvidenceTable() for name in self.priors}
        self.regime = {name: Decayed() for name in self.priors}   # δ: residuals of the cells

    @staticmethod
    def accepts(alphas: Iterable[float]) -> bool:
        """Whether a round's exact α (one per drafted position) may be learned from:
        every value finite."""
        return all(math.isfinite(a) for a in alphas)

    def estimate(self, name: str, k: int, evidence: Sequence[Confidence] | None = None,
                 floor: float = 0.0) -> list[float]:
        """α̂_1..α̂_k of drafter `name` (dimensionless, in [0, 1]).

        Args:
            name: a drafter of the policy.
            k: draft length (<= K; fewer values come back for a shorter `evidence`).
            evidence: the drafter's `confidences` for this proposal (len >= k): α̂_i from
                the evidence table (base guess min(alpha_prior, frequency_i)) plus the
                regime offset δ, clipped to [0, 1]; None: per position.
            floor: raise each estimate to at least this: an optimistic probe.

        Raises:
            KeyError: if `name` is not one of the drafters.
        """
        base = self.priors[name]
        if evidence is not None:
            cells = self._cells(name, evidence[:k])
            offset = self.offset(name)
            return [max(min(max(a + offset, 0.0), 1.0), floor) for a in cells]
        out, previous = [], base
        for stat in self.positional[name][:k]:
            previous = (stat.total + self.prior_weight * previous) / (stat.weight + self.prior_weight)
            out.append(max(previous, floor))
        return out

    def _cells(self, name: str, evidence: Sequence[Confidence]) -> list[float]:
        """α̂_cell of each drafted token's evidence (no offset, no floor)."""
        table, base = self.evidence[name], self.priors[name]
        return [table.estimate(c, min(base, c.frequency), self.prior_weight) for c in evidence]

    def offset(self, name: str) -> float:
        """δ of drafter `name`: its residuals' decayed mean shrunk towards 0 (0 before any)."""
        regime = self.regime[name]
        return regime.total / (regime.weight + self.prior_weight)

    def observe(self, name: str, alphas: Sequence[float], verified: int,
                evidence: Sequence[Confidence] | None = None) -> bool:
        """Learn one round of drafter `name`.

        Args:
            alphas: [k] exact α at each drafted position.
            verified: positions the target judged, min(accepted + 1, k): later drafts
                were never compared, their α says nothing about this round's reach.
            evidence: the `confidences` the round was chosen on (None: none reported).

        Returns:
            False (nothing learned) when an α is not finite; else True.
        """
        if not self.accepts(alphas):
            return False
        # Σ min(p, q) of float32 distributions can exceed 1 by a rounding error
        alphas = [min(max(a, 0.0), 1.0) for a in alphas]
        for i in range(verified):
            self.positional[name][i].add(alphas[i], self.decay)
        if evidence is not None:
            n = min(verified, len(evidence))
            for i, predicted in enumerate(self._cells(name, evidence[:n])):
                self.regime[name].add(alphas[i] - predicted, self.decay)
                self.evidence[name].add(evidence[i], alphas[i], self.evidence_decay)
        return True

    def relax(self, name: str, factor: float) -> None:
        """Drafter `name` went a round without drafting: its positional means keep `factor`
        (in [0, 1]) of their weight, so α̂ drifts back towards its prior (a decaying prior:
        one early rejection is not a verdict for the rest of the text; the drafter is
        re-tried once the evidence against it has faded); its regime offset fades alike."""
        for stat in self.positional[name]:
            stat.scale(factor)
        self.regime[name].scale(factor)

    def carry_over(self, carry: float) -> None:
        """A new generation: the positional means and the regime offsets keep `carry` (in
        [0, 1]) of their weight."""
        for stats in self.positional.values():
            for stat in stats:
                stat.scale(carry)
        for regime in self.regime.values():
            regime.scale(carry)
