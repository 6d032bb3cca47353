"""The acceptance test of speculative sampling, batched over the k draft positions.

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1; Chen et al. 2023, Algorithm 2):
p = target distribution, q = draft distribution, x_i = i-th draft token.

    accept x_i  iff  u_i * q_i(x_i) < p_i(x_i),   u_i ~ U[0, 1)     (P = min(1, p/q))
    first rejection at i: emit a token from the residual max(0, p_i - q_i) / Z
    all k accepted:       emit a bonus token from p_{k+1}

The emitted sequence is distributed exactly as k+1 (or fewer) tokens sampled
from p one at a time, because min(p, q) + max(0, p - q) = p for every token.
"""

from __future__ import annotations

import torch


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Residual distribution max(0, p - q) / Z  (Leviathan et al. 2023, eq. in §2.3).

    Args:
        p: [V] float32 target probabilities.
        q: [V] float32 draft probabilities (zero-padded to V).

    Returns:
        [V] float32. Normalised by division by its sum Z = 1 - Σ min(p, q)
        (never a softmax, never an epsilon floor). When Z == 0 (p == q, so a
        rejection has probability 0) it falls back to p, so no NaN can appear.
    """
    r = (p - q).clamp_min(0.0)
    z = r.sum()
    if not z > 0:
        return p
    return r / z


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact acceptance probability α = Σ_x min(p(x), q(x)) = 1 - TV(p, q).

    Args:
        p: [..., V] float target probabilities.
        q: [..., V] float draft probabilities, same shape.

    Returns:
        [...] float: the probability that a token drawn from q is accepted
        (Leviathan et al. 2023, Definition 3.1 / Corollary 3.6).
    """
    return torch.minimum(p, q).sum(-1)


def verify(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor
) -> tuple[int, torch.Tensor]:
    """Verify k draft tokens against one target forward.

    Args:
        p: [k+1, V] float32 warped target probabilities; row i is the target's
            distribution for draft position i+1 given the prefix and x_1..x_i,
            row k is the bonus position.
        q: [k, V] float32 warped draft probabilities that each x_i was drawn
            from (a deterministic drafter reports a point mass).
        x: [k] int64 draft token ids.
        u: [k] float32 uniforms in [0, 1).

    Returns:
        (n, dist): n in 0..k is the number of accepted drafts (counting stops
        at the first rejection); dist is the [V] float32 distribution of the
        one token emitted after them, the residual at position n+1 if n < k,
        else the bonus distribution p[k].
    """
    k = x.shape[0]
    if k == 0:
        return 0, p[0]
    px = p[:k].gather(-1, x[:, None]).squeeze(-1)
    qx = q.gather(-1, x[:, None]).squeeze(-1)
    accepted = u * qx < px
    n = int(accepted.to(torch.int64).cumprod(0).sum())
    if n == k:
        return n, p[k]
    return n, residual(p[n], q[n])
