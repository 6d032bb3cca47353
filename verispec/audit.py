"""Auditing exactness: exact enumeration on toy models, statistical tests on real runs.

Two complementary checks that speculative decoding samples exactly from the target:

1. **Exact enumeration** (`exact_distribution`, `target_distribution`, `audit_exact`).
   The *shipped* `verispec.decoding.decode` loop is replayed over and over with a
   scripted `Randomness` that, instead of drawing, follows a prefix of choices and
   extends it depth-first (odometer style), so every execution path is visited once
   and its probability is the product of its branch weights (float64):

   * ``categorical(probs)`` branches over every token with ``probs[t] > 0``,
     weight ``probs[t]``;
   * ``uniform(k)`` branches over the k + 1 acceptance patterns "first rejection at
     j" (j = k: all accepted). Its weight is not known when the uniforms are drawn;
     it is resolved from the `RoundRecord` the observer receives at the end of the
     round: with α_i = min(1, p_i(x_i) / q_i(x_i)),
     ``weight(j) = Π_{i<j} α_i · (1 − α_j)`` (``Π_{i<k} α_i`` for j = k).
     The first visit of a uniform draw is a *probe* (its round is run once to read
     p_i(x_i), q_i(x_i), then discarded). Afterwards each pattern j is replayed with
     representative uniforms: by default ("boundary") u_i is the largest float32
     below α_i for i < j and the smallest float32 above α_j at j (so the acceptance
     region is pinned to [0, α_i) up to float32 resolution); "extreme" uses the
     textbook 0 / 1. For every pattern with positive weight the realised accepted
     count must equal j, otherwise `AuditError` is raised: this is what catches a
     broken acceptance rule (wrong threshold, no stop at the first rejection, ...).
   * Zero-weight branches are pruned.

   Paths that reach the same state at a round boundary (same committed tokens; for
   policies other than `FixedPolicy` also the same (k, accepted) history, or the
   policy's own ``audit_state()``) are merged: the replay stops there and the rest
   of the tree is reused (``memo=True``, default; ``memo=False`` replays every path
   to its end and gives the same result, only slower). Every distinct state is still
   produced by the real loop at least once.

   Alternative acceptance rules are evaluated through the same loop by passing them
   to `decode` as its ``rule`` (a `verispec.verify.Rule`, or a pure verify function
   ``fn(p, q, x, u) -> (n, dist)`` wrapped as a `UniformRule`). `naive_agree_verify`
   ("accept only when draft and target agree") and `always_accept_verify` are the
   two classic shortcuts; both are biased. Rules that draw no uniforms (the coupled
   `gumbel` rule) are enumerated through their categorical draws alone.

2. **Statistical audit of real runs** (`statistical_audit`). Any two samplers
   ``(seed: int) -> list[int]`` (the first m new token ids of one generation) can be
   compared: N seeded samples each, a chi-square (or G-) test of homogeneity for the
   token at every position 1..m and for the joint m-token prefix, Bonferroni over the
   m + 1 tests, a total-variation estimate with a bootstrap interval, and a verdict.
   `decode_sampler`, `rule_samplers` (verispec and the naive shortcuts on top of
   `decode`) and `hf_assisted_sampler` (transformers' assisted generation) build such
   samplers; any callable works, so third-party implementations can be audited too.

Toy models for both: `toy_random_model` (prefix-dependent float64 logits from a hash
of the prefix), `toy_fixed_model` (the same distribution at every position) and
`seed_example` (the chapter's p = (0.5, 0.3, 0.15, 0.05), q = (0.6, 0.2, 0.1, 0.1)).
"""

from __future__ import annotations

import math
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .decoding import RoundRecord, decode
from .models.base import CausalLM
from .models.toy import FunctionModel, log_probs
from .policy import FixedPolicy
from .sampling import SamplingConfig, SeededRandomness, warp
from .verify import Rule, UniformRule, alpha, standard

__all__ = [
    "AuditError", "ExactReport", "AuditReport", "HomogeneityResult",
    "as_rule", "naive_agree_verify", "always_accept_verify", "NAIVE_RULES",
    "exact_distribution", "target_distribution", "total_variation", "marginal",
    "audit_exact", "audit_exact_rules", "exact_table",
    "statistical_audit", "audit_samples", "audit_rules", "draw_samples",
    "decode_sampler", "rule_samplers", "hf_assisted_sampler",
    "toy_random_model", "toy_fixed_model", "seed_example",
]

Distribution = dict[tuple[int, ...], float]
Sampler = Callable[[int], Sequence[int]]


class AuditError(AssertionError):
    """The decode loop behaved in a way no exact sampler can (or not deterministically)."""


# ----------------------------------------------------------------------------------------
# Injecting alternative acceptance rules
# ----------------------------------------------------------------------------------------

def as_rule(rule: Rule | Callable | None, name: str | None = None) -> Rule:
    """A `Rule` from a rule, a pure verify function ``fn(p, q, x, u) -> (n, dist)``
    (wrapped as a `UniformRule` with its ``acceptance_probs`` attribute, if any), or
    None (the shipped standard rule)."""
    if rule is None:
        return standard
    if hasattr(rule, "draft_stream"):
        return rule
    return UniformRule(rule, name or getattr(rule, "__name__", "custom"),
                       getattr(rule, "acceptance_probs", None))


