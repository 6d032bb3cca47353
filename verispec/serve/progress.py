"""One request's progress, round by round: streamed chunks, logprobs, acceptance counters.

`RequestProgress` is handed to `SpeculativeDecoder.generate` as its `observer` (called
once per round with the `RoundRecord`: the committed ids and the target's raw logits)
and its `on_text` (the decoded text, in pieces that never split a character and that
concatenate to the final text). It turns them into

* `Chunk`s for streaming: the text since the last chunk with the ids committed since
  then — one chunk per committed block; a block whose text is still held back (an
  unfinished UTF-8 character, a possible stop string) rides with the next one;
* per-token log-probabilities: log-softmax of the target's *raw* logits at that
  position (before temperature, top-k/p and the controls; what vLLM returns by
  default), floored at -9999.0 so that no -inf reaches JSON (as vLLM does);
* the acceptance counters of this request (`speculative_decoding`, with vLLM's field
  names: see `spec_metrics`) and its timing.

It is also where cancellation happens: when the request's `cancelled` event is set the
next round's `observe` raises `Cancelled`, which ends `generate` after that round (the
core leaves the caches consistent, see `verispec.decoding.decode`). So a client that
disconnects costs at most the round in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..decoding import RoundRecord, Stats
from .pieces import Pieces

LOGPROB_FLOOR = -9999.0   # stands for log 0 (-inf is not JSON)


class Cancelled(Exception):
    """Raised from the observer to stop a generation whose client has gone."""


@dataclass
class TokenLogprob:
    """One emitted token's log-probability under the target's raw logits.

    Attributes:
        token_id, token: the id and its own text (special tokens included).
        logprob: natural log, >= LOGPROB_FLOOR (None: the first prompt token, under echo).
        top: the `n` most likely (id, text, logprob, bytes) at that position, most likely first.
        bytes: the token's real bytes (`verispec.serve.pieces`: a byte-level piece of a
            character is its byte, not U+FFFD).
    """

    token_id: int
    token: str
    logprob: float | None
    top: list[tuple[int, str, float, list[int]]] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)


@dataclass
class Chunk:
    """A streamed piece: text and the ids (and their logprobs) committed with it."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]


