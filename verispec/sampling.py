"""Logits -> warped float32 probabilities (with the sampling controls), and injectable randomness.

The same `warp` is applied to the target's logits (giving p) and to the draft's
logits (giving q) at every position. Speculative sampling is exact only for the
distributions it is handed, so p and q must both be the *post-warp*
distributions the tokens are actually drawn from (Leviathan et al. 2023, §2.3;
Chen et al. 2023, Algorithm 2).

Temperature 0 means greedy: the warped distribution is a point mass on the
argmax (ties broken towards the lowest token id, as `torch.argmax` does), so
greedy decoding is the special case of sampling with point-mass p and q.

Every value `SamplingConfig` accepts gives finite p and q summing to 1. Where a
setting has a mathematical limit, that limit is computed instead of the overflow:
a temperature so small that logits / T overflows is greedy (softmax(l / T) tends
to the point mass on the argmax as T -> 0), and a top_p below the top token's
probability keeps the top token (the nucleus is never empty). A setting with no
such limit is refused by name (`REPETITION_PENALTY_RANGE`, `LOGIT_BIAS_LIMIT`).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .controls import apply_controls


class SettingError(ValueError):
    """A sampling setting outside its range.

    Attributes:
        name: the argument at fault, as `SamplingConfig` names it ("temperature", "top_p", ...),
            so each face can name its own spelling of it (--top-p, the request's "top_p").
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


#: The error a NaN in the model's logits raises, wherever a token is chosen from them.
NAN_LOGITS = "the model returned NaN logits; no distribution can be sampled from them"

#: Accepted repetition penalties r: l / r and l · r must stay finite for any float32
#: logit (r -> 0 or r -> inf has no distribution to tend to); 1 = off.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
#: Largest |logit_bias| (logits + bias must stay finite); OpenAI's API allows ±100.
LOGIT_BIAS_LIMIT = 1e6


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """Warps and controls applied identically to p and q at every position.

    Attributes:
        temperature: >= 0. 0 means greedy (point mass on the argmax).
        top_k: keep the k most likely tokens; 0 disables the filter.
        top_p: keep the smallest set of most likely tokens whose mass is >= top_p;
            in (0, 1], 1.0 disables the filter (nucleus sampling, Holtzman et al. 2020).
        min_p: keep tokens with probability >= min_p · (the largest probability),
            after temperature, top-k and top-p (Nguyen et al. 2024, "min-p
            sampling"); in [0, 1], 0 disables it.
        repetition_penalty: in `REPETITION_PENALTY_RANGE` ([0.01, 100]); 1 disables it
            (CTRL / HF definition, `verispec.controls`).
        presence_penalty, frequency_penalty: in [-2, 2] (OpenAI's definitions, over
            generated tokens); 0 disables them.
        logit_bias: {token id: bias} added to the logits (a mapping, or pairs);
            biases with |bias| <= `LOGIT_BIAS_LIMIT`.
        bad_words_ids: token-id sequences never generated (HF `bad_words_ids`).
        min_new_tokens: >= 0; `eos_token_ids` are banned until that many new tokens
            (and stop strings are not matched before, see `verispec.api`).
        eos_token_ids: the ids `min_new_tokens` bans (the API fills in the target's).

    Raises:
        ValueError: naming the argument, for any value outside its range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise SettingError("temperature", f"temperature must be finite and >= 0 (0 = greedy), "
                                              f"got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SettingError("top_k", f"top_k must be an integer >= 0 (0 = no top-k filter), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise SettingError("top_p", f"top_p must be in (0, 1] (1 = no nucleus filter), got {self.top_p!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise SettingError("min_p", f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        low, high = REPETITION_PENALTY_RANGE
        if not _is_real(self.repetition_penalty) or not low <= self.repetition_penalty <= high:
            raise SettingError("repetition_penalty", f"repetition_penalty must be in [{low:g}, {high:g}] "
                                                     f"(1 = off), got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:
                raise SettingError(name, f"{name} must be in [-2, 2] (0 = off), got {value!r}")
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int) \
                or self.min_new_tokens < 0:
            raise SettingError("min_new_tokens", f"min_new_tokens must be an integer >= 0, "
                                                 f"got {self.min_new_tokens!r}")
        bias = self.logit_bias
        pairs = list(bias.items()) if hasattr(bias, "items") else list(bias)
        clean: dict[int, float] = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise SettingError("logit_bias", f"logit_bias must map token ids to biases, got {bias!r}")
            tok, b = pair
            tok = _token_id(tok, "logit_bias")
            if not _is_real(b) or not abs(b) <= LOGIT_BIAS_LIMIT:
                raise SettingError("logit_bias", f"logit_bias[{tok}] must be a number in "
                                                 f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {b!r}")
            clean[tok] = clean.get(tok, 0.0) + float(b)
        object.__setattr__(self, "logit_bias", tuple(sorted(clean.items())))
        words = []
        for word in self.bad_words_ids:
            if isinstance(word, (int, str)) or not hasattr(word, "__iter__"):
                raise SettingError("bad_words_ids", f"bad_words_ids must be a list of token-id lists, "
                                                    f"got {self.bad_words_ids!r}")
            word = tuple(_token_id(t, "bad_words_ids") for t in word)
            if not word:
                raise SettingError("bad_words_ids",
                                   "bad_words_ids holds an empty sequence; give at least one token id")
            words.append(word)
        object.__setattr__(self, "bad_words_ids", tuple(words))
        # a sorted tuple, not a set: the config is written into JSON outputs (analyze, bench)
        object.__setattr__(self, "eos_token_ids", tuple(sorted({int(t) for t in self.eos_token_ids})))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_controls(self) -> bool:
        """Whether any control depends on the history (`verispec.controls`)."""
        return bool(self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias or self.bad_words_ids
                    or (self.min_new_tokens and self.eos_token_ids))

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError naming the argument if a controlled id is outside 0..V-1."""
        for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]),
                          ("bad_words_ids", [t for w in self.bad_words_ids for t in w])):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise SettingError(name, f"{name} holds token id {bad[0]}, outside the vocabulary "
                                 f"0..{vocab_size - 1}")