def naive_agree_verify(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                       u: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Shortcut "accept only when draft and target agree" (biased; for audits only).

    Accepts x_i iff x_i == argmax p_i (ignores q and u), stops at the first
    disagreement and samples that position from p_i; all accepted: bonus from p_k.
    """
    k = x.shape[0]
    if k == 0:
        return 0, p[0]
    agree = (p[:k].argmax(-1) == x).to(torch.int64)
    n = int(agree.cumprod(0).sum())
    return n, p[n]


def _agree_probs(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> list[float]:
    k = x.shape[0]
    return [1.0 if v else 0.0 for v in (p[:k].argmax(-1) == x).tolist()]


naive_agree_verify.acceptance_probs = _agree_probs  # type: ignore[attr-defined]


def always_accept_verify(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                         u: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Shortcut "always accept the draft" (biased: the output follows q; audits only).

    Accepts all k drafts and draws the bonus token from p_k.
    """
    k = x.shape[0]
    return k, p[k]


always_accept_verify.acceptance_probs = (  # type: ignore[attr-defined]
    lambda p, q, x: [1.0] * int(x.shape[0]))

#: The classic shortcuts, by the names the reports and the CLI use.
NAIVE_RULES: dict[str, Rule] = {
    "naive-agree": as_rule(naive_agree_verify, "naive-agree"),
    "naive-always-accept": as_rule(always_accept_verify, "naive-always-accept"),
}


# ----------------------------------------------------------------------------------------
# Toy models
# ----------------------------------------------------------------------------------------

def toy_random_model(vocab_size: int, seed: int = 0, *, sharpness: float = 1.5,
                     eos_token_ids: Sequence[int] = (), name: str | None = None,
                     zero_ids: Sequence[int] = ()) -> FunctionModel:
    """A `FunctionModel` whose float64 logits depend on the whole prefix.

    The logits at a position are Gaussian (scale `sharpness`), drawn from a
    generator seeded with a CRC32 hash of (seed, prefix), so the next-token
    distribution changes with every earlier token. Deterministic and cached.

    Args:
        vocab_size: V.
        seed: selects the model (different seeds give different models).
        sharpness: standard deviation of the logits (larger = peakier).
        eos_token_ids: ids that end generation.
        name: label; defaults to "toy-V-seed".
        zero_ids: ids given probability exactly 0 at every position.
    """
    cache: dict[tuple[int, ...], torch.Tensor] = {}
    zero = list(zero_ids)

    def fn(prefix: tuple[int, ...]) -> torch.Tensor:
        out = cache.get(prefix)
        if out is None:
            h = zlib.crc32(np.asarray((seed, *prefix), dtype=np.int64).tobytes())
            gen = torch.Generator().manual_seed(h)
            out = torch.randn(vocab_size, generator=gen, dtype=torch.float64) * sharpness
            if zero:
                out[zero] = -math.inf
            cache[prefix] = out
        return out

    return FunctionModel(fn, vocab_size, eos_token_ids=eos_token_ids,
                         name=name or f"toy-{vocab_size}-{seed}")


def toy_fixed_model(probs: Sequence[float], *, eos_token_ids: Sequence[int] = (),
                    name: str = "toy-fixed") -> FunctionModel:
    """A `FunctionModel` with the same next-token distribution `probs` at every position."""
    logits = log_probs(probs)
    return FunctionModel(lambda prefix: logits, len(probs), eos_token_ids=eos_token_ids, name=name)


def seed_example() -> tuple[FunctionModel, FunctionModel]:
    """(target, draft) with p = (0.5, 0.3, 0.15, 0.05) and q = (0.6, 0.2, 0.1, 0.1).

    The four-token example of the acceptance-criterion chapter, at every position.
    """
    return (toy_fixed_model((0.5, 0.3, 0.15, 0.05), name="seed-p"),
            toy_fixed_model((0.6, 0.2, 0.1, 0.1), name="seed-q"))


# ----------------------------------------------------------------------------------------
# Exact enumeration
# ----------------------------------------------------------------------------------------

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
    """(α_i, 1 − α_i) from a round's p_i(x_i), q_i(x_i), for the shipped rule u·q < p."""
    px, qx = record.px, record.qx
    # min(p_i(x_i), q_i(x_i)) per position: the one-token case of α
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


class _Enumerator:
    """Depth-first replay enumeration of one decode configuration (see module doc)."""

    def __init__(self, run: Callable[["_Enumerator"], list[int]], *,
                 alphas_fn: Callable | None, memo: bool, representatives: str,
                 max_paths: int, collapse: bool = True, uniforms: bool = True) -> None:
        if representatives not in ("boundary", "extreme"):
            raise ValueError(f"representatives must be 'boundary' or 'extreme', got {representatives!r}")
        self.run = run
        self.alphas_fn = alphas_fn          # None: from the RoundRecord (shipped rule)
        self.uniforms = uniforms            # does the rule draw uniforms in drafting rounds?
        self.rule_name = "rule"
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
    def capture(self, rule: Rule) -> Rule:
        """`rule`, recording the (p, q, x) of each call for `alphas_fn`."""
        enum = self

        class Captured:
            name, draft_stream, uses_uniforms = rule.name, rule.draft_stream, rule.uses_uniforms

            def __call__(self, p, q, x, rng, position):
                enum.captured = (p, q, x)
                return rule(p, q, x, rng, position)

        return Captured()

    def observer(self, record: RoundRecord) -> None:
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
                f"(probability {node.weights[node.pos]:.6g}, α = "
                f"{[round(a, 6) for a in node.alphas]}) realised accepted={record.accepted} "
                f"of k={record.k}")

    def on_commit(self, block: list[int]) -> None:
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

    def enumerate(self) -> Distribution:
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