class RequestProgress:
    """Observer + text sink for one generation (see the module docstring).

    Args:
        tokenizer: the target's tokenizer (token texts for logprobs), or None.
        logprobs: alternatives per token to report (0 = the chosen token only), or None
            for no logprobs (nothing is computed then).
        emit: called with each `Chunk` (streaming), or None.
        cancelled: set from another thread to stop after the current round.
        deadline: a `clock` reading after which the next round's `observe` raises
            `Cancelled` (the request's time limit), or None.
        clock: seconds, monotonic.

    Attributes:
        stats: the request's `Stats`, fed every `RoundRecord` (drafted, accepted, α ...).
        rounds: verification rounds so far (plain steps included).
        token_ids, logprobs: everything committed so far.
        histogram: {k: [steps that accepted exactly j of k drafts, j = 0..k]}.
        token_times: (time, tokens committed) per round that committed tokens.
    """

    def __init__(self, tokenizer=None, logprobs: int | None = None,
                 emit: Callable[[Chunk], None] | None = None,
                 cancelled: threading.Event | None = None, deadline: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.tokenizer, self.n_logprobs, self.emit = tokenizer, logprobs, emit
        self.pieces = pieces_of(tokenizer)
        self.cancelled = cancelled or threading.Event()
        self.deadline, self.expired = deadline, False
        self.clock = clock
        self.stats = Stats()
        self.rounds = 0
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.histogram: dict[int, list[int]] = {}
        self.token_times: list[tuple[float, int]] = []
        self.text_sent = ""
        self._pending_ids: list[int] = []
        self._pending_lp: list[TokenLogprob] = []

    # -- the two hooks generate calls -----------------------------------------------------
    def observe(self, record: RoundRecord) -> None:
        """`generate`'s observer: account for one round; raise `Cancelled` if asked to stop."""
        now = self.clock()
        self.rounds += 1
        self.stats.record(record)
        if record.k:
            counts = self.histogram.setdefault(record.k, [0] * (record.k + 1))
            counts[record.accepted] += 1
        tokens = list(record.tokens)
        if tokens:
            self.token_times.append((now, len(tokens)))
            lps = self._logprobs(record.logits, tokens) if self.n_logprobs is not None else []
            self.token_ids += tokens
            self.logprobs += lps
            self._pending_ids += tokens
            self._pending_lp += lps
            if self.tokenizer is None:       # no text will come: the ids are the chunk
                self._flush("")
        if self.cancelled.is_set():
            raise Cancelled()
        if self.deadline is not None and now > self.deadline:
            self.expired = True
            raise Cancelled()

    def on_text(self, text: str) -> None:
        """`generate`'s on_text: a new piece of the final text."""
        self._flush(text)

    def finish(self, text: str) -> None:
        """After `generate` returned `text`: stream whatever was not streamed yet."""
        rest = text[len(self.text_sent):] if text.startswith(self.text_sent) else ""
        self._flush(rest)

    # -- reports ---------------------------------------------------------------------------
    def spec_metrics(self, k_setting: int | str) -> dict:
        """This request's acceptance counters, with vLLM's per-request field names.

        vLLM's fields (docs.vllm.ai, "Per-Request Acceptance Metrics"):
        `num_spec_steps` (verification rounds that carried drafts), `num_draft_tokens`,
        `num_accepted_draft_tokens` (bonus tokens excluded), `num_spec_tokens` (k, or with
        k = "auto" the largest k this request drafted), `mean_acceptance_length`
        (1 + accepted / spec steps), `draft_acceptance_rate` (α̂ = accepted / drafted),
        `acceptance_histogram` (index j: steps that accepted exactly j drafts, length
        num_spec_tokens + 1) and `acceptance_histogram_by_draft_length` ({"k": [...]}).

        verispec's additions: `num_rounds` (all verification forwards, plain steps
        included), `num_accepted_tokens_per_pos` and `num_verified_tokens_per_pos`
        (position i: rounds that accepted / verified draft i+1),
        `per_position_acceptance` (their ratio: P(x_i accepted | x_1..x_{i-1} accepted)),
        `alpha` (exact α: mean Σ min(p, q) over verified draft positions),
        `num_draft_tokens_by_drafter` and `num_accepted_tokens_by_drafter` (drafter name ->
        tokens it drafted / had accepted, drafters that drafted only), `rule` and `seed` are
        added by the engine.
        """
        s = self.stats
        steps = sum(sum(h) for h in self.histogram.values())
        k_max = max(self.histogram, default=0)
        spec_tokens = k_setting if isinstance(k_setting, int) else k_max
        width = max(spec_tokens, k_max)
        dense = [0] * (width + 1)
        for counts in self.histogram.values():
            for j, c in enumerate(counts):
                dense[j] += c
        return {
            "mean_acceptance_length": 1 + s.accepted / steps if steps else None,
            "draft_acceptance_rate": s.draft_acceptance_rate,
            "acceptance_histogram": dense,
            "acceptance_histogram_by_draft_length": {str(k): list(v) for k, v in sorted(self.histogram.items())},
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": s.accepted,
            "num_draft_tokens": s.drafted,
            "num_spec_tokens": spec_tokens,
            "num_rounds": self.rounds,
            "num_accepted_tokens_per_pos": list(s.accepted_at),
            "num_verified_tokens_per_pos": list(s.reached),
            "per_position_acceptance": s.per_position_acceptance,
            "alpha": s.alpha_exact,
            "num_draft_tokens_by_drafter": {d: v["drafted"] for d, v in s.by_drafter.items() if v["drafted"]},
            "num_accepted_tokens_by_drafter": {d: v["accepted"] for d, v in s.by_drafter.items() if v["drafted"]},
        }

    def timing(self, arrival: float, started: float, finished: float) -> dict:
        """vLLM's per-request timing fields (milliseconds), from this request's clock readings.

        `queue_time_ms`: arrival to the start of decoding; `time_to_first_token_ms`: start
        to the first committed token (prefill included); `generation_time_ms`: first to
        last token; `mean_itl_ms`: that over (tokens - 1); `tokens_per_second`: tokens
        over start to last token. None where undefined.
        """
        n = len(self.token_ids)
        first = self.token_times[0][0] if self.token_times else None
        last = self.token_times[-1][0] if self.token_times else None
        ms = 1000.0
        return {
            "time_to_first_token_ms": (first - started) * ms if first is not None else None,
            "generation_time_ms": (last - first) * ms if first is not None else None,
            "queue_time_ms": (started - arrival) * ms,
            "mean_itl_ms": (last - first) * ms / (n - 1) if n > 1 else None,
            "tokens_per_second": n / (last - started) if n and last > started else None,
            "e2e_time_ms": (finished - arrival) * ms,
        }

    def inter_token_latencies(self) -> list[float]:
        """Seconds per token after the first round: each token of a round gets the time
        since the previous round divided by the round's tokens (a block of 4 arriving
        0.2 s after the last one is 4 tokens at 0.05 s)."""
        out = []
        for (t0, _), (t1, n) in zip(self.token_times, self.token_times[1:]):
            out += [(t1 - t0) / n] * n
        return out

    # -- internals -------------------------------------------------------------------------
    def _flush(self, text: str) -> None:
        if not text and not self._pending_ids:
            return
        chunk = Chunk(text, self._pending_ids, self._pending_lp)
        self._pending_ids, self._pending_lp = [], []
        self.text_sent += text
        if self.emit is not None:
            self.emit(chunk)

    def _logprobs(self, logits: torch.Tensor | None, tokens: list[int]) -> list[TokenLogprob]:
        if logits is None:
            raise RuntimeError("the decoder's RoundRecord carries no logits; logprobs need them")
        return token_logprobs(logits[:len(tokens)], tokens, self.n_logprobs or 0, self.pieces)


def token_logprobs(logits: torch.Tensor, tokens: list[int], n_top: int, pieces: Pieces) -> list[TokenLogprob]:
    """Log-probabilities of `tokens` under raw logits.

    Args:
        logits: [n, V] raw logits; row i is the distribution `tokens[i]` was drawn from
            (for prompt tokens: the logits after the tokens before it).
        tokens: n token ids.
        n_top: alternatives per position (0: the token only).
        pieces: token texts and bytes.

    Returns:
        n `TokenLogprob`s (natural log of softmax in float64, floored at LOGPROB_FLOOR).
    """
    rows = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for row, tok in zip(rows, tokens):
        top = []
        if n_top:
            values, ids = torch.topk(row, min(n_top, row.shape[-1]))
            top = [(int(i), *_text_and_bytes(pieces, int(i), _finite(float(v)))) for v, i in zip(values, ids)]
        text, raw = pieces(tok)
        out.append(TokenLogprob(tok, text, _finite(float(row[tok])), top, raw))
    return out


def _text_and_bytes(pieces: Pieces, token_id: int, logprob: float) -> tuple[str, float, list[int]]:
    text, raw = pieces(token_id)
    return text, logprob, raw


_PIECES: dict[int, tuple[object, Pieces]] = {}
_PIECES_LOCK = threading.Lock()


def pieces_of(tokenizer) -> Pieces:
    """The cached `Pieces` of a tokenizer (one per tokenizer object)."""
    with _PIECES_LOCK:
        hit = _PIECES.get(id(tokenizer))
        if hit is None or hit[0] is not tokenizer:
            hit = _PIECES[id(tokenizer)] = (tokenizer, Pieces(tokenizer))
        return hit[1]


def _finite(x: float) -> float:
    return max(LOGPROB_FLOOR, x)
