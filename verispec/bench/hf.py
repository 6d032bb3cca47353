"""transformers' own `generate` as a benchmarked method (plain, assisted, prompt lookup).

It runs beside verispec for comparison only, on the same `HFModel`s: `generate` gets the
wrapped module (`HFModel.transformers_model`), explicit settings (greedy, or pure temperature
sampling with top-k and top-p off, repetition penalty 1) so the model's
generation_config cannot change them, and its target forwards are counted with a
forward pre-hook to give τ.
"""

from __future__ import annotations

import time
from typing import Any

from ..text import decode_text
from .methods import BenchError

__all__ = ["hf_generate"]

HF_MODES = ("plain", "assisted", "prompt-lookup")
PROMPT_LOOKUP_TOKENS = 10   # HF's prompt_lookup_num_tokens, as in its documentation


class _ForwardCounter:
    """Counts calls of an nn.Module (HF generate's model forwards) while active."""

    def __init__(self, module) -> None:
        self.module, self.count, self.handle = module, 0, None

    def __enter__(self):
        if self.module is not None:
            self.handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def _hook(self, *args) -> None:
        self.count += 1

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.remove()


def hf_generate(target, ids: list[int], *, mode: str = "plain", assistant=None, max_new_tokens: int,
                temperature: float = 0.0, seed: int = 0) -> dict:
    """One timed transformers `generate` call on `target` (greedy, or pure temperature sampling).

    Args:
        target: an `HFModel` (the transformers backend).
        ids: prompt token ids.
        mode: "plain", "assisted" (`assistant_model=` the assistant's module, HF's defaults) or
            "prompt-lookup" (`prompt_lookup_num_tokens=10`).
        assistant: the draft `HFModel` for "assisted", else None.
        max_new_tokens: token budget.
        temperature: 0 = greedy; > 0 samples with `torch.manual_seed(seed)`.
        seed: the sampling seed.

    Returns:
        Row fields as `run_one`'s: new_tokens (cut after the first EOS), wall_seconds,
        tokens_per_second, target_forwards and draft_forwards (module calls, prefill
        included), tau, finish_reason, token_ids, text; draft_acceptance_rate,
        alpha_exact, k_hist and by_drafter are None (not observable in `generate`).

    Raises:
        BenchError: naming --backend when `target` (or the assistant) is not an
            `HFModel`, or for an unknown mode / a missing assistant.
    """
    import torch

    from ..models.hf import HFModel

    if mode not in HF_MODES:
        raise BenchError(f"HF generate mode must be one of {', '.join(HF_MODES)}, got {mode!r}")
    for role, m in (("target", target), ("assistant", assistant)):
        if m is not None and not isinstance(m, HFModel):
            raise BenchError(f"HF generate needs --backend transformers; the {role} {m.name} is "
                             f"a {type(m).__name__}")
    if (mode == "assisted") != (assistant is not None):
        raise BenchError("HF generate: mode 'assisted' needs an assistant (the draft), and only it takes one")
    model = target.transformers_model
    eos = sorted(target.eos_token_ids)
    # explicit values: HF fills unset ones from the model's generation_config (e.g.
    # Qwen's sampling defaults, repetition_penalty) and its global top_k=50
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, do_sample=temperature > 0, repetition_penalty=1.0,
        eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    if temperature > 0:   # pure temperature sampling, like ours with top_k=0, top_p=1
        kwargs.update(temperature=float(temperature), top_k=0, top_p=1.0)
    if mode == "assisted":
        kwargs["assistant_model"] = assistant.transformers_model
    elif mode == "prompt-lookup":
        kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    input_ids = torch.tensor([ids], dtype=torch.long, device=target.device)
    mask = torch.ones_like(input_ids)
    if temperature > 0:
        torch.manual_seed(seed)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()   # HF's own deprecation notes would break the progress bar
    try:
        with _ForwardCounter(model) as t_count, \
                _ForwardCounter(assistant.transformers_model if assistant is not None else None) as d_count, \
                torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(input_ids, attention_mask=mask, **kwargs)
            wall = time.perf_counter() - start
    finally:
        hf_logging.set_verbosity(verbosity)
    new = [int(t) for t in out[0, len(ids):].tolist()]
    finish = "length"
    for i, t in enumerate(new):
        if t in target.eos_token_ids:
            new, finish = new[:i + 1], "eos"
            break
    tok = target.tokenizer
    return {
        "new_tokens": len(new), "wall_seconds": wall,
        "tokens_per_second": len(new) / wall if wall > 0 else None,
        "target_forwards": t_count.count, "draft_forwards": d_count.count,
        "tau": len(new) / t_count.count if t_count.count else None,
        "draft_acceptance_rate": None, "alpha_exact": None, "k_hist": None, "by_drafter": None,
        "finish_reason": finish, "token_ids": new,
        "text": decode_text(tok, new) if tok is not None else "",
    }
