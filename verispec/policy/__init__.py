"""Choosing the drafter and the draft length k each round.

How many tokens are drafted never changes the output distribution (each round is exact
for any k, and k is chosen from the past only), so a policy is free to optimise speed
alone. The contract is `verispec.decoding.Policy`; the rooms, one idea each:

| room | idea |
|---|---|
| `fixed` | `FixedPolicy` (one drafter, one k) and `make_policy` (what `generate(k=...)` builds) |
| `adaptive` | `AdaptivePolicy`: the schedule (`choose`: best S, probes, refresh; `observe`) |
| `alphas` | α̂ per drafter, per position or per evidence cell, carried between generations |
| `costs` | `OnlineCostCurve`: T_t(n), T_d, catch-up, verification width; prices as a `theory.CostCurve` |
| `budget` | tokens left, the probe ration, whether a catch-up pays |
| `calibration` | timing the target and the self-timing drafters before the first round |
| `decayed` | the decayed mean every estimate is made of (refuses non-finite values) |
"""

from ..decoding import Policy
from .adaptive import AdaptivePolicy
from .costs import OnlineCostCurve
from .fixed import FixedPolicy, make_policy

__all__ = ["Policy", "AdaptivePolicy", "FixedPolicy", "make_policy", "OnlineCostCurve"]
