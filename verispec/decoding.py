"""The speculative decode loop: draft k, verify in one target forward, commit, roll back.

One round, in the paper's notation (Leviathan et al. 2023, Algorithm 1), at output
position t = |S| - |prompt|:

    drafter, k          <- policy.choose(S)                (k = 0: plain decoding)
    x_1..x_k, q_1..q_k  <- drafter.propose(S, k)
    p_1..p_{k+1}        <- warp(target(S[-1], x_1..x_k))   (one forward, k+1 positions)
    n, y                <- rule(p, q, x, randomness at t)  (n accepted, then y)
    S                   <- S + x_1..x_n + [y]              (cut at EOS / budget / stop string)
    caches              <- truncated to the committed sequence; stats; policy.observe

Invariant between rounds: the target's cache holds S[:-1]; the last committed
token is fed at the start of the next verification forward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from .drafters.base import Drafter, DraftSampler, point_masses
from .models.base import CausalLM
from .sampling import NAN_LOGITS, Randomness, SamplingConfig, warp
from .verify import Rule, alpha, standard


@dataclass
class RoundRecord:
    """What one round did; given to the policy and to observers.

    Attributes:
        drafter: name of the drafter used ("none" for a plain step).
        k: drafts proposed.
        accepted: n, drafts accepted (0..k).
        committed: tokens committed this round (after EOS/budget/stop cuts).
        alphas: [k] float, exact Σ min(p_i, q_i) at each draft position.
        px, qx: [k] float, p_i(x_i) and q_i(x_i) for the drafted tokens.
        target_seconds: wall time of the verification forward (k+1 tokens); in a
            batching server (`verispec.batching`), of the shared forward that scored them.
        waited_seconds: wall time the round's target call spent waiting for other
            sequences to join its shared forward (batched mode; 0 otherwise), not in
            target_seconds: it is the others' drafting, not this round's price.
        draft_seconds: wall time spent drafting this round, catch-up excluded.
        catchup_seconds: wall time the drafter spent this round feeding its model the
            context it had missed (the prompt, tokens of plain rounds).
        width: tokens in the verification forward: k + 1, or more when the policy
            asked for a wider, cheaper batch (`verify_width`).
        tokens: the ids committed this round (len == committed), in order.
        logits: [k+1, V] float32, the target's raw logits of this round's verification
            forward (before warps and controls); row i scores the i-th committed token
            (a server's logprobs). A view of the forward's output: no copy is made.
    """

    drafter: str
    k: int
    accepted: int
    committed: int
    alphas: torch.Tensor
    px: torch.Tensor
    qx: torch.Tensor
    target_seconds: float
    draft_seconds: float
    catchup_seconds: float = 0.0
    width: int = 0
    tokens: list[int] = field(default_factory=list)
    waited_seconds: float = 0.0
    logits: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.width:
            self.width = self.k + 1


class Policy(Protocol):
    """Chooses the drafter and k each round (see `verispec.policy`).

    Subclass it to inherit the default `verify_width`.
    """

    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        """(drafter, k) for the next round, given the committed tokens."""
        ...

    def observe(self, record: RoundRecord) -> None:
        """Learn from the round just finished."""
        ...

    def verify_width(self, n: int) -> int:
        """Tokens (>= n) to run the verification forward over when n = k + 1 are
        needed: filler rows after the drafts, discarded (see `decode`). Default n."""
        return n


@dataclass
class Stats:
    """Plain counters updated once per round; derived figures are properties.

    Units: seconds for times, tokens for counts.
    """

    new_tokens: int = 0
    target_forwards: int = 0      # verification forwards (prefill excluded)
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list[int] = field(default_factory=list)   # [i]: rounds where position i+1 was verified
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds where x_{i+1} was accepted
    alpha_sum: float = 0.0        # Σ over verified positions of Σ_x min(p, q)
    wall_seconds: float = 0.0
    prefill_seconds: float = 0.0
    target_seconds: float = 0.0   # verification forwards only
    draft_seconds: float = 0.0
    finish_reason: str = ""
    by_drafter: dict[str, dict[str, int]] = field(default_factory=dict)
    seed: int | None = None       # the randomness's seed (replays the sample)
    rule: str = ""                # the acceptance rule's name

    @property
    def draft_acceptance_rate(self) -> float | None:
        """α̂ = accepted / drafted, the draft acceptance rate (None when nothing was drafted).

        A noisy estimate of α; see `alpha_exact`.
        """
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha_exact(self) -> float | None:
        """α: mean of Σ_x min(p, q) over verified draft positions (lower variance than α̂)."""
        n = sum(self.reached)
        return self.alpha_sum / n if n else None

    @property
    def tau(self) -> float | None:
        """τ = committed tokens per verification forward, bonus included."""
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """P(x_i accepted | x_1..x_{i-1} accepted), i = 1..k_max."""
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached)]

    @property
    def overhead_seconds(self) -> float:
        """Wall time outside the model forwards (loop, sampling, verification)."""
        return self.wall_seconds - self.prefill_seconds - self.target_seconds - self.draft_seconds

    def record(self, r: RoundRecord) -> None:
        self.target_forwards += 1
        self.drafted += r.k
        self.accepted += r.accepted
        self.target_seconds += r.target_seconds
        verified = min(r.accepted + 1, r.k)
        while len(self.reached) < r.k:
            self.reached.append(0)
            self.accepted_at.append(0)
        for i in range(verified):
            self.reached[i] += 1
        for i in range(r.accepted):
            self.accepted_at[i] += 1
        self.alpha_sum += float(r.alphas[:verified].sum())
        d = self.by_drafter.setdefault(r.drafter, {"rounds": 0, "drafted": 0, "accepted": 0, "tokens": 0})
        d["rounds"] += 1
        d["drafted"] += r.k
        d["accepted"] += r.accepted
        d["tokens"] += r.committed

    def as_dict(self) -> dict:
        """All counters and derived figures, JSON-ready.

        ``acceptance_rate`` is kept as an alias of ``draft_acceptance_rate`` (α̂), the
        key earlier releases wrote, so saved results and scripts keep working.
        """
        out = {k: v for k, v in self.__dict__.items()}
        for name in ("draft_acceptance_rate", "alpha_exact", "tau", "tokens_per_second",
                     "per_position_acceptance", "overhead_seconds"):
            out[name] = getattr(self, name)
        out["acceptance_rate"] = out["draft_acceptance_rate"]
        return out


@dataclass
class DecodeResult:
    """What `decode` returns: the new token ids (EOS or the stop string's last token
    included; the prompt excluded) and the generation's counters."""

    tokens: list[int]   # new tokens only
    stats: Stats


def propose(drafter: Drafter, seq: list[int], k: int, sample: DraftSampler, *,
            one_hot: bool = True) -> tuple[list[int], torch.Tensor | None, dict[str, float]]:
    """Ask `drafter` for up to k drafts after `seq` and account for its cost.

    Args:
        drafter: any `Drafter`.
        seq: committed tokens, prompt included.
        k: the most drafts wanted, >= 1.
        sample: the round's `DraftSampler` (its vocabulary is the target's V).
        one_hot: build a point-mass drafter's q rows; False leaves its q None (the
            greedy shortcut of `decode` needs only x).

    Returns:
        (x, q, cost): k' <= k draft ids; q, [k', V] float (one-hot rows for a
        point-mass drafter; None for one with `one_hot` False); cost, the drafter's
        forwards and seconds this round ({"forwards", "seconds", "catchup_seconds"}:
        `seconds` excludes the catch-up).
    """
    forwards, seconds, catchup = drafter.forwards, drafter.seconds, drafter.catchup_seconds
    x, q = drafter.propose(seq, k, sample)
    x = [int(t) for t in x]
    if q is None and one_hot:
        q = point_masses(x, sample.vocab_size)
    catchup = drafter.catchup_seconds - catchup
    return x, q, {"forwards": drafter.forwards - forwards, "catchup_seconds": catchup,
                  "seconds": drafter.seconds - seconds - catchup}


def score(target: CausalLM, seq: list[int], x: list[int], sampling: SamplingConfig,
          width: int | None = None, n_prompt: int = 0) -> tuple[torch.Tensor, float]:
    """One verification forward: the target's warped p_1..p_{k+1} after seq + x.

    Rows after x_k (up to `width` - k - 1 filler copies of x_k) may be added when a
    wider forward is cheaper on this hardware (CPU GEMM kernels: 8 rows can cost
    less than 3). Attention is causal, so rows after x_k change nothing before them;
    they are discarded here and their cache entries by the caller's truncate.

    Args:
        target: the target model; its cache must hold a prefix of seq[:-1].
        seq: committed tokens, len >= 1.
        x: k draft ids (may be empty).
        sampling: the warps and controls (the same the drafts got); row i's
            controls see seq + x_1..x_i as history.
        width: tokens to score, >= k + 1 (default k + 1).
        n_prompt: how many tokens of seq are the prompt (for the controls).

    Returns:
        (p, seconds): p [k+1, V] float32 (float64 for float64 models), row i the
        target's distribution after seq + x_1..x_i; seconds, the forward's wall time.

    Raises:
        RuntimeError: if the target returns another number of rows than scored
            (a backend whose cache is out of step with its `tokens`).
    """
    _, p, seconds = _verification_forward(target, seq, x, sampling, width, n_prompt)
    return p, seconds


def decoded_logits(target: CausalLM, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """Next-token logits after `prompt` + each prefix of `tokens`, computed as `decode` computes them.

    `decode` prefills the prompt but its last token in one forward with keep=1 (on
    llama.cpp's batch-invariant mode: the fast prefill kernels) and computes every later
    position in decode forwards (the kernels on which a row does not depend on the batch).
    This does the same, so a reference scores the very numbers a generation saw: it
    prefills prompt[:-1] unless the cache already starts with it (otherwise it resets the
    cache first), then runs the rest, after the longest cached common prefix, in one
    forward that returns all its rows (never mistaken for a prefill).

    Args:
        target: the model; its cache is left holding prompt + tokens.
        prompt: prompt ids, len >= 1.
        tokens: the ids after the prompt (may be empty).

    Returns:
        [n, V] float32 logits for the last n >= 1 positions of prompt + tokens (those the
        cache did not hold); row -1 is the next-token logits after all of them.

    Raises:
        ValueError: an empty prompt.
    """
    prompt, context = list(prompt), list(prompt) + list(tokens)
    if not prompt:
        raise ValueError("decoded_logits needs a non-empty prompt")
    head = prompt[:-1]
    if head and target.tokens[:len(head)] != head:
        target.reset()
        target.forward(head, keep=1)
    target.rollback_to(context)
    new = context[len(target.tokens):]
    return target.forward(new, keep=len(new))


def _verification_forward(target: CausalLM, seq: list[int], x: list[int], sampling: SamplingConfig,
                          width: int | None, n_prompt: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """`score`, also returning the raw logits rows 0..k ([k+1, V]) the warped p came from."""
    k = len(x)
    width = max(k + 1, width or 0)
    before = target.forward_seconds
    logits = target.sync(seq + x + x[-1:] * (width - k - 1), keep=width)
    if logits.shape[0] != width:
        raise RuntimeError(f"{target.name}: verification returned {logits.shape[0]} rows for "
                           f"{width} positions; its cache is out of step")
    logits = logits[:k + 1]
    p = warp(logits, sampling, seq, n_prompt, x)
    return logits, p, target.forward_seconds - before


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, ties to the lowest id (as `warp`), for logits [n, V].

    On a CPU float32/float64 tensor numpy's argmax on the same memory (~5 µs a row of a 152k
    vocabulary against ~75 µs for torch's max on one thread: ~0.3 % of a 26 ms plain step);
    elsewhere torch's max. Both return the first maximum, and both let a NaN win the row, so
    a NaN row is caught by the value at the argmax.

    Raises:
        FloatingPointError: NaN logits in a row (`warp`'s guard).
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        rows = logits.detach().numpy()
        best = rows.argmax(-1)
        if np.isnan(rows[np.arange(rows.shape[0]), best]).any():
            raise FloatingPointError(NAN_LOGITS)
        return best.tolist()
    top, best = logits.max(-1)                   # max propagates NaN: the same guard as `warp`
    if bool(top.isnan().any()):
        raise FloatingPointError(NAN_LOGITS)
    return best.tolist()


def _greedy_verification(target: CausalLM, seq: list[int], x: list[int], q: torch.Tensor | None,
                         width: int) -> tuple[int, int, torch.Tensor, tuple[torch.Tensor, ...], float]:
    """A verification under greedy decoding without controls, on the raw logits' argmax.

    There p_i is the point mass on a*_i, the argmax of row i (ties: the lowest id, as
    `warp`), so every rule that declares `argmax_under_greedy` (the standard rule: accept
    iff u·q(x_i) < p(x_i), i.e. iff x_i = a*_i, whatever q; residual max(0, p - q) ∝ p;
    the coupled rule: y_i ~ p_i is a*_i) accepts the longest prefix of x equal to a* and
    then emits a*_{n+1}. No [k+1, V] warp, no [k, V] one-hot q: at k = 8 on a 152k
    vocabulary those cost ~5 ms a round on a 2-core CPU, 7 % of a 70 ms verification.

    Args:
        target: the target; its cache holds a prefix of seq[:-1].
        seq: committed tokens, len >= 1.
        x: k >= 0 draft ids.
        q: [k, V] the drafter's q, or None for a point-mass drafter.
        width: rows to score, >= k + 1 (filler copies of x_k after the drafts).

    Returns:
        (n, y, logits, (alphas, px, qx), seconds): n accepted, y the token after them;
        logits [k+1, V] raw rows; alphas, px, qx [k] in p's dtype (float32, float64 for a
        float64 model) as the full path computes them: α_i = Σ min(p_i, q_i) = q_i(a*_i),
        p_i(x_i) = [x_i = a*_i], q_i(x_i) (1 for a point mass); all three None for k = 0.

    Raises:
        FloatingPointError: NaN logits in a scored row (`warp`'s guard).
        RuntimeError: if the target returns another number of rows than scored.
    """
    k = len(x)
    before = target.forward_seconds
    logits = target.sync(seq + x + x[-1:] * (width - k - 1), keep=width)
    seconds = target.forward_seconds - before
    if logits.shape[0] != width:
        raise RuntimeError(f"{target.name}: verification returned {logits.shape[0]} rows for "
                           f"{width} positions; its cache is out of step")
    logits = logits[:k + 1]
    best = _argmax_rows(logits)
    if not k:                                    # a plain step: nothing to rate (the hot path)
        return 0, best[0], logits, (None, None, None), seconds
    n = next((i for i in range(k) if x[i] != best[i]), k)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    px = torch.tensor([float(a == b) for a, b in zip(x, best)], dtype=dtype)
    if q is None:
        rates = (px, px, torch.ones(k, dtype=dtype))
    else:
        q = q.to(dtype)
        rates = (q.gather(-1, torch.tensor(best[:k], dtype=torch.long)[:, None]).squeeze(-1), px,
                 q.gather(-1, torch.tensor(x, dtype=torch.long)[:, None]).squeeze(-1))
    return n, best[n], logits, rates, seconds


def _hot_path(fn):
    """Run `fn(target, ...)` inside `target.decoding()` (backend settings for the hot path)."""
    @functools.wraps(fn)
    def run(target, *args, **kwargs):
        with target.decoding():
            return fn(target, *args, **kwargs)
    return run


@_hot_path
def decode(
    target: CausalLM,
    prompt: Sequence[int],
    policy: Policy,
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    rng: Randomness,
    rule: Rule = standard,
    stop: Callable[[list[int]], bool] | None = None,
    on_commit: Callable[[list[int]], None] | None = None,
    observer: Callable[[RoundRecord], None] | None = None,
    eos_token_ids: Collection[int] | None = None,
) -> DecodeResult:
    """Generate up to `max_new_tokens` tokens exactly as the target alone would.

    Args:
        target: the target model p (its cache is reset to the prompt).
        prompt: token ids, len >= 1.
        policy: picks (drafter, k) each round; k = 0 or drafter None is a plain step.
        sampling: warps shared by p and q; temperature 0 is greedy.
        max_new_tokens: exact budget (a block is never allowed to exceed it).
        rng: all randomness, keyed by output position (draft samples, uniforms,
            recovered/bonus draws).
        rule: the acceptance rule (`verispec.verify.RULES`); default min(1, p/q).
        stop: called with the new tokens after each committed token; True ends
            generation right after that token (stop strings).
        on_commit: called with each round's committed tokens (streaming).
        observer: called with every `RoundRecord` (audit, analysis), after the round's
            tokens are committed and the caches rolled back, before `on_commit`. An
            exception it raises ends the generation there and propagates (a server's
            cancellation): the target's cache then holds the committed sequence but
            its last token, the drafters are rolled back to it, and nothing else runs.
        eos_token_ids: the ids that end generation (kept in the output, finish reason
            "eos"); None = the target's. A server passes the target's plus a request's
            `stop_token_ids`, or only those to ignore EOS.

    Returns:
        DecodeResult with the new tokens (EOS included when it ended
        generation) and the statistics.

    Raises:
        ValueError: if the prompt is empty or does not fit the context.
        RuntimeError: if the target returns a different number of logit rows
            than the verification forward scored (a backend whose cache is out
            of step with its `tokens`).
    """
    prompt = list(prompt)
    if not prompt:
        raise ValueError("prompt is empty: give at least one token")
    if len(prompt) >= target.context_length:
        raise ValueError(f"prompt has {len(prompt)} tokens but {target.name}'s context length is "
                         f"{target.context_length}; shorten the prompt")
    stats = Stats(seed=getattr(rng, "seed", None), rule=rule.name)
    start = time.perf_counter()
    seq, out = list(prompt), []
    target.rollback_to(seq)
    if len(target.tokens) < len(seq) - 1:       # prefill all but the last prompt token
        t = time.perf_counter()
        target.forward(seq[len(target.tokens):-1], keep=1)
        stats.prefill_seconds = time.perf_counter() - t
    vocab = target.vocab_size
    eos = target.eos_token_ids if eos_token_ids is None else frozenset(eos_token_ids)
    # a plain greedy step needs only the argmax of the raw logits: the warped p is the point
    # mass there (ties to the lowest id in both) and every exact rule emits that token at k = 0;
    # a drafted one too, for the rules that say so (`_greedy_verification`)
    argmax_only = sampling.greedy and not sampling.has_controls
    argmax_rule = argmax_only and getattr(rule, "argmax_under_greedy", False)
    no_drafts = torch.zeros(0)

    while len(out) < max_new_tokens:
        room = target.context_length - len(seq)
        if room <= 0:
            stats.finish_reason = "context"
            break
        drafter, k = policy.choose(seq)
        k = max(0, min(k, max_new_tokens - len(out) - 1, room - 1)) if drafter is not None else 0
        x, q, cost = [], None, {"forwards": 0, "seconds": 0.0, "catchup_seconds": 0.0}
        if k:
            sample = DraftSampler(sampling, rng, len(out), rule.draft_stream, vocab, seq, len(prompt))
            x, q, cost = propose(drafter, seq, k, sample, one_hot=not argmax_rule)
        k = len(x)
        width = min(max(k + 1, policy.verify_width(k + 1)), room) if k else 1
        waited = target.waited_seconds
        if argmax_rule or (not k and argmax_only):
            n, y, logits, (alphas, px, qx), t_target = _greedy_verification(target, seq, x, q, width)
        else:
            logits, p, t_target = _verification_forward(target, seq, x, sampling, width, len(prompt))
            if not k:
                q = p.new_zeros(0, vocab)
            q = q.to(p.dtype)
            xt = torch.tensor(x, dtype=torch.long)
            n, y = rule(p, q, xt, rng, len(out))
            alphas, px, qx = ((alpha(p[:k], q), p[:k].gather(-1, xt[:, None]).squeeze(-1),
                               q.gather(-1, xt[:, None]).squeeze(-1)) if k else (no_drafts,) * 3)

        committed = 0
        for token in x[:n] + [y]:
            seq.append(token)
            out.append(token)
            committed += 1
            if token in eos:
                stats.finish_reason = "eos"
            elif stop is not None and stop(out):
                stats.finish_reason = "stop_string"
            elif len(out) >= max_new_tokens:
                stats.finish_reason = "length"
            if stats.finish_reason:
                break
        target.truncate(len(seq) - 1)
        if k:
            drafter.rollback(seq)

        record = RoundRecord(
            drafter=drafter.name if k else "none", k=k, accepted=n, committed=committed,
            alphas=alphas if k else no_drafts, px=px if k else no_drafts,
            qx=qx if k else no_drafts, target_seconds=t_target,
            draft_seconds=cost["seconds"], catchup_seconds=cost["catchup_seconds"], width=width,
            tokens=out[len(out) - committed:], logits=logits, waited_seconds=target.waited_seconds - waited)
        stats.draft_forwards += cost["forwards"]
        stats.draft_seconds += cost["seconds"] + cost["catchup_seconds"]
        stats.record(record)
        stats.new_tokens = len(out)
        policy.observe(record)
        if observer is not None:
            observer(record)
        if on_commit is not None:
            on_commit(out[len(out) - committed:])
        if stats.finish_reason:
            break
    if not stats.finish_reason:
        stats.finish_reason = "length"
    stats.wall_seconds = time.perf_counter() - start
    return DecodeResult(tokens=out, stats=stats)
