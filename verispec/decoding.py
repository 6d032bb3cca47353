"""The speculative decode loop: draft k, verify in one target forward, commit, roll back.

One round, in the paper's notation (Leviathan et al. 2023, Algorithm 1):

    x_1..x_k, q_1..q_k  <- drafter.propose(S, k)          (k = 0: plain decoding)
    p_1..p_{k+1}        <- warp(target(S[-1], x_1..x_k))  (one forward, k+1 positions)
    n, dist             <- verify(p, q, x, u)
    S                   <- S + x_1..x_n + [y ~ dist]      (cut at EOS / budget / stop string)
    caches              <- truncated to the committed sequence

Invariant between rounds: the target's cache holds S[:-1]; the last committed
token is fed at the start of the next verification forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .models.base import CausalLM
from .sampling import Randomness, SamplingConfig, warp
from .verify import acceptance_rate, verify


class Drafter(Protocol):
    """Proposes draft tokens with the exact distribution q each was drawn from.

    Attributes:
        name: label in statistics ("model", "lookup", ...).
        forwards: draft-model forwards run so far (0 for model-free drafters).
        seconds: wall seconds spent drafting so far.
        catchup_seconds: the part of `seconds` spent feeding the draft context
            it missed (the prompt, tokens of plain rounds): a one-off cost, not
            a per-draft-token one.
    """

    name: str
    forwards: int
    seconds: float
    catchup_seconds: float

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                rng: Randomness) -> tuple[list[int], torch.Tensor]:
        """Draft up to k tokens after `context` (committed token ids, len >= 1).

        Returns:
            (x, q): x, a list of k' <= k token ids (k' = 0: nothing to propose);
            q, a [k', V'] float32 tensor whose row i is the exact warped
            distribution x_i was drawn from (a point mass for deterministic
            drafters); V' may be a prefix of the target's vocabulary (decode
            zero-pads it).
        """
        ...

    def rollback(self, committed: list[int]) -> None:
        """Forget drafted tokens that were not committed (`committed`: token ids)."""
        ...


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
        target_seconds: wall time of the verification forward (k+1 tokens).
        draft_seconds: wall time spent drafting this round, catch-up excluded.
        catchup_seconds: wall time the drafter spent this round feeding its model the
            context it had missed (the prompt, tokens of plain rounds).
        width: tokens in the verification forward: k + 1, or more when the policy
            asked for a wider, cheaper batch (`verify_width`).
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

    def __post_init__(self) -> None:
        if not self.width:
            self.width = self.k + 1


class Policy(Protocol):
    """Chooses the drafter and k each round (see `verispec.policy`)."""

    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        """(drafter, k) for the next round, given the committed tokens."""
        ...

    def observe(self, record: RoundRecord) -> None: ...

    # Optional: verify_width(n) -> int, the number of tokens (>= n) to run the
    # verification forward over when n = k + 1 are needed (filler rows after the
    # drafts, discarded). `decode` uses it when the policy has it.


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

    @property
    def acceptance_rate(self) -> float | None:
        """α̂ = accepted / drafted (None when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha_exact(self) -> float | None:
        """Mean of Σ_x min(p, q) over verified draft positions (lower variance than α̂)."""
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
        """All counters and derived figures, JSON-ready."""
        out = {k: v for k, v in self.__dict__.items()}
        for name in ("acceptance_rate", "alpha_exact", "tau", "tokens_per_second",
                     "per_position_acceptance", "overhead_seconds"):
            out[name] = getattr(self, name)
        return out


@dataclass
class DecodeResult:
    tokens: list[int]   # new tokens only
    stats: Stats


def decode(
    target: CausalLM,
    prompt: Sequence[int],
    policy: Policy,
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    rng: Randomness,
    stop: Callable[[list[int]], bool] | None = None,
    on_commit: Callable[[list[int]], None] | None = None,
    observer: Callable[[RoundRecord], None] | None = None,
) -> DecodeResult:
    """Generate up to `max_new_tokens` tokens exactly as the target alone would.

    Args:
        target: the target model p (its cache is reset to the prompt).
        prompt: token ids, len >= 1.
        policy: picks (drafter, k) each round; k = 0 or drafter None is a plain step.
        sampling: warps shared by p and q; temperature 0 is greedy.
        max_new_tokens: exact budget (a block is never allowed to exceed it).
        rng: all randomness (draft samples, uniforms, residual/bonus draws).
        stop: called with the new tokens after each committed token; True ends
            generation right after that token (stop strings).
        on_commit: called with each round's committed tokens (streaming).
        observer: called with every `RoundRecord` (audit, analysis).

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
    stats = Stats()
    start = time.perf_counter()
    seq, out = list(prompt), []
    target.rollback_to(seq)
    if len(target.tokens) < len(seq) - 1:       # prefill all but the last prompt token
        t = time.perf_counter()
        target.forward(seq[len(target.tokens):-1], keep=1)
        stats.prefill_seconds = time.perf_counter() - t
    vocab = target.vocab_size
    eos = target.eos_token_ids

    while len(out) < max_new_tokens:
        room = target.context_length - len(seq)
        if room <= 0:
            stats.finish_reason = "context"
            break
        drafter, k = policy.choose(seq)
        k = max(0, min(k, max_new_tokens - len(out) - 1, room - 1)) if drafter is not None else 0
        x, q, t_draft, t_catchup = [], None, 0.0, 0.0
        if k > 0:
            forwards, seconds, catchup = drafter.forwards, drafter.seconds, drafter.catchup_seconds
            x, q = drafter.propose(seq, k, sampling, rng)
            stats.draft_forwards += drafter.forwards - forwards
            stats.draft_seconds += drafter.seconds - seconds
            t_catchup = drafter.catchup_seconds - catchup
            t_draft = drafter.seconds - seconds - t_catchup
        k = len(x)
        if k:
            if q.shape[-1] < vocab:   # draft vocabulary is a prefix of the target's
                q = torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))

        # Optionally widen the verification forward with filler rows after the drafts
        # when a wider batch is cheaper on this hardware (CPU GEMM kernels: 8 rows can
        # cost less than 3). Attention is causal, so rows after x_k change nothing
        # before them; their cache entries are dropped by the truncate below.
        width = k + 1
        if k and hasattr(policy, "verify_width"):
            width = max(k + 1, min(int(policy.verify_width(k + 1)), room))
        t_target = target.forward_seconds
        logits = target.sync(seq + x + [x[-1]] * (width - k - 1) if k else seq, keep=width)
        t_target = target.forward_seconds - t_target
        if logits.shape[0] != width:
            raise RuntimeError(f"{target.name}: verification returned {logits.shape[0]} rows for "
                               f"{width} positions; its cache is out of step")
        logits = logits[:k + 1]
        p = warp(logits, sampling)
        xt = torch.tensor(x, dtype=torch.long)
        u = rng.uniform(k)
        n, dist = verify(p, q, xt, u) if k else (0, p[0])
        block = x[:n] + [rng.categorical(dist)]

        committed = 0
        for token in block:
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
            alphas=acceptance_rate(p[:k], q) if k else p.new_zeros(0),
            px=p[:k].gather(-1, xt[:, None]).squeeze(-1) if k else p.new_zeros(0),
            qx=q.gather(-1, xt[:, None]).squeeze(-1) if k else p.new_zeros(0),
            target_seconds=t_target, draft_seconds=t_draft, catchup_seconds=t_catchup,
            width=width,
        )
        stats.record(record)
        stats.new_tokens = len(out)
        policy.observe(record)
        if observer is not None:
            observer(record)
        if on_commit is not None:
            on_commit(block[:committed])
        if stats.finish_reason:
            break
    if not stats.finish_reason:
        stats.finish_reason = "length"
    stats.wall_seconds = time.perf_counter() - start
    return DecodeResult(tokens=out, stats=stats)