def _token_id(value, name: str) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)      # JSON object keys arrive as strings
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingError(name, f"{name} must hold token ids (integers >= 0), got {value!r}")
    return int(value)


def warp(logits: torch.Tensor, config: SamplingConfig, history: Sequence[int] | None = None,
         n_prompt: int = 0, drafts: Sequence[int] = ()) -> torch.Tensor:
    """Turn logits into the distribution tokens are sampled from.

    Args:
        logits: [..., V] any float dtype ([n, V] or [V] when controls are active).
        config: temperature, top-k, top-p, min-p and the controls.
        history: token ids before row 0 (prompt + committed output); required when
            `config.has_controls` (see `verispec.controls.apply_controls`).
        n_prompt: how many tokens of `history` are the prompt.
        drafts: the draft tokens rows 1..n-1 follow (row i sees history + drafts[:i]).

    Returns:
        [..., V] float32 probabilities summing to 1 over the last axis
        (float64 logits stay float64, for exact enumeration). Greedy
        gives a one-hot vector at the argmax, and so does a row whose logits / T
        overflow (the T -> 0 limit). Order follows HF `generate()`:
        the controls, then temperature, top-k, top-p, min-p. Always finite.

    Raises:
        ValueError: if the config has controls and no history is given, or the controls
            ban every token of a row.
        FloatingPointError: if the logits hold NaN (a fault of the model, not of the config).
    """
    if logits.dtype != torch.float64:
        logits = logits.float()
    if config.has_controls:
        if history is None:
            raise ValueError("this SamplingConfig has history-dependent controls: pass history")
        logits = apply_controls(logits, config, history, n_prompt, drafts)
    if bool(torch.isnan(logits).any()):
        raise FloatingPointError(NAN_LOGITS)
    logits_before_t = logits
    allowed = logits > float("-inf")
    if not bool(allowed.any(-1).all()):
        raise ValueError("the sampling controls ban every token at this position (bad_words_ids, "
                         "min_new_tokens with eos_token_ids or logit_bias): allow at least one")
    if config.greedy:
        return _point_mass(logits)
    # -inf (banned) stays -inf whatever T is; a finite logit whose l / T overflows means T is
    # too small to divide by: that row takes the limit T -> 0, the point mass on the argmax
    scaled = torch.where(allowed, logits / config.temperature, logits)
    overflow = (allowed & ~torch.isfinite(scaled)).any(-1, keepdim=True)
    if bool(overflow.any()):
        scaled = torch.where(overflow, torch.zeros_like(scaled), scaled)
    logits = scaled
    vocab = logits.shape[-1]
    if 0 < config.top_k < vocab:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # mass strictly before each token; keep a token while that mass < top_p. The top
        # token is always kept: a top_p below its probability (or one that rounds to 0 in
        # float32) leaves the nucleus {top token}, never an empty set.
        before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = before >= config.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    if config.min_p > 0:
        keep = probs >= config.min_p * probs.amax(-1, keepdim=True)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    if bool(overflow.any()):
        probs = torch.where(overflow, _point_mass(logits_before_t), probs)
    if not bool(torch.isfinite(probs).all()):   # a guard: no accepted setting gets here
        raise FloatingPointError(f"warping produced non-finite probabilities for {config}")
    return probs


def _point_mass(logits: torch.Tensor) -> torch.Tensor:
    """One-hot at the argmax of each row (ties: the lowest id, as `torch.argmax`)."""
    out = torch.zeros_like(logits)
    out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return out