@contextmanager
def _single_thread() -> Iterator[None]:
    """One intra-op thread: toy tensors are tiny, and on a busy machine waking
    OpenMP workers costs ~100x the work (a [3, 6] softmax: 1 us vs 130 us)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _policy_factory(drafter_or_policy_factory, k: int | None) -> Callable[[], Any]:
    """A zero-argument callable building a fresh policy for each run."""
    obj = drafter_or_policy_factory
    if obj is None:
        return lambda: FixedPolicy(None, 0)
    if hasattr(obj, "propose"):             # a Drafter: FixedPolicy(drafter, k)
        if k is None:
            raise ValueError("k is required when a drafter (not a policy factory) is given")
        return lambda: FixedPolicy(obj, k)
    if hasattr(obj, "choose"):
        raise TypeError("pass a policy *factory* (a zero-argument callable returning a fresh "
                        "policy), not a policy instance")
    if not callable(obj):
        raise TypeError(f"expected a drafter or a policy factory, got {type(obj).__name__}")
    return obj


def _state_key(policy) -> Callable[[list[tuple[int, int]]], Hashable]:
    state = getattr(policy, "audit_state", None)
    if state is not None:
        return lambda history: state()
    if type(policy) is FixedPolicy:
        return lambda history: None
    return lambda history: tuple(history)


def exact_distribution(
    target: CausalLM,
    drafter_or_policy_factory,
    prompt: Sequence[int],
    n: int,
    k: int | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    rule: Rule | Callable | None = None,
    *,
    stop: Callable[[list[int]], bool] | None = None,
    memo: bool = True,
    collapse_drafts: bool = True,
    representatives: str = "boundary",
    max_paths: int = 2_000_000,
    stats: dict | None = None,
) -> Distribution:
    """Exact probability of every output of the shipped `decode` loop.

    Args:
        target: the target model (a float64 `FunctionModel` for exact results;
            any deterministic `CausalLM` works, at its own precision).
        drafter_or_policy_factory: a `Drafter` (run as ``FixedPolicy(drafter, k)``),
            or a zero-argument callable returning a fresh policy for every replay
            (policies are stateful), or None for plain decoding.
        prompt: prompt token ids.
        n: max_new_tokens.
        k: draft length when a drafter is given (ignored for a policy factory).
        sampling: warps for p and q.
        rule: the acceptance rule `decode` runs (see `as_rule`; None: the shipped
            standard rule). If it has ``acceptance_probs(p, q, x)`` (per-position
            P(accept x_i), accepting iff u_i < that), the pattern weights come from
            it; otherwise the rule is audited against min(1, p/q). A rule with
            ``uses_uniforms = False`` is enumerated through its categorical draws.
        stop: passed to `decode`.
        memo: merge paths at identical round-boundary states (module doc).
        collapse_drafts: when a round's categorical draws are exactly its k drafts
            (as with `ModelDrafter`), enumerate the pattern "first rejection at j"
            under one value of the later drafts x_{j+2..k} only, with weight 1
            (they cannot change the outcome; their probabilities sum to 1). Also
            checks that each draft was drawn from the q the drafter reports.
        representatives: "boundary" (default) or "extreme" uniforms per pattern.
        max_paths: safety cap on replays.
        stats: if a dict, filled with replays/probes/merges/seconds/dtype.

    Returns:
        {new-token tuple: probability}; tuples end at EOS / stop or have length n.

    Raises:
        AuditError: a realised acceptance pattern disagrees with its probability
            (broken rule), the replay is not deterministic, or the tree is too large.
    """
    start = time.perf_counter()
    make_policy = _policy_factory(drafter_or_policy_factory, k)
    prompt = list(prompt)
    the_rule = as_rule(rule)
    alphas_fn = getattr(the_rule, "acceptance_probs", None) if the_rule is not standard else None
    enum = _Enumerator(lambda e: None, alphas_fn=alphas_fn, memo=memo,
                       representatives=representatives, max_paths=max_paths,
                       collapse=collapse_drafts, uniforms=the_rule.uses_uniforms)
    enum.rule_name = the_rule.name
    run_rule = enum.capture(the_rule)

    def run(e: _Enumerator):
        policy = make_policy()
        key_fn = _state_key(policy)
        e.state_key = lambda: key_fn(e.history)
        result = decode(target, prompt, policy, sampling=sampling, max_new_tokens=n, rng=e,
                        rule=run_rule, stop=stop, observer=e.observer, on_commit=e.on_commit)
        return result.tokens

    enum.run = run
    with _single_thread():
        dist = enum.enumerate()
    if stats is not None:
        stats.update(replays=enum.replays, probes=enum.probes, merges=enum.merges,
                     seconds=time.perf_counter() - start,
                     dtype=str(enum.dtype).replace("torch.", "") if enum.dtype else None)
    return dist


def _direct_target_distribution(target: CausalLM, prompt: list[int], n: int,
                                sampling: SamplingConfig) -> Distribution:
    """Π of warped target conditionals, by recursion over prefixes (no decode loop)."""
    eos = target.eos_token_ids
    out: Distribution = {}

    def rec(prefix: tuple[int, ...], w: float) -> None:
        if len(prefix) == n:
            out[prefix] = out.get(prefix, 0.0) + w
            return
        p = warp(target.sync(prompt + list(prefix), keep=1)[-1], sampling,
                 prompt + list(prefix), len(prompt)).tolist()
        for t, pt in enumerate(p):
            if pt > 0:
                if t in eos:
                    out[prefix + (t,)] = out.get(prefix + (t,), 0.0) + w * pt
                else:
                    rec(prefix + (t,), w * pt)

    rec((), 1.0)
    return out


def target_distribution(target: CausalLM, prompt: Sequence[int], n: int,
                        sampling: SamplingConfig = SamplingConfig(), *,
                        method: str = "both", tol: float = 1e-12) -> Distribution:
    """Exact distribution of n new tokens sampled from the target alone.

    Args:
        method: "decode" (the shipped loop with k = 0, enumerated like
            `exact_distribution`), "direct" (multiply the warped conditionals), or
            "both" (compute both and check they agree within `tol` in TV).

    Raises:
        AuditError: when "both" disagree.
    """
    if method not in ("both", "decode", "direct"):
        raise ValueError(f"method must be 'both', 'decode' or 'direct', got {method!r}")
    prompt = list(prompt)
    direct = None
    if method != "decode":
        with _single_thread():
            direct = _direct_target_distribution(target, prompt, n, sampling)
    if method == "direct":
        return direct
    via_loop = exact_distribution(target, None, prompt, n, 0, sampling)
    if direct is not None:
        tv = total_variation(direct, via_loop)
        if not tv <= tol:
            raise AuditError(f"plain decode (k=0) and the product of target conditionals "
                             f"disagree: TV = {tv:.3g}")
    return via_loop


def total_variation(d1: dict, d2: dict) -> float:
    """TV(d1, d2) = ½ Σ_s |d1(s) − d2(s)| over the union of supports."""
    keys = set(d1) | set(d2)
    return 0.5 * math.fsum(abs(d1.get(s, 0.0) - d2.get(s, 0.0)) for s in keys)


def marginal(dist: Distribution, position: int = 0, vocab_size: int | None = None) -> list[float] | dict:
    """Marginal of the token at `position` (0-based) under a sequence distribution.

    Returns a list of V probabilities when `vocab_size` is given (sequences too short
    to have that position are left out, so the list may sum to less than 1),
    else a {token: probability} dict.
    """
    m: defaultdict[int, float] = defaultdict(float)
    for s, w in dist.items():
        if len(s) > position:
            m[s[position]] += w
    if vocab_size is None:
        return dict(m)
    return [m.get(t, 0.0) for t in range(vocab_size)]


@dataclass
class ExactReport:
    """Result of `audit_exact`.

    Attributes:
        rule: "verispec" or the injected rule's name.
        tv: TV between the loop's output distribution and the target's (nan if inconsistent).
        n_sequences: outputs with positive probability.
        verdict: "exact" (tv <= tol), "biased", or "inconsistent" (AuditError).
        mass: total probability enumerated (1 up to rounding).
        tol: the tolerance used.
        seconds, replays, merges, dtype: enumeration statistics.
        detail: the AuditError message for "inconsistent".
    """

    rule: str
    tv: float
    n_sequences: int
    verdict: str
    mass: float = float("nan")
    tol: float = 1e-12
    n: int = 0
    k: int | None = None
    vocab_size: int = 0
    seconds: float = 0.0
    replays: int = 0
    merges: int = 0
    dtype: str | None = None
    detail: str = ""

    @property
    def flagged(self) -> bool:
        """True when the rule does not reproduce the target distribution."""
        return self.verdict != "exact"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tv"] = None if math.isnan(self.tv) else self.tv
        d["mass"] = None if math.isnan(self.mass) else self.mass
        d["flagged"] = self.flagged
        return d


def audit_exact(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], n: int,
                k: int | None = None, sampling: SamplingConfig = SamplingConfig(),
                rule: Rule | Callable | None = None, *, name: str | None = None,
                tol: float = 1e-12, reference: Distribution | None = None,
                **kwargs) -> ExactReport:
    """Enumerate the loop and the target alone exactly and compare them.

    Args: as `exact_distribution`; `reference` reuses a target distribution
    computed before; `name` names the report (default "verispec" for the shipped
    standard rule, else the rule's name). Extra keyword arguments go to
    `exact_distribution`.

    Returns:
        `ExactReport`; an `AuditError` becomes verdict "inconsistent".
    """
    the_rule = as_rule(rule)
    name = name or ("verispec" if the_rule is standard else the_rule.name)
    if reference is None:
        reference = target_distribution(target, prompt, n, sampling)
    stats: dict = {}
    base = dict(rule=name, n=n, k=k, vocab_size=target.vocab_size, tol=tol)
    try:
        dist = exact_distribution(target, drafter_or_policy_factory, prompt, n, k, sampling,
                                  the_rule, stats=stats, **kwargs)
    except AuditError as err:
        return ExactReport(tv=float("nan"), n_sequences=0, verdict="inconsistent",
                           detail=str(err), **base)
    tv = total_variation(dist, reference)
    return ExactReport(tv=tv, n_sequences=sum(1 for w in dist.values() if w > 0),
                       verdict="exact" if tv <= tol else "biased",
                       mass=math.fsum(dist.values()), seconds=stats["seconds"],
                       replays=stats["replays"], merges=stats["merges"], dtype=stats["dtype"],
                       **base)


def audit_exact_rules(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], n: int,
                      k: int | None = None, sampling: SamplingConfig = SamplingConfig(), *,
                      rules: dict[str, Rule | Callable | None] | None = None,
                      tol: float = 1e-12) -> list[ExactReport]:
    """`audit_exact` for verispec's rule and each naive shortcut (or `rules`), one reference."""
    rules = rules if rules is not None else {"verispec": None, **NAIVE_RULES}
    reference = target_distribution(target, prompt, n, sampling)
    return [audit_exact(target, drafter_or_policy_factory, prompt, n, k, sampling, rule,
                        name=name, tol=tol, reference=reference)
            for name, rule in rules.items()]


def exact_table(reports: Sequence[ExactReport], title: str = "Exact enumeration audit"):
    """A rich Table of `ExactReport`s."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("rule", "k", "n", "V", "outputs", "TV vs target", "verdict", "seconds"):
        table.add_column(col, justify="left" if col in ("rule", "verdict") else "right")
    for r in reports:
        colour = "green" if not r.flagged else "red"
        table.add_row(r.rule, str(r.k), str(r.n), str(r.vocab_size), str(r.n_sequences),
                      "—" if math.isnan(r.tv) else f"{r.tv:.3g}",
                      f"[{colour}]{r.verdict}[/{colour}]", f"{r.seconds:.2f}")
    return table


# ----------------------------------------------------------------------------------------
# Statistical audit
# ----------------------------------------------------------------------------------------

_ENDED = -1     # category for "generation had ended before this position"


@dataclass
class HomogeneityResult:
    """One homogeneity test (a 2 x C table after pooling rare categories)."""

    name: str
    statistic: float
    dof: int
    p_value: float
    categories: int        # columns tested (after pooling)
    pooled: int            # raw categories pooled into "other"
    tv: float              # plug-in TV between the two empirical distributions
    reject: bool = False

    @property
    def testable(self) -> bool:
        """False when pooling left < 2 columns (too few samples for this many categories)."""
        return self.categories >= 2


@dataclass
class AuditReport:
    """Result of a statistical audit of a candidate sampler against a reference.

    Attributes:
        reference, candidate: labels.
        n_samples: N per sampler; m: tokens compared; alpha_level: family-wise level.
        alpha_per_test: alpha_level / number of tests (Bonferroni).
        tests: per position 1..m, then the joint m-token prefix.
        tv: plug-in TV between the two empirical distributions of the joint prefix.
            It is biased upwards (order sqrt(categories / N) even with no
            difference); read it together with:
        tv_corrected, tv_ci: bootstrap bias-corrected TV and basic bootstrap
            interval (clipped at 0) at level `confidence`;
        tv_null: the `confidence` quantile of the plug-in TV under random
            re-splits of the pooled samples (its size when nothing differs);
        tv_p_value: permutation p-value of the observed TV (informational; the
            verdict uses the chi-square / G tests).
        verdict: "pass" (no test rejects) or "FAIL".
    """

    reference: str
    candidate: str
    n_samples: int
    m: int
    alpha_level: float
    alpha_per_test: float
    method: str
    tests: list[HomogeneityResult]
    tv: float
    tv_corrected: float
    tv_ci: tuple[float, float]
    tv_null: float
    tv_p_value: float
    confidence: float
    verdict: str
    seconds: float = 0.0
    seeds: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def min_p_value(self) -> float:
        return min(t.p_value for t in self.tests)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        d = asdict(self)
        d["tv_ci"] = list(self.tv_ci)
        d["passed"] = self.passed
        d["min_p_value"] = self.min_p_value
        for t, row in zip(self.tests, d["tests"]):
            row["testable"] = t.testable
        return d

    def table(self):
        """A rich Table: one row per test, the verdict in the caption."""
        from rich.table import Table

        colour = "green" if self.passed else "red"
        table = Table(title=f"{self.candidate} vs {self.reference}: N = {self.n_samples} each, "
                            f"m = {self.m}, α = {self.alpha_level} (Bonferroni {self.alpha_per_test:.2g})",
                      caption=f"[{colour}]{self.verdict}[/{colour}]  TV̂(joint) = {self.tv:.4f} "
                              f"(no-difference level {self.tv_null:.4f}); bias-corrected "
                              f"{self.tv_corrected:.4f} [{self.tv_ci[0]:.4f}, {self.tv_ci[1]:.4f}] "
                              f"({self.confidence:.0%} bootstrap)")
        for col in ("test", self.method, "dof", "p-value", "categories", "TV̂", "reject"):
            table.add_column(col, justify="left" if col == "test" else "right")
        for t in self.tests:
            if not t.testable:
                table.add_row(t.name, "—", "—", "n/a", f"{t.categories} (+{t.pooled} pooled)",
                              f"{t.tv:.4f}", "too sparse")
                continue
            table.add_row(t.name, f"{t.statistic:.2f}", str(t.dof), f"{t.p_value:.3g}",
                          f"{t.categories} (+{t.pooled} pooled)" if t.pooled else str(t.categories),
                          f"{t.tv:.4f}", "[red]yes[/red]" if t.reject else "no")
        return table


def _homogeneity(a: Sequence[Hashable], b: Sequence[Hashable], name: str,
                 lambda_: str | None) -> HomogeneityResult:
    """Chi-square (or G-) test that samples a and b come from one distribution.

    Categories whose smaller expected count is < 5 are pooled into "other"; if
    "other" itself stays below 5, the rarest remaining categories join it.
    """
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cats = sorted(set(ca) | set(cb), key=lambda c: (-(ca[c] + cb[c]), repr(c)))
    tv = 0.5 * sum(abs(ca[c] / na - cb[c] / nb) for c in cats)
    share = min(na, nb) / (na + nb)

    def expected(cs) -> float:
        return sum(ca[c] + cb[c] for c in cs) * share

    keep = [c for c in cats if expected([c]) >= 5]
    pooled = [c for c in cats if expected([c]) < 5]
    while pooled and expected(pooled) < 5 and keep:
        pooled.append(keep.pop())           # the rarest kept category
    columns = [[c] for c in keep] + ([pooled] if pooled else [])
    if len(columns) < 2:
        return HomogeneityResult(name, 0.0, 0, 1.0, len(columns), len(pooled), tv)
    table = np.array([[sum(ca[c] for c in col) for col in columns],
                      [sum(cb[c] for c in col) for col in columns]], dtype=float)
    stat, p, dof, _ = chi2_contingency(table, correction=False, lambda_=lambda_)
    return HomogeneityResult(name, float(stat), int(dof), float(p), len(columns),
                      len(pooled) if pooled else 0, tv)


def _tv_resampling(a: Sequence[Hashable], b: Sequence[Hashable], reps: int, confidence: float,
                   seed: int) -> dict[str, Any]:
    """Bootstrap and permutation views of the plug-in TV between samples a and b.

    The plug-in TV is biased upwards (with C categories and N samples it is of
    order sqrt(C / N) even when the distributions are equal), so:
      * ``tv_corrected`` = max(0, 2·TV̂ − mean of bootstrap TVs) (bootstrap bias correction);
      * ``tv_ci`` = the basic bootstrap interval [2·TV̂ − q_hi, 2·TV̂ − q_lo], clipped at 0;
      * ``tv_null`` = the `confidence` quantile of TV̂ over random re-splits of the
        pooled samples (what TV̂ looks like at this N when nothing differs), and
        ``tv_p_value`` the permutation p-value of the observed TV̂.
    """
    index: dict[Hashable, int] = {}
    ia = np.array([index.setdefault(s, len(index)) for s in a])
    ib = np.array([index.setdefault(s, len(index)) for s in b])
    c, na, nb = len(index), len(ia), len(ib)

    def tv(xa: np.ndarray, xb: np.ndarray) -> float:
        return 0.5 * float(np.abs(np.bincount(xa, minlength=c) / len(xa)
                                  - np.bincount(xb, minlength=c) / len(xb)).sum())

    rng = np.random.default_rng(seed)
    observed = tv(ia, ib)
    boot = np.array([tv(ia[rng.integers(0, na, na)], ib[rng.integers(0, nb, nb)])
                     for _ in range(reps)])
    pooled = np.concatenate([ia, ib])
    null = np.empty(reps)
    for r in range(reps):
        perm = rng.permutation(pooled)
        null[r] = tv(perm[:na], perm[na:])
    q_lo, q_hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return dict(
        tv_corrected=max(0.0, 2 * observed - float(boot.mean())),
        tv_ci=(max(0.0, 2 * observed - float(q_hi)), max(0.0, 2 * observed - float(q_lo))),
        tv_null=float(np.quantile(null, confidence)),
        tv_p_value=float((1 + np.sum(null >= observed - 1e-15)) / (reps + 1)),
    )


def _normalise(sample: Sequence[int], m: int) -> tuple[int, ...]:
    s = [int(t) for t in list(sample)[:m]]
    return tuple(s + [_ENDED] * (m - len(s)))


def draw_samples(sampler: Sampler, seeds: Sequence[int], m: int, *, progress: bool = True,
                 desc: str = "sampling") -> list[tuple[int, ...]]:
    """Call `sampler(seed)` for each seed; keep the first m tokens (padded with -1 = ended)."""
    from tqdm.auto import tqdm

    return [_normalise(sampler(int(s)), m)
            for s in tqdm(seeds, desc=desc, disable=not progress, leave=False)]


def audit_samples(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]], m: int,
                  alpha_level: float = 0.01, *, method: str = "chi2",
                  reference_label: str = "reference", candidate_label: str = "candidate",
                  bootstrap: int = 300, confidence: float = 0.95,
                  bootstrap_seed: int = 0) -> AuditReport:
    """The tests of `statistical_audit` on samples already drawn (lists of token lists)."""
    if method not in ("chi2", "g"):
        raise ValueError(f"method must be 'chi2' or 'g' (log-likelihood ratio), got {method!r}")
    if not 0 < alpha_level < 1:
        raise ValueError(f"alpha_level must be in (0, 1), got {alpha_level!r}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m!r}")
    start = time.perf_counter()
    a = [_normalise(s, m) for s in reference]
    b = [_normalise(s, m) for s in candidate]
    lam = "log-likelihood" if method == "g" else None
    tests = [_homogeneity([s[i] for s in a], [s[i] for s in b], f"position {i + 1}", lam)
             for i in range(m)]
    tests.append(_homogeneity(a, b, f"joint 1..{m}", lam))
    alpha_per_test = alpha_level / len(tests)
    for t in tests:
        t.reject = t.p_value < alpha_per_test
    resampled = _tv_resampling(a, b, bootstrap, confidence, bootstrap_seed)
    return AuditReport(
        reference=reference_label, candidate=candidate_label, n_samples=min(len(a), len(b)),
        m=m, alpha_level=alpha_level, alpha_per_test=alpha_per_test,
        method="G" if method == "g" else "χ²", tests=tests, tv=tests[-1].tv, **resampled,
        confidence=confidence, verdict="FAIL" if any(t.reject for t in tests) else "pass",
        seconds=time.perf_counter() - start)


def statistical_audit(sample_reference: Sampler, sample_candidate: Sampler, n_samples: int,
                      m: int, alpha_level: float = 0.01, progress: bool = True, *,
                      method: str = "chi2", reference_label: str = "reference",
                      candidate_label: str = "candidate", seed_offset: int = 0,
                      bootstrap: int = 300, confidence: float = 0.95) -> AuditReport:
    """Test whether two samplers produce the same distribution of the first m tokens.

    Each sampler is any callable ``(seed: int) -> list[int]`` returning the new
    token ids of one generation (only the first m are used; a shorter output
    means generation ended, and counts as its own category). The reference is
    called with seeds ``seed_offset + 0..N-1`` and the candidate with
    ``seed_offset + N..2N-1``, so the two sample sets are independent even when
    both samplers share a random-number scheme.

    For each position 1..m (marginal) and for the joint m-token prefix a test of
    homogeneity of the 2 x C contingency table (`scipy.stats.chi2_contingency`,
    Pearson χ² or, with ``method="g"``, the G-test) is run after pooling
    categories with expected count < 5 (a test left with < 2 columns is reported as
    too sparse, p = 1: raise N or lower m). N and α are fixed before sampling (and
    printed when `progress`); with Bonferroni over the m + 1 tests the verdict is
    "pass" when no p-value is below α / (m + 1), else "FAIL". A pass is not a
    proof: the test only detects differences large enough for N (see `tv_ci`).

    Returns:
        `AuditReport` (``.to_dict()`` for JSON, ``.table()`` for a rich Table).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples!r}")
    if progress:
        from rich.console import Console

        Console(stderr=True).print(
            f"statistical audit: {candidate_label} vs {reference_label}: N = {n_samples} samples "
            f"each, m = {m} tokens, α = {alpha_level} over {m + 1} tests "
            f"(Bonferroni α/test = {alpha_level / (m + 1):.3g}), {method}")
    start = time.perf_counter()
    ref_seeds = range(seed_offset, seed_offset + n_samples)
    cand_seeds = range(seed_offset + n_samples, seed_offset + 2 * n_samples)
    a = draw_samples(sample_reference, ref_seeds, m, progress=progress, desc=reference_label)
    b = draw_samples(sample_candidate, cand_seeds, m, progress=progress, desc=candidate_label)
    report = audit_samples(a, b, m, alpha_level, method=method, reference_label=reference_label,
                           candidate_label=candidate_label, bootstrap=bootstrap,
                           confidence=confidence)
    report.seconds = time.perf_counter() - start
    report.seeds = {"reference": [ref_seeds.start, ref_seeds.stop - 1],
                    "candidate": [cand_seeds.start, cand_seeds.stop - 1]}
    return report


