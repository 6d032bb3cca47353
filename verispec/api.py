"""The three-line Python API.

    from verispec import SpeculativeDecoder
    sd = SpeculativeDecoder("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    out = sd.generate("Write a Python quicksort.", max_new_tokens=128, temperature=0.0, k=4)
    print(out.text, out.stats.tau)

Keyword names follow Hugging Face `generate()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .decoding import DecodeResult, Stats, decode
from .drafters.lookup import LookupDrafter
from .drafters.model import ModelDrafter
from .models.base import CausalLM
from .policy import make_policy
from .sampling import SamplingConfig, TorchRandomness


class TokenizerMismatchError(ValueError):
    """The draft's tokenizer is not the target's (nor a prefix of it)."""


def load_model(spec: str | CausalLM, *, backend: str = "transformers", device: str | None = None,
               num_hidden_layers: int | None = None, fetch_missing: bool = True,
               batch_invariant: bool | None = None) -> CausalLM:
    """Load a model from a registered name, a local directory, a .gguf file or a hub id.

    Args:
        spec: e.g. "qwen2.5-coder-1.5b" (see `verispec models list`), "./my-model",
            "model.gguf", "Qwen/Qwen2.5-Coder-1.5B-Instruct"; a `CausalLM` is returned as is.
        backend: "transformers" or "llamacpp" (needs `pip install verispec[llamacpp]`).
        device: "cpu" or "cuda" (transformers only); default: CUDA when available.
        num_hidden_layers: keep only the first N layers (a cheap self-draft; transformers only).
        fetch_missing: download a registered model that is not in the cache yet.
        batch_invariant: llama.cpp only: score a batch of tokens exactly as single
            tokens (see `LlamaCppModel.load`); None = on when the installed
            llama.cpp allows it.

    Raises:
        UnknownModelError, FileNotFoundError, ChecksumError: from `verispec.registry`.
        ValueError: for an unknown backend, or batch_invariant=True with the transformers backend.
        RuntimeError: batch_invariant=True with a llama.cpp that cannot do it.
    """
    if isinstance(spec, CausalLM):
        return spec
    if batch_invariant and backend != "llamacpp":
        raise ValueError("batch_invariant is a llama.cpp option (backend='llamacpp'); the "
                         "transformers backend has no such mode")
    from . import registry

    resolved = registry.resolve(spec, fetch_missing=fetch_missing)
    if backend == "transformers":
        from .models.hf import HFModel

        return HFModel.load(resolved.hf_path, name=resolved.name, device=device,
                            num_hidden_layers=num_hidden_layers)
    if backend == "llamacpp":
        from .models.llamacpp import LlamaCppModel

        if resolved.gguf_path is None:
            raise ValueError(f"backend 'llamacpp' needs a GGUF file; {spec!r} has none "
                             "(use a registered name or a .gguf path)")
        if num_hidden_layers is not None:
            raise ValueError("num_hidden_layers (--draft-layers) is only supported by the transformers backend")
        tokenizer_path = resolved.hf_path if resolved.kind != "gguf_file" or resolved.hf_path else None
        return LlamaCppModel.load(str(resolved.gguf_path), tokenizer_path=tokenizer_path,
                                  name=resolved.name, batch_invariant=batch_invariant)
    raise ValueError(f"backend must be 'transformers' or 'llamacpp', got {backend!r}")


def check_compatible(target: CausalLM, draft: CausalLM) -> None:
    """Refuse a draft whose token ids do not mean the same as the target's.

    Allowed: identical tokenizers, or a draft vocabulary that is a prefix of the
    target's (same id for every draft token; q is then zero-padded).

    Raises:
        TokenizerMismatchError: naming the first differing token, before any generation.
    """
    if draft.vocab_size > target.vocab_size:
        raise TokenizerMismatchError(
            f"draft {draft.name} has {draft.vocab_size} logits but target {target.name} only "
            f"{target.vocab_size}: the draft must use the target's tokenizer")
    if target.tokenizer is None or draft.tokenizer is None:
        return
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv == dv:
        return
    for token, i in sorted(dv.items(), key=lambda kv: kv[1]):
        if tv.get(token) != i:
            raise TokenizerMismatchError(
                f"draft {draft.name} and target {target.name} have different tokenizers: draft id "
                f"{i} is {token!r} but the target maps {token!r} to {tv.get(token)}; use a draft "
                "from the target's model family, or --drafter lookup (needs no draft model)")


@dataclass
class GenerationResult:
    """What `SpeculativeDecoder.generate` returns.

    Attributes:
        text: decoded new text (special tokens skipped).
        token_ids: new token ids (list[int]), EOS included when it ended generation.
        prompt_ids: the prompt's token ids after the chat template.
        stats: counters and derived figures (α̂, τ, tokens/s, per-position acceptance).
    """

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: Stats

    def as_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids,
                "prompt_tokens": len(self.prompt_ids), **self.stats.as_dict()}


class SpeculativeDecoder:
    """Exact speculative decoding: output distributed exactly as the target alone.

    Args:
        target: model spec or `CausalLM` (see `load_model`).
        draft: draft model spec or `CausalLM`, sharing the target's tokenizer;
            None decodes without a draft model (plain, or prompt lookup).
        drafter: "auto", "model", "lookup" or "none".
        backend, device: see `load_model`.

    Raises:
        TokenizerMismatchError: if the draft's tokenizer differs.
    """

    def __init__(self, target: str | CausalLM, draft: str | CausalLM | None = None, *,
                 drafter: str = "auto", backend: str = "transformers",
                 device: str | None = None) -> None:
        if drafter not in ("auto", "model", "lookup", "none"):
            raise ValueError(f"drafter must be one of auto, model, lookup, none; got {drafter!r}")
        self.target = load_model(target, backend=backend, device=device)
        self.draft = load_model(draft, backend=backend, device=device) if draft is not None else None
        if self.draft is not None:
            check_compatible(self.target, self.draft)
        if drafter == "model" and self.draft is None:
            raise ValueError("drafter='model' needs a draft model: pass draft=...")
        self.drafter = drafter
        self.tokenizer = self.target.tokenizer
        self.drafters = self._drafters()
        self._auto_policy = None   # kept across calls: the cost curve is the machine's, not the prompt's

    def encode(self, prompt: str | Sequence[int], use_chat_template: bool | None = None) -> list[int]:
        """Prompt text (or ids) -> token ids, applying the chat template by default.

        Raises:
            ValueError: if the prompt is empty, encodes to no tokens, is neither
                text nor token ids, or holds an id outside the target's vocabulary.
        """
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty: give some text to continue or answer")
            tok = self.tokenizer
            if tok is None:
                raise ValueError("this target has no tokenizer: pass the prompt as token ids")
            has_template = bool(getattr(tok, "chat_template", None))
            if use_chat_template and not has_template:
                raise ValueError(f"{self.target.name} has no chat template; use --no-chat-template")
            if use_chat_template is None:
                use_chat_template = has_template
            if use_chat_template:
                ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                              add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            else:
                ids = tok.encode(prompt, add_special_tokens=True)
            ids = [int(i) for i in ids]
        else:
            if isinstance(prompt, (bytes, int)) or not hasattr(prompt, "__iter__"):
                raise ValueError(f"prompt must be text or a list of token ids, got {type(prompt).__name__}")
            ids = [int(i) for i in prompt]
            vocab = self.target.vocab_size
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise ValueError(f"prompt holds token id {bad[0]}, outside {self.target.name}'s "
                                 f"vocabulary 0..{vocab - 1}; encode the text with this model's tokenizer")
        if not ids:
            raise ValueError("prompt is empty: it encodes to no tokens")
        return ids

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 k: int | str = "auto", seed: int | None = None,
                 stop_strings: Sequence[str] | None = None,
                 use_chat_template: bool | None = None,
                 on_text: Callable[[str], None] | None = None,
                 observer: Callable | None = None) -> GenerationResult:
        """Generate a continuation, exactly distributed as the target's own sampling.

        Args:
            prompt: text (chat template applied for instruct models) or token ids.
            max_new_tokens: exact token budget, >= 0 (0 returns nothing).
            temperature: 0 = greedy; top_k (0 = off); top_p in (0, 1] (1 = off).
            k: draft length per round, >= 0 (0 = plain decoding), or "auto" to
                choose it each round from measured α and costs.
            seed: makes sampled output reproducible (a private generator per call).
            stop_strings: generation ends after the token completing any of them.
            use_chat_template: None = apply when the tokenizer has one.
            on_text: called with each newly decoded piece of text (streaming).
            observer: called with each round's `verispec.decoding.RoundRecord`.

        Returns:
            GenerationResult(text, token_ids, prompt_ids, stats).

        Raises:
            ValueError: naming the bad argument (empty prompt, negative budget, bad k,
                temperature, top_k, top_p, prompt longer than the context).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        if stop_strings is not None and (isinstance(stop_strings, str)
                                         or not all(isinstance(s, str) and s for s in stop_strings)):
            raise ValueError("stop_strings must be a list of non-empty strings")
        ids = self.encode(prompt, use_chat_template)
        if len(ids) >= self.target.context_length:
            raise ValueError(f"prompt has {len(ids)} tokens but the target's context length is "
                             f"{self.target.context_length}; shorten the prompt")
        if k == "auto":
            if self._auto_policy is None:
                self._auto_policy = make_policy("auto", self.drafters)
            policy = self._auto_policy
            policy.start()
            if not policy.calibrated and self.drafters and max_new_tokens > 1:
                policy.calibrate(self.target, ids)   # once per decoder: this machine's cost curve
        else:
            policy = make_policy(k, self.drafters)
        stream = _TextStream(self.tokenizer, on_text) if on_text and self.tokenizer else None
        result: DecodeResult = decode(
            self.target, ids, policy, sampling=sampling, max_new_tokens=max_new_tokens,
            rng=TorchRandomness(seed), stop=self._stopper(stop_strings),
            on_commit=stream.put if stream else None, observer=observer)
        if stream:
            stream.end()
        text = self.tokenizer.decode(result.tokens, skip_special_tokens=True) if self.tokenizer else ""
        return GenerationResult(text=text, token_ids=result.tokens, prompt_ids=ids, stats=result.stats)

    def _drafters(self) -> dict:
        drafters = {}
        if self.draft is not None and self.drafter in ("auto", "model"):
            drafters["model"] = ModelDrafter(self.draft)
        if self.drafter in ("auto", "lookup"):
            drafters["lookup"] = LookupDrafter()
        return drafters

    def _stopper(self, stop_strings: Sequence[str] | None) -> Callable[[list[int]], bool] | None:
        if not stop_strings:
            return None
        tok = self.tokenizer
        longest = max(len(s) for s in stop_strings)

        def stop(out: list[int]) -> bool:
            # enough trailing tokens to hold the longest stop string (>= 1 char per token)
            tail = tok.decode(out[-(longest + 2):], skip_special_tokens=False)
            return any(s in tail for s in stop_strings)

        return stop


class _TextStream:
    """Incremental detokenisation; holds back text that ends inside a UTF-8 character."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]) -> None:
        self.tokenizer, self.on_text = tokenizer, on_text
        self.tokens: list[int] = []
        self.printed = 0

    def put(self, block: list[int]) -> None:
        self.tokens.extend(block)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        if len(text) > self.printed:
            self.on_text(text[self.printed:])
            self.printed = len(text)

    def end(self) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if len(text) > self.printed:
            self.on_text(text[self.printed:])
            self.printed = len(text)
