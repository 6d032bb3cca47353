"""Seed-synced replay: where verispec knows the sampler, every token must equal its replay.

`verispec serve` samples with `SeededRandomness(seed)`: every random number is keyed by
(seed, output position, stream), so a request's output is a function of the prompt,
the settings, the seed, k and the rule alone (`verispec.serve.engine`). Replaying the
request locally with `SpeculativeDecoder.generate` (the same target and draft, the
same k and rule, the same seed) must then give the same tokens — a far stronger check
than any distributional test: one clean mismatch is a bug. With the coupled rule
("gumbel") the output is the plain seeded sample for every k, so the replay needs
neither the draft nor k (replay with k = 0).

A mismatch at a position where the two tokens' reference logits / T are within the
numerics floor (`margin`) is a near-tie: the server's kernels (batched verification
forwards) can move such a race by the last bits; it is counted, not failed. The replay
stops comparing a completion at its first mismatch (later tokens follow another prefix).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..decoding import decoded_logits
from ..sampling import SamplingConfig
from .probes import ProbeResult
from .scoring import NEAR_TIE_MARGIN

__all__ = ["replay_check"]


def replay_check(decoder, prompts: Sequence[Sequence[int]], drawn: dict, sampling: SamplingConfig, *,
                 k: int | str = 0, rule: str = "gumbel", margin: float = NEAR_TIE_MARGIN,
                 limit: int | None = None) -> ProbeResult:
    """Replay every drawn completion with its seed and compare token for token.

    Args:
        decoder: a `verispec.api.SpeculativeDecoder` over the server's target (and draft).
        prompts: prompt ids per prompt index; drawn: {prompt index: [Sample]} (with seeds).
        sampling: the request's warps and controls.
        k, rule: the server's draft length and acceptance rule ("gumbel": k is irrelevant).
        margin: the near-tie width in logits / T.
        limit: replay at most this many completions (None: all).

    Returns:
        A `ProbeResult` named "replay": FAIL on a clean mismatch (prompt, completion,
        position and both tokens in the detail), else pass (near-ties counted).
    """
    controls = dict(min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty,
                    presence_penalty=sampling.presence_penalty, frequency_penalty=sampling.frequency_penalty,
                    logit_bias=dict(sampling.logit_bias))
    checked = near = tokens = 0
    problems = []
    t = sampling.temperature or 1.0
    for j, samples in drawn.items():
        for i, s in enumerate(samples):
            if limit is not None and checked >= limit:
                break
            if s.seed is None or not s.token_ids:
                continue
            checked += 1
            out = decoder.generate(list(prompts[j]), max_new_tokens=len(s.token_ids),
                                   temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                   k=k, seed=int(s.seed), rule=rule, use_chat_template=False, **controls)
            local = list(out.token_ids)[:len(s.token_ids)]
            diff = next((p for p, (a, b) in enumerate(zip(s.token_ids, local)) if a != b), None)
            tokens += len(s.token_ids) if diff is None else diff
            if diff is None:
                continue
            target = decoder.target
            target.reset()
            logits = decoded_logits(target, prompts[j], s.token_ids[:diff])[-1].double() / t
            target.reset()
            a, b = s.token_ids[diff], local[diff]
            gap = abs(float(logits[a] - logits[b])) if torch.isfinite(logits[[a, b]]).all() else float("inf")
            if gap <= margin:
                near += 1
            elif not problems:
                problems.append(f"prompt {j + 1} completion {i + 1} (seed {s.seed}) position {diff + 1}: "
                                f"server token {a}, replay {b} (logit gap {gap:.3g} > {margin:g})")
    detail = (f"{checked} completions replayed, {tokens} tokens identical, {near} near-tie mismatches"
              + ("" if rule == "gumbel" else f" (rule {rule}, k {k})"))
    return ProbeResult("replay", "FAIL" if problems else "pass", "; ".join(problems) + ("; " if problems else "")
                       + detail, checked, near)