def audit_rules(samplers: dict[str, Sampler], n_samples: int, m: int, alpha_level: float = 0.01,
                *, reference: str = "target", progress: bool = True,
                method: str = "chi2") -> dict[str, AuditReport]:
    """Audit every sampler in `samplers` against `samplers[reference]`.

    The reference is sampled once (seeds 0..N-1) and reused; each candidate gets
    seeds N..2N-1. Each report carries its own verdict (α is per candidate).
    Typical use: ``audit_rules(rule_samplers(...), 2000, 4)`` gives
    "verispec: pass; naive-agree: FAIL; naive-always-accept: FAIL".
    """
    if reference not in samplers:
        raise ValueError(f"reference sampler {reference!r} not in {sorted(samplers)}")
    if progress:
        from rich.console import Console

        Console(stderr=True).print(
            f"statistical audit: N = {n_samples} samples per sampler, m = {m} tokens, "
            f"α = {alpha_level} per candidate over {m + 1} tests (Bonferroni), {method}")
    ref = draw_samples(samplers[reference], range(n_samples), m, progress=progress, desc=reference)
    reports = {}
    for name, sampler in samplers.items():
        if name == reference:
            continue
        start = time.perf_counter()
        cand = draw_samples(sampler, range(n_samples, 2 * n_samples), m, progress=progress, desc=name)
        rep = audit_samples(ref, cand, m, alpha_level, method=method, reference_label=reference,
                            candidate_label=name)
        rep.seconds = time.perf_counter() - start
        rep.seeds = {"reference": [0, n_samples - 1], "candidate": [n_samples, 2 * n_samples - 1]}
        reports[name] = rep
    return reports


