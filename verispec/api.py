"""The three-line Python API.

    from verispec import SpeculativeDecoder
    sd = SpeculativeDecoder("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    out = sd.generate("Write a Python quicksort.", max_new_tokens=128, temperature=0.0, k=4)
    print(out.text, out.stats.tau)

Keyword names follow Hugging Face `generate()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from .decoding import DecodeResult, Policy, Stats, decode
from .drafters import (
    Drafter,
    SuffixCache,
    build_drafters,
    check_drafter_choice,
    drafter_choices,
    drafter_names,
)
from .encoding import encode
from .models import BACKENDS, backend_class, check_options, default_backend
from .models.base import CausalLM
from .policy import make_policy
from .policy.adaptive import check_k_max
from .sampling import SamplingConfig, SeededRandomness
from .text import TextStream, check_stop_strings
from .verify import Rule, resolve_rule

#: `generate`'s sampling keywords at their defaults (the `sampling=` argument replaces them).
_SAMPLING_DEFAULTS = (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, None, None, 0)


class TokenizerMismatchError(ValueError):
    """The draft's tokenizer is not the target's (nor a prefix of it)."""


def load_model(spec: str | CausalLM, *, backend: str | None = None, device: str | None = None,
               num_hidden_layers: int | None = None, fetch_missing: bool = True,
               batch_invariant: bool | None = None, n_threads: int | None = None,
               flash_attn: bool | None = None) -> CausalLM:
    """Load a model from a registered name, a local directory, a .gguf file or a hub id.

    Args:
        spec: e.g. "qwen2.5-coder-1.5b" (see `verispec models list`), "./my-model",
            "model.gguf", "Qwen/Qwen2.5-Coder-1.5B-Instruct"; a `CausalLM` is returned as is.
        backend: a name in `verispec.models.BACKENDS`: "transformers" or "llamacpp" (needs
            `pip install verispec[llamacpp]`); the backend's class loads the model. None:
            the CLI's rule (`verispec.models.default_backend`: llama.cpp on a CPU when
            installed, transformers on a GPU), unless an option given is one only another
            backend takes (e.g. num_hidden_layers: transformers).
        device: "cpu" or "cuda" (transformers only); default: CUDA when available.
        num_hidden_layers: keep only the first N layers (a cheap self-draft; transformers only).
        fetch_missing: download a registered model that is not in the cache yet.
        batch_invariant: llama.cpp only: score a batch of tokens exactly as single
            tokens (see `LlamaCppModel.load`); None = on when the installed
            llama.cpp allows it.
        n_threads: llama.cpp only: CPU threads (None: all cores). On a shared machine
            fewer threads than cores avoids llama.cpp's spinning threads waiting on
            descheduled ones.
        flash_attn: llama.cpp only: its flash attention. None: on in the batch-invariant
            mode with the reference switch `make setup` builds in (exact there), else off;
            True with batch_invariant None: llama-server's kernels (the mode off), for an
            audit reference that must compute as llama-server does (`LlamaCppModel.load`).

    Raises:
        UnknownModelError, FileNotFoundError, ChecksumError: from `verispec.registry`.
        ValueError: for an unknown backend, or an option the backend does not take (e.g.
            batch_invariant=True with the transformers backend).
        ImportError: when the backend's package is not installed.
        RuntimeError: batch_invariant=True with a llama.cpp that cannot do it.
    """
    if isinstance(spec, CausalLM):
        return spec
    options = {name: value for name, value in (
        ("device", device), ("num_hidden_layers", num_hidden_layers),
        ("batch_invariant", batch_invariant), ("n_threads", n_threads), ("flash_attn", flash_attn))
        if value is not None}
    if backend is None:
        given = {n for n, v in options.items() if v is not False}
        fits = [name for name in BACKENDS if given <= set(BACKENDS[name].options)]
        backend = default_backend(device)
        if fits and backend not in fits:
            backend = fits[0]
    check_options(backend, {n: v for n, v in options.items() if v is not False})   # False: "off"
    takes = BACKENDS[backend].options
    return backend_class(backend).open(spec, fetch_missing=fetch_missing,
                                       **{n: v for n, v in options.items() if n in takes})


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
    if target.tokenizer is None or draft.tokenizer is None or target.tokenizer is draft.tokenizer:
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
        text: decoded new text (special tokens skipped), cut right before a stop string;
            exactly the concatenation of the chunks streamed to `on_text`.
        token_ids: new token ids (list[int]), EOS included when it ended generation, the
            token that completed a stop string last when one did.
        prompt_ids: the prompt's token ids after the chat template.
        stats: counters and derived figures (α̂, τ, tokens/s, per-position acceptance);
            `stats.finish_reason` is "eos", "stop_string", "length" or "context".
        stop_string: the stop string that ended generation, else None.
    """

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: Stats
    stop_string: str | None = None

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish reason: "stop" (EOS or a stop string) or "length" (token budget
        or context full)."""
        return "stop" if self.stats.finish_reason in ("eos", "stop_string") else "length"

    def as_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids,
                "prompt_tokens": len(self.prompt_ids), "stop_string": self.stop_string,
                **self.stats.as_dict()}


class SpeculativeDecoder:
    """Exact speculative decoding: output distributed exactly as the target alone.

    Args:
        target: model spec or `CausalLM` (see `load_model`).
        draft: draft model spec or `CausalLM`, sharing the target's tokenizer;
            None decodes without a draft model (plain, suffix decoding or prompt lookup).
        drafter: "auto" (every usable drafter: "model" with a draft, "suffix"), one
            name of `verispec.drafters.DRAFTERS` ("model", "suffix", "lookup"), "none",
            or a drafter object of your own (anything with the `verispec.drafters.Drafter`
            attributes and methods; its `name` must not be one of those choices).
        backend, device: see `load_model`.
        suffix_cache_size: tokens of this decoder's earlier outputs the suffix drafter
            also drafts from (`verispec.drafters.SuffixCache`: whole outputs, least
            recently used evicted first; ~1 KB per token at most); 0 = off.
        k_max: the largest draft length k="auto" considers (tokens, >= 1).

    Attributes:
        target, draft: the models (`CausalLM`; draft None without a draft model).
        tokenizer: the target's tokenizer, or None.
        drafter: the name of this decoder's drafter choice ("auto", ..., or the name
            of a drafter object).
        drafters: name -> drafter that choice uses.
        k_max: as above.

    Raises:
        TokenizerMismatchError: if the draft's tokenizer differs.
        ValueError: naming `drafter` for an unknown drafter, "model" without a draft,
            or an object that is not a `Drafter`; naming `suffix_cache_size` when it is
            negative, `k_max` when it is not an integer >= 1.
    """

    def __init__(self, target: str | CausalLM, draft: str | CausalLM | None = None, *,
                 drafter: str | Drafter = "auto", backend: str | None = None,
                 device: str | None = None, suffix_cache_size: int = 0, k_max: int = 8) -> None:
        if isinstance(drafter, str):
            check_drafter_choice(drafter, has_draft_model=draft is not None)
        else:
            _check_drafter_object(drafter)
        if isinstance(suffix_cache_size, bool) or not isinstance(suffix_cache_size, int) \
                or suffix_cache_size < 0:
            raise ValueError(f"suffix_cache_size must be an integer >= 0 (tokens; 0 = off), "
                             f"got {suffix_cache_size!r}")
        check_k_max(k_max)
        self.k_max = k_max
        self.target = load_model(target, backend=backend, device=device)
        self.draft = load_model(draft, backend=backend, device=device) if draft is not None else None
        if self.draft is not None:
            check_compatible(self.target, self.draft)
        self.tokenizer = self.target.tokenizer
        self.suffix_cache = SuffixCache(suffix_cache_size) if suffix_cache_size else None
        self._drafters_by_choice: dict[str, dict[str, Drafter]] = {}   # per-call `drafter` choices
        self._auto_policies: dict = {}   # per choice, kept across calls: the cost curve is the machine's
        self.drafter = self._choose(drafter)
        self.drafters = self._drafters_by_choice[self.drafter]

    def _choose(self, drafter: str | Drafter) -> str:
        """The choice's name, its drafters built (or the object registered) on first use."""
        if not isinstance(drafter, str):
            _check_drafter_object(drafter)
            if self._drafters_by_choice.get(drafter.name, {}).get(drafter.name) is not drafter:
                self._drafters_by_choice[drafter.name] = {drafter.name: drafter}
                self._auto_policies.pop(drafter.name, None)   # its α estimates were another's
            return drafter.name
        if drafter not in self._drafters_by_choice:
            self._drafters_by_choice[drafter] = build_drafters(drafter, self.draft,
                                                              suffix_cache=self.suffix_cache)
        return drafter

    def drafter_names(self, drafter: str | None = None) -> tuple[str, ...]:
        """The drafters `generate(drafter=drafter)` uses (None: the decoder's own choice).

        Raises:
            ValueError: naming `drafter`, as `verispec.drafters.check_drafter_choice`.
        """
        choice = self.drafter if drafter is None else drafter
        if choice in self._drafters_by_choice:
            return tuple(self._drafters_by_choice[choice])
        return drafter_names(choice, has_draft_model=self.draft is not None)

    def auto_policy(self, choice: str, context: Sequence[int] | None = None):
        """The adaptive policy kept for drafter choice `choice` (built on first use; its
        cost curve timed on the target once, over `context`, if given and it drafts).
        Raises ValueError as `check_drafter_choice`."""
        name = self._choose(choice)
        drafters = self._drafters_by_choice[name]
        if name not in self._auto_policies:
            self._auto_policies[name] = make_policy("auto", drafters, k_max=self.k_max)
        policy = self._auto_policies[name]
        if not policy.calibrated and drafters and context is not None:
            policy.calibrate(self.target, context)   # once per decoder: this machine's cost curve
        return policy

    def encode(self, prompt: str | Sequence[int], use_chat_template: bool | None = None) -> list[int]:
        """Prompt text (or ids) -> token ids, applying the chat template by default
        (`verispec.encoding.encode`, which the server uses too).

        Raises:
            PromptError (a ValueError): if the prompt is empty, encodes to no tokens, is
                neither text nor token ids, or holds an id outside the target's vocabulary.
        """
        return encode(self.tokenizer, prompt, self.target.vocab_size, use_chat_template=use_chat_template)

    def sampling_config(self, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                        min_p: float = 0.0, repetition_penalty: float = 1.0,
                        presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                        logit_bias: dict[int, float] | None = None,
                        bad_words_ids: Sequence[Sequence[int]] | None = None,
                        min_new_tokens: int = 0) -> SamplingConfig:
        """The warps and controls for this target, validated once (the arguments are
        `generate`'s): its EOS ids filled in (for min_new_tokens), every id checked
        against its vocabulary.

        Raises:
            SettingError (a ValueError): naming the argument out of range
                (`verispec.sampling.SamplingConfig`), or an id outside the vocabulary.
        """
        sampling = SamplingConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, logit_bias=logit_bias or (),
            bad_words_ids=bad_words_ids or (), min_new_tokens=min_new_tokens,
            eos_token_ids=self.target.eos_token_ids)
        sampling.check_vocab(self.target.vocab_size)
        return sampling

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 k: int | str = "auto", seed: int | None = None, rule: str | Rule = "auto",
                 stop_strings: Sequence[str] | None = None,
                 use_chat_template: bool | None = None,
                 on_text: Callable[[str], None] | None = None,
                 observer: Callable | None = None, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
                 bad_words_ids: Sequence[Sequence[int]] | None = None,
                 min_new_tokens: int = 0, drafter: str | Drafter | None = None,
                 sampling: SamplingConfig | None = None,
                 stop_token_ids: Sequence[int] | None = None,
                 ignore_eos: bool = False, policy: Policy | None = None,
                 run: Callable[..., DecodeResult] | None = None) -> GenerationResult:
        """Generate a continuation, exactly distributed as the target's own sampling.

        Args:
            prompt: text (chat template applied for instruct models) or token ids.
            max_new_tokens: exact token budget, >= 0 (0 returns nothing).
            temperature: 0 = greedy; top_k (0 = off); top_p in (0, 1] (1 = off).
            k: draft length per round, >= 0 (0 = plain decoding), or "auto" to
                choose it each round from measured α and costs.
            seed: makes sampled output reproducible: every random number is keyed by
                (seed, output position), so nothing about rounds, k, drafters or
                earlier calls changes it. None draws a fresh seed, reported as
                `stats.seed` so the sample can be replayed.
            rule: the acceptance rule: "standard" (min(1, p/q)), "gumbel" (coupled:
                output = the plain seeded sample for every k), a `Rule`, or "auto"
                (see `resolve_rule`).
            stop_strings: generation ends with the token that completes any of them in the
                decoded text; the text is cut right before it (`verispec.text`).
            use_chat_template: None = apply when the tokenizer has one.
            on_text: called with each new piece of text as tokens are committed (streaming);
                pieces never end inside a character nor hold text a stop string later cuts,
                and they concatenate to the returned `text`.
            observer: called with each round's `verispec.decoding.RoundRecord`.
            min_p, repetition_penalty, presence_penalty, frequency_penalty,
            logit_bias, bad_words_ids, min_new_tokens: the sampling controls, with
                Hugging Face's names (OpenAI's for the two penalties and logit_bias),
                applied identically to p and q at every draft position
                (`verispec.controls`; `SamplingConfig` gives the ranges).
                min_new_tokens must not exceed max_new_tokens; stop strings are not
                matched before it.
            drafter: this call's drafter choice, as the constructor's `drafter`
                ("auto", "model", "lookup", "none", or a `Drafter` object); None = the
                decoder's own. Each choice keeps its own drafters and (for k="auto")
                its own adaptive policy across calls; the models and their caches are
                shared.
            sampling: all the warps and controls at once, as `sampling_config` builds
                them (what the server passes); then temperature ... min_new_tokens must
                keep their defaults.
            stop_token_ids: more ids that end generation as EOS does (kept in
                `token_ids`; their text kept unless special), as vLLM's field.
            ignore_eos: do not stop at the target's EOS ids (benchmarks that need exact
                output lengths; vLLM's field). min_new_tokens still bans EOS.
            policy, run: for concurrent requests (`verispec.serve.batched`): this call's
                own policy and drafters (`k`, `drafter` then only resolve rule "auto"; the
                output is not added to the suffix cache), and what runs `decode`'s
                arguments but the target, run(ids, policy, **keywords), in its place.

        Returns:
            GenerationResult(text, token_ids, prompt_ids, stats).

        Raises:
            ValueError: naming the bad argument (empty prompt, negative budget, bad k,
                temperature, top_k, top_p, drafter, stop_strings, prompt longer than the
                context; stop_strings for a target without a tokenizer).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        keywords = (temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                    frequency_penalty, logit_bias or None, bad_words_ids or None, min_new_tokens)
        if sampling is None:
            sampling = self.sampling_config(
                temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty, logit_bias=logit_bias,
                bad_words_ids=bad_words_ids, min_new_tokens=min_new_tokens)
        elif keywords != _SAMPLING_DEFAULTS:
            raise ValueError("give the sampling settings either as sampling=SamplingConfig(...) or "
                             "as keywords (temperature=..., top_p=...), not both")
        elif tuple(sampling.eos_token_ids) != tuple(sorted(self.target.eos_token_ids)):
            sampling = replace(sampling, eos_token_ids=tuple(self.target.eos_token_ids))
        if sampling.min_new_tokens > max_new_tokens:
            raise ValueError(f"min_new_tokens ({sampling.min_new_tokens}) must not exceed "
                             f"max_new_tokens ({max_new_tokens})")
        eos = _ending_ids(self.target, stop_token_ids, ignore_eos)
        stops = check_stop_strings(stop_strings)
        if stops and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer, and this target has none; "
                             "drop stop_strings or load the model with its tokenizer")
        ids = self.encode(prompt, use_chat_template)
        if len(ids) >= self.target.context_length:
            raise ValueError(f"prompt has {len(ids)} tokens but the target's context length is "
                             f"{self.target.context_length}; shorten the prompt")
        choice = self._choose(self.drafter if drafter is None else drafter)
        drafters = self._drafters_by_choice[choice]
        own = policy is None
        if own and k == "auto":
            policy = self.auto_policy(choice, ids if max_new_tokens > 1 else None)
            policy.start(max_new_tokens)
        elif own:
            policy = make_policy(k, drafters, k_max=self.k_max)
        the_rule = resolve_rule(rule, k, drafters)
        stream = (TextStream(self.tokenizer, stops, min_tokens=sampling.min_new_tokens)
                  if self.tokenizer is not None else None)
        committed: list[int] = []

        def stop(out: list[int]) -> bool:   # after each committed token (EOS excepted)
            return stream.push(out[len(stream.token_ids):])

        def on_commit(block: list[int]) -> None:   # after each round
            committed.extend(block)
            stream.push(committed[len(stream.token_ids):])
            chunk = stream.pop_chunk()
            if chunk and on_text is not None:
                on_text(chunk)

        result: DecodeResult = (run or partial(decode, self.target))(
            ids, policy, sampling=sampling, max_new_tokens=max_new_tokens,
            rng=SeededRandomness(seed), rule=the_rule, stop=stop if stops else None,
            on_commit=on_commit if stream is not None else None, observer=observer,
            eos_token_ids=eos)
        if self.suffix_cache is not None and own:   # later generations may draft from this output
            self.suffix_cache.add(result.tokens)
        text = ""
        if stream is not None:
            chunk = stream.finish()
            if chunk and on_text is not None:
                on_text(chunk)
            text = stream.text
        return GenerationResult(text=text, token_ids=result.tokens, prompt_ids=ids, stats=result.stats,
                                stop_string=stream.stop_string if stream is not None else None)


def _ending_ids(target: CausalLM, stop_token_ids: Sequence[int] | None, ignore_eos: bool) -> frozenset[int]:
    """The ids that end a generation: the target's EOS (unless ignored) and stop_token_ids.

    Raises:
        ValueError: naming stop_token_ids or ignore_eos when malformed.
    """
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"ignore_eos must be True or False, got {ignore_eos!r}")
    extra = []
    for i in stop_token_ids or ():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < target.vocab_size:
            raise ValueError(f"stop_token_ids must hold token ids in 0..{target.vocab_size - 1}, got {i!r}")
        extra.append(i)
    return frozenset(extra) | (frozenset() if ignore_eos else target.eos_token_ids)


def _check_drafter_object(drafter) -> None:
    """Raise ValueError naming `drafter` unless it is a `Drafter` with a name of its own."""
    if not isinstance(drafter, Drafter):
        raise ValueError("drafter must be a name (one of "
                         f"{', '.join(drafter_choices())}) or a verispec.drafters.Drafter object "
                         "(name, point_mass, alpha_prior, forwards, seconds, catchup_seconds, "
                         f"available, propose, rollback, reset); got {type(drafter).__name__}")
    if not isinstance(drafter.name, str) or not drafter.name or drafter.name in drafter_choices():
        raise ValueError(f"a drafter object needs a name of its own (not one of "
                         f"{', '.join(drafter_choices())}), got name={drafter.name!r}")
