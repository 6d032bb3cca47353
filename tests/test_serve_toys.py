"""Toy models and helpers for the server tests (no test functions here).

The toys are `verispec.models.toy.FunctionModel`s — exact functions of the prefix, no
tokenizer — behind the same HTTP layer, so the server's own logic (queue, streaming,
cancellation, counters, validation) is tested in milliseconds.
"""

from __future__ import annotations

import json
import re
import threading
import time

import torch

from verispec.api import SpeculativeDecoder
from verispec.models.toy import FunctionModel

V = 16            # toy vocabulary
CONTEXT = 64      # toy context length


def toy_logits(prefix: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """[V] float64 logits, a fixed random function of the last two tokens."""
    key = (prefix[-1] * 31 + (prefix[-2] if len(prefix) > 1 else 0) * 7 + salt) % 10007
    return torch.randn(V, generator=torch.Generator().manual_seed(key), dtype=torch.float64) * 3


def draft_logits(prefix: tuple[int, ...]) -> torch.Tensor:
    """The target's logits plus noise: a draft that agrees often, not always."""
    return toy_logits(prefix) + 1.5 * toy_logits(prefix, salt=1)


class CountingModel(FunctionModel):
    """A toy that counts the tokens fed to it (prefix-reuse checks) and can be gated:
    each forward waits for one `gate` permit when a gate is set."""

    def __init__(self, fn, name: str, gate: threading.Semaphore | None = None, **kw) -> None:
        super().__init__(fn, V, context_length=CONTEXT, name=name, **kw)
        self.gate, self.fed = gate, 0

    def _extend(self, tokens, keep):
        if self.gate is not None:
            self.gate.acquire()
        self.fed += len(tokens)
        return super()._extend(tokens, keep)


def toy_decoder(gate: threading.Semaphore | None = None, draft: bool = True, **kw) -> SpeculativeDecoder:
    target = CountingModel(toy_logits, "toy", gate=gate, **kw)
    d = CountingModel(draft_logits, "toy-draft", **kw) if draft else None
    return SpeculativeDecoder(target, d, drafter="auto" if draft else "none")


def sse_events(lines) -> list:
    """Decoded `data:` payloads of an SSE stream ("[DONE]" kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    """Poll `predicate` until true (a state change, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def metric_totals(text: str) -> dict[str, float]:
    """Prometheus exposition -> {name{labels}: value} (comments skipped), the `model_name`
    label every series carries left out of the key."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = re.sub(r'model_name="[^"]*",?', "", name).replace(",}", "}").replace("{}", "")
            out[name] = float(value)
    return out