# ----------------------------------------------------------------------------------------
# Samplers
# ----------------------------------------------------------------------------------------

def decode_sampler(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], m: int,
                   sampling: SamplingConfig, k: int | None = None,
                   rule: Rule | Callable | None = None) -> Sampler:
    """A sampler ``seed -> first m new tokens`` running the shipped `decode`.

    Args:
        drafter_or_policy_factory: as in `exact_distribution` (None: target alone).
        rule: the acceptance rule (see `as_rule`; None: the shipped standard rule).
    """
    the_rule = as_rule(rule)
    make_policy = _policy_factory(drafter_or_policy_factory, k)
    prompt = list(prompt)

    # toy models: tiny tensors, where waking intra-op threads costs more than the work
    threads = _single_thread if isinstance(target, FunctionModel) else nullcontext

    def sample(seed: int) -> list[int]:
        with threads():
            return decode(target, prompt, make_policy(), sampling=sampling, max_new_tokens=m,
                          rng=SeededRandomness(seed), rule=the_rule).tokens

    return sample


def rule_samplers(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], m: int,
                  sampling: SamplingConfig, k: int | None = None) -> dict[str, Sampler]:
    """Samplers for the target alone ("target"), verispec and the naive shortcuts.

    Feed them to `audit_rules` (reference "target").
    """
    out = {"target": decode_sampler(target, None, prompt, m, sampling),
           "verispec": decode_sampler(target, drafter_or_policy_factory, prompt, m, sampling, k)}
    for name, rule in NAIVE_RULES.items():
        out[name] = decode_sampler(target, drafter_or_policy_factory, prompt, m, sampling, k, rule)
    return out


