"""Sampling controls that depend on the text so far: penalties, biases, bans, a minimum length.

A control is a function of (logits, the tokens before this position, the number of
tokens generated so far). Speculative sampling stays exact with controls only if
every distribution it compares is the *controlled* one: p_i for draft position i
must be computed with the committed tokens *plus* x_1..x_{i-1} as its history,
and q_i with exactly the same history (Leviathan et al. 2023, §2.3: the rule is
exact for whatever p and q it is handed; the output then follows the controlled
target, which is what plain sampling with the same controls draws from). Peers
have got this wrong by skipping processors on draft positions, using the
history of the last committed token for every position, or applying them to the
target only; `apply_controls` takes the drafts explicitly so none of these can
happen here.

Order, as Hugging Face `generate()` applies its processors (then temperature,
top-k, top-p and min-p follow in `verispec.sampling.warp`):

1. ``logit_bias``: add bias[id] (OpenAI `logit_bias`; HF `sequence_bias` for
   single tokens).
2. ``repetition_penalty`` r (Keskar et al. 2019, CTRL, §4.1; HF's definition): for
   every id in prompt + output, a logit l > 0 becomes l / r, l <= 0 becomes l · r.
3. ``presence_penalty`` a and ``frequency_penalty`` b (OpenAI's definition, over
   the *generated* tokens only): l[id] -= a · [c[id] > 0] + b · c[id], c = counts.
4. ``bad_words_ids``: a one-token entry bans that id (−∞); a longer entry bans
   its last id when the history ends with the rest (HF `NoBadWordsLogitsProcessor`).
5. ``min_new_tokens``: the ids in ``eos_token_ids`` get −∞ while fewer than that
   many tokens have been generated (HF `MinNewTokensLengthLogitsProcessor`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .sampling import SamplingConfig


def apply_controls(logits: torch.Tensor, config: "SamplingConfig", history: Sequence[int],
                   n_prompt: int, drafts: Sequence[int] = ()) -> torch.Tensor:
    """Apply the history-dependent controls of `config` to each row of `logits`.

    Args:
        logits: [n, V] (or [V]) float logits; row i is the next-token logits after
            history + drafts[:i].
        config: the sampling configuration (its controls; warps are not applied here).
        history: token ids before row 0: the prompt followed by the committed output.
        n_prompt: how many of `history`'s first tokens are the prompt (the rest are
            generated: they count for presence/frequency penalties and min_new_tokens).
        drafts: draft tokens x_1..x_{n-1} (at least n - 1 of them) that rows 1..n-1 follow.

    Returns:
        A new tensor of the same shape and dtype (−∞ for banned tokens).

    Raises:
        ValueError: if fewer than n - 1 drafts are given for n rows.
    """
    one_row = logits.dim() == 1
    out = (logits[None] if one_row else logits).clone()
    n, vocab = out.shape
    if len(drafts) < n - 1:
        raise ValueError(f"{n} rows need at least {n - 1} drafts, got {len(drafts)}")
    history = list(history)
    generated = Counter(history[n_prompt:])
    seen = set(history)
    biases = [(i, b) for i, b in config.logit_bias if i < vocab]
    ban_now = [w[0] for w in config.bad_words_ids if len(w) == 1 and w[0] < vocab]
    long_words = [w for w in config.bad_words_ids if len(w) > 1 and w[-1] < vocab]
    eos = [i for i in config.eos_token_ids if i < vocab]
    for i in range(n):
        if i:
            token = int(drafts[i - 1])
            history.append(token)
            generated[token] += 1
            seen.add(token)
        row = out[i]
        if biases:
            ids = torch.tensor([j for j, _ in biases])
            row[ids] += torch.tensor([b for _, b in biases], dtype=row.dtype)
        if config.repetition_penalty != 1.0 and seen:
            ids = torch.tensor([j for j in seen if j < vocab], dtype=torch.long)
            values = row[ids]
            r = config.repetition_penalty
            row[ids] = torch.where(values > 0, values / r, values * r)
        if (config.presence_penalty or config.frequency_penalty) and generated:
            ids = torch.tensor([j for j in generated if j < vocab], dtype=torch.long)
            counts = torch.tensor([generated[j] for j in ids.tolist()], dtype=row.dtype)
            row[ids] -= config.presence_penalty + config.frequency_penalty * counts
        banned = list(ban_now)
        for word in long_words:
            prefix = list(word[:-1])
            if history[len(history) - len(prefix):] == prefix:
                banned.append(word[-1])
        if eos and len(history) - n_prompt < config.min_new_tokens:
            banned.extend(eos)
        if banned:
            row[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    return out[0] if one_row else out
