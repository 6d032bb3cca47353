"""Samplers for the statistical audit: ``seed -> new token ids`` for each implementation.

A sampler runs one seeded generation and returns its new token ids;
`verispec.audit.statistical` compares samplers by their samples. Here:

* `decode_sampler`: the shipped `verispec.decoding.decode` loop with any drafter,
  policy and acceptance rule, seeded through `SeededRandomness(seed)`;
* `rule_samplers`: the target alone (the reference), verispec's rule, and the
  biased shortcuts of `verispec.audit.rules`, all on the same loop;
* `hf_assisted_sampler`: transformers' assisted generation, a third-party
  implementation, seeded through torch's global RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from ..decoding import decode
from ..models.base import CausalLM
from ..models.toy import FunctionModel
from ..sampling import SamplingConfig, SeededRandomness
from ..verify import Rule
from .rules import NAIVE_RULES, as_rule, audited_rule
from .runs import policy_factory, single_thread
from .statistical import Sampler

__all__ = ["decode_sampler", "rule_samplers", "hf_assisted_sampler"]


def decode_sampler(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], m: int,
                   sampling: SamplingConfig, k: int | None = None,
                   rule: Rule | Callable | None = None) -> Sampler:
    """A sampler ``seed -> first m new tokens`` running the shipped `decode`.

    Each call runs ``decode(..., rng=SeededRandomness(seed), rule=rule)`` with a
    fresh policy, so the same seed gives the same tokens.

    Args:
        target: the target model.
        drafter_or_policy_factory: a `Drafter`, a policy factory, or None (target
            alone); see `verispec.audit.runs.policy_factory`.
        prompt: prompt token ids.
        m: new tokens per sample (fewer when generation ends at EOS).
        sampling: the warps of p and q.
        k: draft length with a drafter.
        rule: the acceptance rule (see `as_rule`; None: the shipped standard rule).

    Returns:
        ``seed -> list[int]`` of new token ids.

    Raises:
        ValueError, TypeError: from `policy_factory` for a bad drafter / k.
    """
    the_rule = as_rule(rule)
    make_policy = policy_factory(drafter_or_policy_factory, k)
    prompt = list(prompt)

    # toy models: tiny tensors, where waking intra-op threads costs more than the work
    threads = single_thread if isinstance(target, FunctionModel) else nullcontext

    def sample(seed: int) -> list[int]:
        with threads():
            return decode(target, prompt, make_policy(), sampling=sampling, max_new_tokens=m,
                          rng=SeededRandomness(seed), rule=the_rule).tokens

    return sample


def rule_samplers(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], m: int,
                  sampling: SamplingConfig, k: int | None = None, *,
                  rule: Rule | Callable | None = None,
                  rules: Sequence[str] = ("verispec", *NAIVE_RULES)) -> dict[str, Sampler]:
    """Samplers for the target alone ("target") and for each named rule on the same loop.

    Feed them to `audit_rules` (reference "target").

    Args:
        target, drafter_or_policy_factory, prompt, m, sampling, k: as `decode_sampler`.
        rule: the rule verispec itself runs, sampled under the name "verispec"
            (see `as_rule`; None: the standard rule).
        rules: names from `RULE_NAMES` ("verispec", "standard", "gumbel",
            "naive-agree", "naive-always-accept"); default: verispec and the
            naive shortcuts.

    Returns:
        {"target": plain decoding (k = 0), then one sampler per name in `rules`}.

    Raises:
        ValueError: naming an unknown rule.
    """
    verispec_rule = as_rule(rule)
    out = {"target": decode_sampler(target, None, prompt, m, sampling)}
    for name in rules:
        out[name] = decode_sampler(target, drafter_or_policy_factory, prompt, m, sampling, k,
                                   audited_rule(name, verispec_rule))
    return out


def _transformers_model(model, argument: str):
    """The transformers `PreTrainedModel` behind `model` (an `HFModel` or the module itself).

    Raises:
        ValueError: `model` runs on another backend (llama.cpp, toy).
        TypeError: `model` is neither a `CausalLM` nor a transformers model.
    """
    if isinstance(model, CausalLM):
        backend = model.backend or type(model).__name__
        if backend != "transformers":
            raise ValueError(
                f"{argument}: transformers' assisted generation needs transformers models, but "
                f"{model.name} runs on the {backend} backend; load it with backend='transformers' "
                f"(CLI: --backend transformers)")
        return model.transformers_model
    if callable(getattr(model, "generate", None)) and hasattr(model, "generation_config"):
        return model
    raise TypeError(f"{argument} must be an HFModel or a transformers PreTrainedModel, "
                    f"got {type(model).__name__}")


def hf_assisted_sampler(target, assistant, input_ids, m: int, temperature: float = 1.0,
                        top_k: int = 0, top_p: float = 1.0) -> Sampler:
    """A sampler wrapping transformers' assisted generation (a third-party implementation).

    Each call seeds torch's *global* RNG with the call's seed (transformers
    samples from it), runs ``target.generate(input_ids, assistant_model=assistant,
    do_sample=True, max_new_tokens=m, ...)`` and restores the RNG state (CPU and
    CUDA) afterwards, so the caller's randomness is untouched.

    Args:
        target, assistant: the target and the draft (assistant) model sharing a
            tokenizer: `verispec.models.hf.HFModel`s (their `transformers_model`
            is used; the wrappers' caches are not touched) or transformers
            `PreTrainedModel`s.
        input_ids: [1, L] long tensor (or a list of ids).
        m: new tokens per sample.
        temperature, top_k, top_p: warps (0 = off for top_k, 1.0 = off for top_p;
            temperature 0 means greedy, ``do_sample=False``).

    Returns:
        ``seed -> list[int]`` of the new token ids.

    Raises:
        ValueError: naming `target` or `assistant` when it runs on another backend
            (llama.cpp has no assisted generation of transformers' kind).
        TypeError: when one is neither an `HFModel` nor a transformers model.
    """
    target_hf_model = _transformers_model(target, "target")
    assistant_hf_model = _transformers_model(assistant, "assistant")
    if not torch.is_tensor(input_ids):
        input_ids = torch.tensor([list(input_ids)], dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    input_ids = input_ids.to(next(target_hf_model.parameters()).device)
    kwargs: dict[str, Any] = dict(max_new_tokens=m, min_new_tokens=0,
                                  assistant_model=assistant_hf_model,
                                  attention_mask=torch.ones_like(input_ids))
    if temperature == 0:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=int(top_k),
                      top_p=float(top_p))
    eos = getattr(target_hf_model.generation_config, "eos_token_id", None)
    if getattr(target_hf_model.generation_config, "pad_token_id", None) is None:
        kwargs["pad_token_id"] = (eos[0] if isinstance(eos, (list, tuple)) and eos else eos) or 0

    def sample(seed: int) -> list[int]:
        cpu_state = torch.get_rng_state()
        cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            torch.manual_seed(int(seed))
            with torch.inference_mode():
                out = target_hf_model.generate(input_ids, **kwargs)
        finally:
            torch.set_rng_state(cpu_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
        return out[0, input_ids.shape[1]:].tolist()

    return sample
