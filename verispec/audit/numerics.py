"""The numerics floor: how far the target's own p moves with the shape of its forward.

A server verifying k drafts computes the target's logits for k + 1 positions in one
forward; plain decoding computes one position per forward. Floating-point kernels
whose reduction order depends on the batch (tiled matmuls, split attention) give
slightly different logits for the same position in the two cases, so even an exact
speculative sampler draws from a p that differs from the 1-token p by this much.
That difference is not a bias of the acceptance rule: the endpoint audit reports it
per position and calls a rejected test whose whole TV interval fits under it
"numerics", not FAIL.

`numerics_floor` measures it with the weights loaded locally: the warped p
(`verispec.sampling.warp`) at positions 1..m along one path (the samples' most
common m-token prefix), from m one-token forwards and from one m-token forward
(the verification shape), and their total variation per position. It is a
proxy for the server's kernels (the same weights, this machine's kernels); on
llama.cpp load the target with ``batch_invariant=False`` to measure the ordinary
kernels llama-server runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models.base import CausalLM
from ..sampling import SamplingConfig, warp

__all__ = ["numerics_floor"]


def numerics_floor(target: CausalLM, prompt: Sequence[int], path: Sequence[int],
                   sampling: SamplingConfig) -> list[float]:
    """TV between the warped p of 1-token forwards and of one verification forward.

    Args:
        target: the target model (its cache is reset).
        prompt: prompt token ids (>= 1).
        path: the m tokens whose positions are compared (only path[:m-1] is fed).
        sampling: temperature / top-k / top-p of the audit.

    Returns:
        m floats in [0, 1]: TV at positions 1..m (position 1 compares the prompt's last
        token fed alone with the same row as the first of an m-row forward).

    Raises:
        ValueError: for an empty prompt or path.
    """
    prompt, path = list(prompt), list(path)
    if not prompt or not path:
        raise ValueError("numerics_floor needs a non-empty prompt and path")
    m = len(path)
    target.reset()
    if len(prompt) > 1:
        target.sync(prompt[:-1], keep=1)
    single = []
    for i in range(m):                  # each a 1-token forward (the rest is cached)
        single.append(target.sync(prompt + path[:i], keep=1)[-1])
    target.reset()
    if len(prompt) > 1:
        target.sync(prompt[:-1], keep=1)
    batch = target.sync(prompt + path[:m - 1], keep=m)     # one m-token forward
    target.reset()
    one = warp(torch.stack(single).double(), sampling)
    many = warp(batch[-m:].double(), sampling)
    return [0.5 * float((a - b).abs().sum()) for a, b in zip(one, many)]
