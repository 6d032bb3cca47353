"""The endpoint audit's seed check: do a server's seeds reproduce and vary its samples?"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .endpoint import Endpoint, EndpointSettings

__all__ = ["SeedCheck", "seed_check"]


@dataclass
class SeedCheck:
    """Does the endpoint's `seed` work? (two identical seeded requests, then other seeds)

    Attributes:
        reproducible: two requests with one seed gave the same tokens.
        varies: some of `tries` other seeds gave different tokens.
        tries: how many other seeds were tried.
    """

    reproducible: bool
    varies: bool
    tries: int
    samples: list[list[int]] = field(default_factory=list)


def seed_check(endpoint: Endpoint, settings: EndpointSettings, tries: int = 4,
               seed: int = 2_000_000_000) -> SeedCheck:
    """The cheap separate check of the endpoint's seeds (2 + `tries` requests).

    With a sampling temperature > 0 and m tokens, different seeds give different
    samples unless the distribution is nearly a point mass; `varies` False then
    means either that, or a server that ignores `seed` (read it with the audit's p).
    """
    prompt = settings.prompt if isinstance(settings.prompt, str) else list(settings.prompt)
    ask = lambda s: endpoint.complete(prompt, settings.m, settings.temperature,
                                      settings.top_k, settings.top_p, s).token_ids
    a, b = ask(seed), ask(seed)
    others = [ask(seed + 1 + i) for i in range(tries)]
    return SeedCheck(reproducible=a == b, varies=any(o != a for o in others), tries=tries,
                     samples=[a, b, *others])
