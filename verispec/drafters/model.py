"""A draft model: proposes k tokens by sampling from its own warped distribution."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models.base import CausalLM
from .base import DraftSampler


class ModelDrafter:
    """Draft with a smaller causal LM (Leviathan et al. 2023, Algorithm 1, step 1).

    Args:
        model: the draft model q; it must share the target's tokenizer (its
            vocabulary may be a prefix of the target's).

    Each proposal feeds whatever part of the context the draft's cache lacks
    (after a fully accepted block that is the last draft token plus the bonus
    token), then runs k - 1 single-token forwards. The last draft token is not
    fed: the next round's `sync` feeds it if it was accepted.
    """

    name = "model"
    point_mass = False
    alpha_prior = 0.6

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.catchup_seconds = 0.0   # feeding context the draft missed (prompt, plain rounds)

    @property
    def forwards(self) -> int:
        return self.model.forwards

    @property
    def seconds(self) -> float:
        return self.model.forward_seconds

    def available(self, context: Sequence[int]) -> int:
        """Room left in the draft's context (tokens)."""
        return max(0, self.model.context_length - len(context))

    def catchup_tokens(self, context: Sequence[int]) -> int:
        """Context tokens the draft's cache lacks: what `propose` must feed before drafting."""
        cached = self.model.tokens
        n = min(len(cached), len(context) - 1)
        if cached[:n] != list(context[:n]):
            n = next(i for i in range(n) if cached[i] != context[i])
        return len(context) - n

    def calibrate(self, context: Sequence[int], chunk: int = 16) -> tuple[float, float] | None:
        """Time the draft on a prefix of `context` that its cache lacks (work the first
        catch-up would do anyway): one untimed warm-up chunk, one timed chunk of
        `chunk` tokens, then one timed single-token forward.

        Returns:
            (seconds per caught-up token, seconds per drafted token), or None when the
            context has fewer than 2 * chunk + 2 tokens the cache lacks.
        """
        context = list(context)
        self.model.rollback_to(context)
        have = len(self.model.tokens)
        if len(context) - 1 - have < 2 * chunk + 1 or max(context) >= self.model.vocab_size:
            return None
        self.model.forward(context[have:have + chunk], keep=1)            # warm-up
        start = self.model.forward_seconds
        self.model.forward(context[have + chunk:have + 2 * chunk], keep=1)
        prefill = (self.model.forward_seconds - start) / chunk
        start = self.model.forward_seconds
        self.model.forward(context[have + 2 * chunk:have + 2 * chunk + 1], keep=1)
        return prefill, self.model.forward_seconds - start

    def propose(self, context: list[int], k: int,
                sample: DraftSampler) -> tuple[list[int], torch.Tensor | None]:
        """Draw x_1..x_k from the draft.

        Args:
            context: committed tokens (prompt + generated), len >= 1.
            k: number of drafts, >= 1.
            sample: turns each row of draft logits into (x_i, q_i).

        Returns:
            (x, q): x is a list of k token ids; q is [k, V] with the exact warped
            distribution each x_i was sampled from. Empty when the context holds an
            id outside the draft's (prefix) vocabulary.
        """
        k = min(k, self.model.context_length - len(context))
        self.model.rollback_to(context)
        new = context[len(self.model.tokens):]
        if k <= 0 or max(new) >= self.model.vocab_size:
            # a target-only id (beyond a prefix vocabulary) cannot be fed to the draft
            return [], None
        if len(new) > 2:   # catch up on the prompt / plain rounds: not a per-draft-token cost
            start = self.model.forward_seconds
            self.model.forward(new[:-1], keep=1)
            self.catchup_seconds += self.model.forward_seconds - start
            new = new[-1:]
        logits = self.model.forward(new, keep=1)[-1]
        xs, qs = [], []
        for i in range(k):
            x, q = sample(logits)
            xs.append(x)
            qs.append(q)
            if i < k - 1:
                logits = self.model.forward([x])[-1]
        return xs, torch.stack(qs)

    def rollback(self, committed: list[int]) -> None:
        """Drop cached draft tokens that were not committed."""
        self.model.rollback_to(committed)

    def reset(self) -> None:
        self.model.reset()
