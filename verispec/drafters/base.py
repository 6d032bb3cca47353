"""The drafter contract: what the decode loop and the policy may ask of a drafter.

A drafter proposes up to k tokens x_1..x_k after the committed context, with the
exact distribution q_i each was drawn from (Leviathan et al. 2023, Algorithm 1,
step 1). Two kinds exist:

* a *model* drafter samples x_i from its own warped distribution q_i, through the
  `DraftSampler` the loop hands it (so q gets exactly the warps p gets, and x_i is
  drawn from the randomness stream the acceptance rule needs);
* a *point-mass* drafter (prompt lookup, suffix decoding) proposes tokens
  deterministically from the context; its q_i is δ_{x_i}, and it returns q = None.

Optional parts of the contract, each a runtime-checkable protocol below
(`isinstance(drafter, SupportsConfidences)`; the adaptive policy uses them when present):

* `confidences(context)`: a point-mass drafter's evidence for each token it would
  propose now (`Confidence`: the continuation's empirical frequency, the match
  length it is conditioned on, the occurrences counted), so the policy can learn
  α as a function of the evidence and draft only on the rounds that pay;
* `catchup_tokens(context)`: how many context tokens the drafter must read before
  it can draft (a draft model's cache after the prompt or plain rounds), so the
  policy can charge that catch-up *before* choosing the drafter;
* `calibrate(context)`: time reading a prefix of the context (work a later
  catch-up does anyway) -> (seconds per caught-up token, seconds per drafted token).

A new drafter is one file in `verispec/drafters/` plus one line in
`verispec.drafters.DRAFTERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..sampling import Randomness, SamplingConfig, warp


class DraftSampler:
    """Turns a draft model's logits into (x_i, q_i) for one round, i = 1, 2, ...

    q_i = warp(logits, sampling), the same warps the target's p gets, zero-padded
    to the target's vocabulary (a draft vocabulary may be a prefix of it), and x_i
    is drawn from q_i with the randomness of output position `position` + i - 1 on
    the stream the acceptance rule asks for (`Rule.draft_stream`).

    History-dependent controls (penalties, bans, `verispec.controls`) see the
    committed tokens plus x_1..x_{i-1} at draft position i, exactly as the target's
    p_i does in `verispec.decoding.score`.

    Args:
        sampling: the warps and controls shared by p and q.
        rng: the decode's randomness.
        position: output position t of x_1 (0 = the first new token).
        stream: randomness stream for the drafts ("draft" or "sample").
        vocab_size: V, the target's number of logits.
        history: the committed tokens, prompt included (for the controls).
        n_prompt: how many of them are the prompt.
    """

    def __init__(self, sampling: SamplingConfig, rng: Randomness, position: int, stream: str,
                 vocab_size: int, history: Sequence[int] = (), n_prompt: int = 0) -> None:
        self.sampling, self.rng, self.position, self.stream = sampling, rng, position, stream
        self.vocab_size, self.history, self.n_prompt = vocab_size, history, n_prompt
        self.drafted: list[int] = []

    def __call__(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Draw the next draft token.

        Args:
            logits: [V'] the draft's logits after the context and the drafts so far
                (V' <= V).

        Returns:
            (x_i, q_i): the token id and the [V] float distribution it was drawn from.
        """
        history = list(self.history) + self.drafted if self.sampling.has_controls else None
        q = warp(logits, self.sampling, history, self.n_prompt)
        if q.shape[-1] < self.vocab_size:
            q = torch.nn.functional.pad(q, (0, self.vocab_size - q.shape[-1]))
        x = self.rng.categorical(q, self.position + len(self.drafted), self.stream)
        self.drafted.append(x)
        return x, q