def hf_assisted_sampler(target_hf_model, assistant_hf_model, input_ids, m: int,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Sampler:
    """A sampler wrapping transformers' assisted generation (a third-party implementation).

    Each call seeds torch's *global* RNG with the call's seed (transformers
    samples from it), runs ``target.generate(input_ids, assistant_model=assistant,
    do_sample=True, max_new_tokens=m, ...)`` and restores the RNG state (CPU and
    CUDA) afterwards, so the caller's randomness is untouched.

    Args:
        target_hf_model, assistant_hf_model: `PreTrainedModel`s (not `HFModel`
            wrappers; pass ``wrapper.model``) sharing a tokenizer.
        input_ids: [1, L] long tensor (or a list of ids).
        m: new tokens per sample.
        temperature, top_k, top_p: warps (0 = off for top_k, 1.0 = off for top_p;
            temperature 0 means greedy, ``do_sample=False``).

    Returns:
        ``seed -> list[int]`` of the new token ids.
    """
    if not torch.is_tensor(input_ids):
        input_ids = torch.tensor([list(input_ids)], dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    input_ids = input_ids.to(next(target_hf_model.parameters()).device)
    kwargs: dict[str, Any] = dict(max_new_tokens=m, min_new_tokens=0,
                                  assistant_model=assistant_hf_model,
                                  attention_mask=torch.ones_like(input_ids))
    if temperature == 0:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=int(top_k),
                      top_p=float(top_p))
    eos = getattr(target_hf_model.generation_config, "eos_token_id", None)
    if getattr(target_hf_model.generation_config, "pad_token_id", None) is None:
        kwargs["pad_token_id"] = (eos[0] if isinstance(eos, (list, tuple)) and eos else eos) or 0

    def sample(seed: int) -> list[int]:
        cpu_state = torch.get_rng_state()
        cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            torch.manual_seed(int(seed))
            with torch.inference_mode():
                out = target_hf_model.generate(input_ids, **kwargs)
        finally:
            torch.set_rng_state(cpu_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
        return out[0, input_ids.shape[1]:].tolist()

    return sample
