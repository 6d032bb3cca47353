"""Exact enumeration by replay: every execution path of the shipped decode loop, weighed.

The *shipped* `verispec.decoding.decode` loop is run over and over with a scripted
`Randomness` (`Enumerator`) that, instead of drawing, follows a prefix of choices
and extends it depth-first (odometer style), so every execution path is visited
once and its probability is the product of its branch weights (float64):

* ``categorical(probs)`` branches over every token with ``probs[t] > 0``, weight
  ``probs[t]``. Position and stream keys are ignored: every categorical draw is an
  *independent* branch point. For the coupled `gumbel` rule with a draft model,
  which at run time draws x_i and y_i with the same Gumbel noise, the enumeration
  therefore covers the independent coupling of x_i ~ q_i and y_i ~ p_i instead.
  That is exact too (the emitted token is y_i whatever x_i is, and y_i ~ p_i), so
  a pass certifies the rule's logic but not the shared-noise coupling itself (the
  statistical audit covers that). With a point-mass drafter (q = δ_x, no draft
  draws) the two coincide. For the same reason a bug in the keys themselves (two
  positions drawing with one key, so sharing noise) is invisible here; the seeded
  reproducibility tests and the statistical audit are what catch it.
* ``uniform(k)`` branches over the k + 1 acceptance patterns "first rejection at
  j" (j = k: all accepted). Its weight is not known when the uniforms are drawn;
  it is resolved from the `RoundRecord` the observer receives at the end of the
  round: with r_i = min(1, p_i(x_i) / q_i(x_i)), the probability that x_i is
  accepted once x_1..x_{i-1} were (Leviathan et al. 2023, §2.3; not α, which is
  its expectation Σ min(p, q)), ``weight(j) = Π_{i<j} r_i · (1 − r_j)``
  (``Π_{i<k} r_i`` for j = k), or from the rule's own ``acceptance_probs(p, q, x)``
  when it has one. The first visit of a uniform draw is a *probe* (its round is
  run once to read p_i(x_i), q_i(x_i), then discarded). Afterwards each pattern j is replayed with representative
  uniforms: by default ("boundary") u_i is the largest float32 below r_i for
  i < j and the smallest float32 above r_j at j (so the acceptance region is
  pinned to [0, r_i) up to float32 resolution); "extreme" uses the textbook 0 / 1.
  For every pattern with positive weight the realised accepted count must equal j,
  otherwise `AuditError` is raised: this is what catches a broken acceptance rule
  (wrong threshold, no stop at the first rejection, ...). Rules that declare
  ``uses_uniforms = False`` (the coupled rule) draw none and are enumerated
  through their categorical draws alone.
* Zero-weight branches are pruned.
* Collapsed drafts: when a round's categorical draws are exactly its k drafts (a
  `ModelDrafter` under a uniform rule), the pattern "first rejection at j" is
  enumerated under one value of x_{j+2..k} only, with weight 1 (later drafts
  cannot change the outcome and their probabilities sum to 1); each draft's
  branch weight is checked against the q the drafter reported.

Paths that reach the same state at a round boundary (same committed tokens; for
policies other than `FixedPolicy` also the same (k, accepted) history, or the
policy's own ``audit_state()``) are merged (``memo=True``): the replay stops there
and the rest of the tree is reused, so the result is a Markov chain over
round-boundary states, expanded once at the end. ``memo=False`` replays every path
to its end and gives the same result, only slower. Every distinct state is still
produced by the real loop at least once.

`verispec.audit.exact.exact_distribution` drives it; this module only knows the
loop's hooks (``rng``, ``rule``, ``observer``, ``on_commit``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable

import numpy as np
import torch

from ..decoding import RoundRecord
from ..verify import Rule, alpha, standard

__all__ = ["AuditError", "Distribution", "Enumerator"]

#: {new-token tuple: probability}: an output distribution of n new tokens.
Distribution = dict[tuple[int, ...], float]


class AuditError(AssertionError):
    """The decode loop behaved in a way no exact sampler can (or not deterministically)."""


class _Restart(BaseException):
    """Abort a replay and run the same path again (after a probe)."""


class _Merged(BaseException):
    """Abort a replay: it reached a state whose subtree is already known."""


class _Pruned(BaseException):
    """Abort a replay: nothing under the last uniform draw is left to enumerate."""


class _Node:
    __slots__ = ("kind", "options", "weights", "pos", "size", "alphas", "drafts")

    def __init__(self, kind: str, options: list[int] | None, weights: list[float] | None,
                 size: int) -> None:
        self.kind = kind            # "cat" or "unif"
        self.options = options      # token ids, or acceptance patterns j
        self.weights = weights
        self.pos = 0
        self.size = size            # len(probs) for "cat", k for "unif"
        self.alphas: list[float] | None = None
        self.drafts: int | None = None   # "unif": stack index of x_1's node, if identified


def _below(a: float) -> float:
    """Largest float32 strictly below a (>= 0): a uniform that must be accepted."""
    if a <= 0:
        return 0.0
    f = np.float32(min(a, 1.0))
    if float(f) >= a or float(f) >= 1.0:
        f = np.nextafter(f, np.float32(0))
    return float(f)


def _above(a: float) -> float:
    """Smallest float32 strictly above a (<= 1): a uniform that must be rejected."""
    f = np.float32(a)
    if float(f) <= a:
        f = np.nextafter(f, np.float32(2))
    return min(float(f), 1.0)


def _record_alphas(record: RoundRecord) -> tuple[list[float], list[float]]:
    """(r_i, 1 − r_i) from a round's p_i(x_i), q_i(x_i), for the shipped rule u·q < p
    (r_i = min(1, p_i(x_i) / q_i(x_i)), P(accept x_i))."""
    px, qx = record.px, record.qx
    # min(p_i(x_i), q_i(x_i)) per position (the one-token case of `alpha`)
    mins = alpha(px[:, None], qx[:, None]).tolist()
    acc, rej = [], []
    for p_i, q_i, m_i in zip(px.tolist(), qx.tolist(), mins):
        if q_i > 0:
            acc.append(min(1.0, m_i / q_i))
            rej.append(max(0.0, (q_i - m_i) / q_i))
        else:                       # u * 0 < p: accepted iff p > 0, whatever u is
            acc.append(1.0 if p_i > 0 else 0.0)
            rej.append(0.0 if p_i > 0 else 1.0)
    return acc, rej


class Enumerator:
    """Depth-first replay enumeration of one decode configuration (see the module doc).

    It is the `Randomness` the replayed decode draws from (``categorical``,
    ``uniform``), and it provides the loop's ``rule`` (the audited rule, wrapped to
    record what it was called with), ``observer`` and ``on_commit`` hooks.

    Args:
        rule: the `verispec.verify.Rule` decode runs. Acceptance-pattern weights come
            from its ``acceptance_probs(p, q, x)`` when it has one (P(accept x_i)
            given x_1..x_{i-1} accepted, accepting iff u_i is below it), except for
            the shipped standard rule, whose weights are computed from the round's
            p_i(x_i), q_i(x_i) as min(1, p/q); without ``acceptance_probs`` the rule
            is audited against min(1, p/q). ``rule.uses_uniforms = False``: no
            uniform draws are expected.
        memo: merge paths at identical round-boundary states.
        representatives: "boundary" or "extreme" uniforms per acceptance pattern.
        max_paths: the most replays before giving up.
        collapse: collapse drafts after the first rejection (module doc).

    Raises:
        ValueError: for an unknown `representatives`.
    """

    def __init__(self, rule: Rule, *, memo: bool = True, representatives: str = "boundary",
                 max_paths: int = 2_000_000, collapse: bool = True) -> None:
        if representatives not in ("boundary", "extreme"):
            raise ValueError(f"representatives must be 'boundary' or 'extreme', got {representatives!r}")
        # None: weights from the RoundRecord (the shipped rule, min(1, p/q))
        self.alphas_fn = getattr(rule, "acceptance_probs", None) if rule is not standard else None
        self.uniforms = rule.uses_uniforms  # does the rule draw uniforms in drafting rounds?
        self.rule_name = rule.name
        self.rule = self._capture(rule)
        self.state_key: Callable[[], Hashable] = lambda: None
        self.memo = memo
        self.collapse = collapse
        self.boundary = representatives == "boundary"
        self.max_paths = max_paths
        self.stack: list[_Node] = []
        self.replays = 0
        self.probes = 0
        self.merges = 0
        self.leaves: defaultdict[tuple[int, ...], float] = defaultdict(float)
        # memo: a Markov chain over round-boundary states
        self.trans: dict[Hashable, defaultdict[Hashable, float]] = {}
        self.outs: dict[Hashable, tuple[int, ...]] = {}
        self.terminal: set[Hashable] = set()
        self.complete: set[Hashable] = set()
        self.open: list[tuple[Hashable, int]] = []   # (key, depth) of ancestor boundaries
        self.open_depth: dict[Hashable, int] = {}
        self.dtype: torch.dtype | None = None
        self.captured: tuple | None = None

    # -- the scripted Randomness ----------------------------------------------------------
    def categorical(self, probs: torch.Tensor, position: int = 0, stream: str = "sample") -> int:
        """The token this replay's path takes at this draw (a branch over probs > 0;
        `position` and `stream` are ignored: every draw is an independent branch)."""
        d = self.cursor
        if d < len(self.stack):
            node = self.stack[d]
            tok = node.options[node.pos] if node.kind == "cat" else -1
            if (node.kind != "cat" or node.size != probs.shape[-1]
                    or float(probs[tok]) != node.weights[node.pos]):
                raise AuditError("replay is not deterministic: a categorical draw changed between "
                                 "replays of the same path (models or policy must be deterministic)")
        else:
            values = probs.tolist()
            options = [t for t, v in enumerate(values) if v > 0]
            if not options:
                raise AuditError("categorical draw from a distribution with no positive entry")
            node = _Node("cat", options, [values[t] for t in options], len(values))
            self.stack.append(node)
            tok = options[0]
        self.path_w.append(node.weights[node.pos])
        self.cursor = d + 1
        return tok

    def uniform(self, n: int, position: int = 0) -> torch.Tensor:
        """[n] float32 representative uniforms for this path's acceptance pattern
        (zeros on a probe, whose weights the round's observer resolves)."""
        if n == 0:
            return torch.zeros(0)
        d = self.cursor
        if d < len(self.stack):
            node = self.stack[d]
            if node.kind != "unif" or node.size != n:
                raise AuditError("replay is not deterministic: the uniform draw changed between "
                                 "replays of the same path")
        else:
            node = _Node("unif", None, None, n)
            # the round's categorical draws so far are the k drafts x_1..x_k (ModelDrafter)
            rs = self.round_start
            if self.collapse and d - rs == n and all(v.kind == "cat" for v in self.stack[rs:d]):
                node.drafts = rs
            self.stack.append(node)
        self.cursor = d + 1
        self.pending = node
        self.pending_depth = d
        if node.options is None:            # probe: run the round once to read p(x), q(x)
            self.path_w.append(float("nan"))
            return torch.zeros(n)
        j = node.options[node.pos]
        self.path_w.append(node.weights[node.pos])
        if node.drafts is not None:         # drafts after the rejected one: weight 1 (collapsed)
            for i in range(node.drafts + j + 1, node.drafts + n):
                self.path_w[i] = 1.0
        a = node.alphas
        if self.boundary:
            u = [_below(a[i]) for i in range(j)] + ([_above(a[j])] if j < n else [])
        else:
            u = [0.0] * j + ([1.0] if j < n else [])
        u += [0.0] * (n - len(u))          # after the first rejection: most acceptable value
        return torch.tensor(u, dtype=torch.float32)

    # -- decode hooks ----------------------------------------------------------------------
    def _capture(self, rule: Rule) -> Rule:
        """`rule`, recording the (p, q, x) of each call for `alphas_fn`."""
        enum = self

        class Captured:
            name, draft_stream, uses_uniforms = rule.name, rule.draft_stream, rule.uses_uniforms

            def __call__(self, p, q, x, rng, position):
                enum.captured = (p, q, x)
                return rule(p, q, x, rng, position)

        return Captured()

    def observer(self, record: RoundRecord) -> None:
        """End of a round: resolve a probe's pattern weights, or check that the
        realised accepted count is the pattern this path replays."""
        self.history.append((record.k, record.accepted))
        node, depth, self.pending = self.pending, self.pending_depth, None
        captured, self.captured = self.captured, None
        if record.k == 0 or not self.uniforms:
            if node is not None:
                raise AuditError("a uniform draw was made in a round that drafted nothing"
                                 if record.k == 0 else
                                 f"rule {self.rule_name!r} declares uses_uniforms=False but drew uniforms")
            return
        if node is None or node.size != record.k:
            raise AuditError(f"round drafted k={record.k} but drew "
                             f"{'no' if node is None else node.size} uniforms")
        if self.dtype is None:
            self.dtype = record.px.dtype
        if node.options is None:            # probe: resolve the weights of the k + 1 patterns
            if self.alphas_fn is None:
                acc, rej = _record_alphas(record)
            else:
                if captured is None:
                    raise AuditError("decode did not call the rule it was given")
                p, q, x = captured
                acc = [float(a) for a in self.alphas_fn(p, q, x)]
                rej = [1.0 - a for a in acc]
            weights, prefix = [], 1.0
            for j in range(record.k + 1):
                weights.append(prefix * rej[j] if j < record.k else prefix)
                if j < record.k:
                    prefix *= acc[j]
            first = 0
            if node.drafts is not None:
                drafts = self.stack[node.drafts:node.drafts + record.k]
                for i, (v, q_i) in enumerate(zip(drafts, record.qx.tolist())):
                    drawn = v.weights[v.pos]
                    if not abs(drawn - q_i) <= 1e-12 * max(drawn, q_i):
                        raise AuditError(
                            f"draft {i + 1} was drawn with probability {drawn:.6g} but the "
                            f"drafter reported q = {q_i:.6g}: q must be the distribution the "
                            f"draft was drawn from (if the round's draws are not the drafts, "
                            f"pass collapse_drafts=False)")
                # Patterns "first rejection at j" do not depend on x_{j+2..k}: enumerate
                # them only under the first option of those draws (with weight 1 there,
                # since their probabilities sum to 1).
                first = max((i for i, v in enumerate(drafts) if v.pos != 0), default=0)
            node.options = [j for j, w in enumerate(weights) if w > 0 and j >= first]
            node.weights = [weights[j] for j in node.options]
            node.alphas = acc
            self.probes += 1
            self.probe_depth = depth
            if not node.options:            # everything here is covered by a sibling
                raise _Pruned
            raise _Restart
        j = node.options[node.pos]
        if record.accepted != j:
            what = f"first rejection at draft {j + 1}" if j < record.k else "all drafts accepted"
            raise AuditError(
                f"acceptance rule inconsistent with min(1, p/q): pattern '{what}' "
                f"(probability {node.weights[node.pos]:.6g}, P(accept x_i) = "
                f"{[round(a, 6) for a in node.alphas]}) realised accepted={record.accepted} "
                f"of k={record.k}")

    def on_commit(self, block: list[int]) -> None:
        """A round committed `block`: record the transition between round-boundary
        states, and stop the replay if the state reached is already expanded."""
        self.out.extend(block)
        self.round_start = self.cursor
        if not self.memo:
            return
        key = (tuple(self.out), self.state_key())
        d = self.cursor
        depth = self.open_depth.get(key)
        if depth is not None:               # an ancestor state, already being expanded
            if depth != d:
                raise AuditError("replay is not deterministic: a state was reached at two depths")
            self.last = (key, d)
            return
        prev_key, prev_d = self.last
        self.trans.setdefault(prev_key, defaultdict(float))[key] += math.prod(self.path_w[prev_d:d])
        self.outs[key] = tuple(self.out)
        self.last = (key, d)
        if key in self.complete:
            self.merges += 1
            raise _Merged
        self.open.append((key, d))
        self.open_depth[key] = d

    # -- driver ------------------------------------------------------------------------------
    def _replay(self) -> None:
        self.cursor = 0
        self.path_w: list[float] = []
        self.out: list[int] = []
        self.history: list[tuple[int, int]] = []
        self.pending, self.pending_depth = None, -1
        self.round_start = 0
        self.captured = None
        self.last = (self.root, 0)
        self.replays += 1
        if self.replays > self.max_paths:
            raise AuditError(f"more than {self.max_paths} replays: the tree is too large for "
                             "exact enumeration (use a smaller vocabulary, n, k or a top-k warp)")
        try:
            tokens = self.run(self)
        except _Restart:                    # drop what the probe round created after the draw
            del self.stack[self.probe_depth + 1:]
            return
        except _Merged:
            del self.stack[self.cursor:]
            self._advance()
            return
        except _Pruned:
            del self.stack[self.probe_depth:]
            self._advance()
            return
        if self.cursor != len(self.stack):
            raise AuditError("replay is not deterministic: the path ended early")
        if list(tokens) != self.out:
            raise AuditError("decode returned tokens that differ from what it committed")
        if self.memo:
            key, d = self.last
            if d != self.cursor:
                raise AuditError("randomness was drawn after the last committed round")
            self.terminal.add(key)
            self.outs[key] = tuple(self.out)
        else:
            self.leaves[tuple(tokens)] += math.prod(self.path_w)
        self._advance()

    def _advance(self) -> None:
        stack = self.stack
        while stack and stack[-1].pos + 1 >= len(stack[-1].options):
            stack.pop()
        i = len(stack) - 1
        if stack:
            stack[-1].pos += 1
        while self.open and self.open[-1][1] > i:
            key = self.open.pop()[0]
            del self.open_depth[key]
            self.complete.add(key)
        self.done = not stack

    def enumerate(self, run: Callable[["Enumerator"], list[int]]) -> Distribution:
        """Replay `run` until every path is visited; the exact output distribution.

        Args:
            run: runs the loop once: builds a fresh policy, sets ``enum.state_key``
                (a zero-argument callable: the policy's state at a round boundary,
                None when the committed tokens say everything), calls `decode` with
                ``rng=enum, rule=enum.rule, observer=enum.observer,
                on_commit=enum.on_commit`` and returns its new tokens.

        Returns:
            {new-token tuple: probability} (float64 products of branch weights).

        Raises:
            AuditError: a realised acceptance pattern disagrees with its
                probability, the replay is not deterministic, or more than
                `max_paths` replays were needed.
        """
        self.run = run
        self.root = ((), "root")
        self.outs[self.root] = ()
        self.open = [(self.root, 0)]
        self.open_depth = {self.root: 0}
        self.done = False
        while not self.done:
            self._replay()
        if not self.memo:
            return dict(self.leaves)
        expanded: dict[Hashable, Distribution] = {}

        def expand(key: Hashable) -> Distribution:
            got = expanded.get(key)
            if got is not None:
                return got
            res: defaultdict[tuple[int, ...], float] = defaultdict(float)
            if key in self.terminal:
                res[()] += 1.0
            base = len(self.outs[key])
            for nxt, w in self.trans.get(key, {}).items():
                step = self.outs[nxt][base:]
                for suffix, pw in expand(nxt).items():
                    res[step + suffix] += w * pw
            expanded[key] = dict(res)
            return expanded[key]

        return expand(self.root)           # recursion depth = number of rounds