@dataclass(frozen=True)
class Confidence:
    """A point-mass drafter's evidence for one drafted token x_i (SuffixDecoding,
    Oliaro et al. 2024, §3.2, scores a draft by the same frequencies).

    Attributes:
        frequency: empirical P(x_i | matched text) = count(s·x_1..x_i) /
            count(s·x_1..x_{i-1}·any) over the indexed text, in [0, 1].
        match_length: tokens the frequency is conditioned on: the matched suffix s
            of the context plus x_1..x_{i-1}, >= 1.
        support: occurrences counted in the frequency's denominator, >= 1.
    """

    frequency: float
    match_length: int
    support: int

    @property
    def cell(self) -> tuple[int, int]:
        """The (match-length, frequency) bin the policy learns α in.

        Match length in powers of two: 1, 2-3, 4-7, 8-15, 16-31, >= 32 tokens (bins 0-5).
        Frequency: < 0.5, [0.5, 0.8), [0.8, 1), 1 seen once, 1 seen at least twice (bins 0-4).
        """
        length = min(max(self.match_length, 1).bit_length() - 1, 5)
        f = self.frequency
        freq = (4 if self.support >= 2 else 3) if f >= 1.0 else 2 if f >= 0.8 else 1 if f >= 0.5 else 0
        return length, freq


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens with the exact distribution q each was drawn from.

    Attributes:
        name: label in statistics and the policy ("model", "lookup", ...).
        point_mass: True when proposals are deterministic given the context
            (q = δ_x; `propose` returns q = None).
        alpha_prior: the acceptance rate the adaptive policy assumes before it has
            measured any (a draft model's guess is a stronger promise than an n-gram match).
        forwards: draft-model forwards run so far (0 for model-free drafters).
        seconds: wall seconds spent drafting so far.
        catchup_seconds: the part of `seconds` spent feeding the draft the context
            it missed (the prompt, tokens of plain rounds): a one-off cost, not a
            per-draft-token one.
    """

    name: str
    point_mass: bool
    alpha_prior: float
    forwards: int
    seconds: float
    catchup_seconds: float

    def available(self, context: Sequence[int]) -> int:
        """How many tokens a proposal after `context` could hold now (0: none)."""
        ...

    def propose(self, context: list[int], k: int,
                sample: DraftSampler) -> tuple[list[int], torch.Tensor | None]:
        """Draft up to k tokens after `context` (committed token ids, len >= 1).

        Args:
            context: committed tokens, prompt included.
            k: the most tokens to propose, >= 1.
            sample: draws (x_i, q_i) from the drafter's logits (model drafters).

        Returns:
            (x, q): x, a list of k' <= k token ids (k' = 0: nothing to propose);
            q, a [k', V] float tensor whose row i is the exact distribution x_i was
            drawn from, or None for a point-mass drafter.
        """
        ...

    def rollback(self, committed: list[int]) -> None:
        """Forget drafted tokens that were not committed (`committed`: token ids)."""
        ...

    def reset(self) -> None:
        """Forget all state tied to earlier text (caches, indexes)."""
        ...


# Optional parts of the contract (see the module docstring). A drafter has one when it
# defines the method; the policy asks with isinstance(drafter, SupportsConfidences), etc.

@runtime_checkable
class SupportsConfidences(Protocol):
    """A point-mass drafter that reports its evidence for each token it would propose."""

    def confidences(self, context: Sequence[int]) -> list[Confidence]:
        """Evidence for each token `propose(context, k)` would return, in order
        (len == available(context); propose returns a prefix of that proposal)."""
        ...


@runtime_checkable
class SupportsCatchup(Protocol):
    """A drafter that must read context it lacks before drafting (a draft model's cache)."""

    def catchup_tokens(self, context: Sequence[int]) -> int:
        """Context tokens the drafter must read before drafting after `context`."""
        ...


@runtime_checkable
class SupportsCalibrate(Protocol):
    """A drafter that can time its own catch-up and drafting (a draft model)."""

    def calibrate(self, context: Sequence[int]) -> tuple[float, float] | None:
        """(seconds per caught-up token, seconds per drafted token), timed on a
        prefix of `context`; None when the context is too short to time."""
        ...


def point_masses(x: Sequence[int], vocab_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[len(x), V] one-hot rows: the q of a deterministic drafter (q_i = δ_{x_i})."""
    q = torch.zeros(len(x), vocab_size, dtype=dtype)
    if len(x):
        q[torch.arange(len(x)), torch.tensor(list(x), dtype=torch.long)] = 1.0
    return q