class Randomness(Protocol):
    """Where every random number of a decode comes from, keyed by output position.

    Every draw names the absolute output position t it is for (0 = the first new
    token) and a *stream* (what it is used for), so the number drawn for (t, stream)
    never depends on how many numbers earlier rounds consumed, on k, on the drafter,
    or on earlier calls. The streams used by the shipped loop:

    * ``"sample"``: the token emitted at position t (plain decoding, the residual or
      bonus token, and y_t of the coupled rule). A draft model under the coupled
      rule draws x_t from this stream too (shared noise).
    * ``"draft"``: x_t drawn by a draft model under the standard rule (independent of
      the target's draws, as Leviathan et al. 2023, Algorithm 1 requires).
    * ``"accept"``: u_t of the acceptance test u_t · q(x_t) < p(x_t).

    Injecting it (instead of using torch's global RNG) gives per-call seeds and lets
    `verispec.audit` replace the coins with exact enumeration (which may ignore the keys).
    """

    def categorical(self, probs: torch.Tensor, position: int, stream: str = "sample") -> int:
        """Draw one token id for output position `position` from probs ([V] float, sums to 1)."""
        ...

    def uniform(self, n: int, position: int) -> torch.Tensor:
        """[n] float32 uniforms on [0, 1) for positions position..position+n-1 (stream "accept")."""
        ...


def _key(seed: int, position: int, stream: str) -> int:
    """63-bit generator seed for (seed, position, stream): a BLAKE2b hash, so keys of
    nearby positions or seeds give unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{position}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededRandomness:
    """`Randomness` keyed by (seed, position, stream): reproducible whatever the policy does.

    Each draw seeds a private numpy PCG64 generator from a hash of the key, so the random numbers used at output position t are a function of
    (seed, t, stream) alone. Categorical draws use the exponential race, which is
    Gumbel-max in another form (Gumbel 1954; Maddison et al. 2014, "A* Sampling", §2):

        y = argmax_i p_i / E_i,   E_i ~ Exp(1) i.i.d.   =>   P(y = i) = p_i / Σ_j p_j

    (argmax p_i / E_i = argmax log p_i + G_i with G_i = −log E_i Gumbel-distributed).
    Two distributions drawn with the same key share the noise E, which is what the
    coupled acceptance rule (`verispec.verify.GumbelRule`) relies on. A point mass
    (greedy) is returned without drawing.

    Args:
        seed: integer seed; None draws a fresh 63-bit seed from the OS, readable as
            ``.seed`` afterwards, so any sample can be replayed.

    Raises:
        ValueError: if seed is not an integer.
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is None:
            seed = secrets.randbits(63)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.seed = int(seed)

    def generator(self, position: int, stream: str) -> np.random.Generator:
        """A fresh numpy PCG64 generator seeded for (self.seed, position, stream)."""
        return np.random.Generator(np.random.PCG64(_key(self.seed, position, stream)))

    def categorical(self, probs: torch.Tensor, position: int, stream: str = "sample") -> int:
        """One token id drawn from `probs` ([V] float, sums to 1) by an exponential race,
        argmax_j p_j / E_j with E_j ~ Exp(1) i.i.d. from the (seed, position, stream) key:
        token j wins with probability exactly p_j, since E_j / p_j ~ Exp(p_j) (the
        Gumbel-max trick in exponential form, the race Daliri, Musco, Suresh 2024 couple
        drafts with). Tokens with p_j = 0 never win. The same key gives the same E,
        so drafts and plain decoding that race on the same key are coupled."""
        if int(torch.count_nonzero(probs)) == 1:  # exact point mass (greedy): no draw
            return int(probs.argmax())
        # float64 exponentials: float32 ones come on a grid of about 5e-7 near 0, so a token
        # with p_j far below that grid won whenever its E_j drew the first grid point — with
        # probability ~5e-7 instead of p_j. Over a 49k vocabulary of p_j ~ 1e-9 that put ~0.6 %
        # of draws in the far tail (found by the endpoint audit's log-likelihood statistic,
        # -0.15 nats/token on verispec serve). In float64 the grid is ~1e-15.
        e = self.generator(position, stream).standard_exponential(probs.shape[-1])
        race = probs.double() / torch.from_numpy(e)
        # an exponential of exactly 0 gives 0 / 0 = NaN for p_j = 0, which argmax takes as the
        # largest: a token outside the support never wins the race.
        return int(torch.argmax(race.masked_fill(probs <= 0, -1.0)))

    def uniform(self, n: int, position: int) -> torch.Tensor:
        """[n] float32 uniforms in [0, 1) for the acceptance tests of positions
        position..position+n-1, one keyed generator each (stream "accept")."""
        return torch.tensor([self.generator(position + i, "accept").random(dtype=np.float32)
                             for i in range(n)], dtype=torch.float32)


#: The name earlier releases used; kept so existing code keeps working.
TorchRandomness = SeededRandomness
