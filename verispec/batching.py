"""Continuous batching of exact speculative decoding: one target forward per round for every request.

Each request runs the shipped round loop (`verispec.decoding.decode`) unchanged, with its
own drafters, policy, randomness, sampling controls and stop rule, against a
`SequenceView` (one slot of a `LlamaCppBatchModel`). The view does not run its forward
itself: it parks the rows (the prefill, or x_{t-1}, x_1..x_k of a verification) and waits.
When every live request is parked - each has proposed its block for this round, or is
prefilling - the driver runs ONE `forward_many`-style decode over all of them and hands
each its rows back; the rule, commit, rollback and policy update then run per request,
independently. Requests join (their prefill rides in the next round) and leave (EOS,
budget, stop string, cancellation) at round boundaries; a freed slot is reused by the
next request in the queue, whatever order they arrived in.

Why each output is its solo output: `decode` is a deterministic function of the logits its
target returns and of its own randomness (keyed by seed and output position, never by
round or batch), and `LlamaCppBatchModel` returns every sequence's logits bit-identical to
a solo forward whatever else shares the decode (tests/test_llamacpp_batch.py). So greedy
output equals the solo greedy output token for token, and a seeded sample equals the
seeded solo sample (under the coupled rule for any k; under the standard rule for the same
drafts). Only wall times (the policy's cost observations) depend on the company.

k for the load: after each shared forward the driver tells every request's cost model how
many sequences shared it and how many rows the others put in it
(`OnlineCostCurve.set_load`): the round's time is filed under the forward's total rows, and
an adaptive policy prices its next round with the planner's batch maths, T_t(B) for a plain
step against T_t(B(k+1)) + B·k·T_d for k drafts (the requests draft one after another while
the forward waits), so it drafts less as the forward fills up.
A request's target time for the round is the shared forward's own seconds; the time it
spent parked waiting for the others (their drafting, the hand-over) is reported apart
(`RoundRecord.waited_seconds`) and left out of its prices, since the others' policies price
their own drafts (counted in, a plain step looked as dear as the others' drafting made it,
drafting looked cheap, and two clients drafted each other into a loss).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from .decoding import DecodeResult, Policy, RoundRecord, decode
from .models.llamacpp import is_prefill
from .models.llamacpp_batch import LlamaCppBatchModel, SequenceView, is_prompt_piece
from .policy.costs import OnlineCostCurve
from .sampling import Randomness, SamplingConfig
from .verify import Rule, standard


class Cancelled(Exception):
    """The request was cancelled; raised by `BatchedRequest.result`."""


@dataclass
class RoundTiming:
    """Where one round's wall time went (seconds, `time.perf_counter`), for `on_round`.

    Attributes:
        gather: from the previous forward's end (or the first request's admission) until
            every live request had parked its rows: the requests' own work between forwards
            (rule, commit, streaming, policy, drafting) and the hand-overs, while the target
            waits.
        forward: the shared target forward itself.
        sequences: requests with rows in the forward.
        rows: rows in the forward.
        prefill_rows: of those, rows of prompt pieces (prefills run in forwards of their own,
            `LlamaCppBatchModel.score_rows`).
    """

    gather: float
    forward: float
    sequences: int
    rows: int
    prefill_rows: int


class _ParkedView(SequenceView):
    """A slot whose forwards are run by the driver, together with every other live request's."""

    driver: BatchedRounds
    request: BatchedRequest

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        start = time.perf_counter()
        logits, forward = self.driver._park(self.request, tokens, keep)
        # the base class times the whole call; only the shared forward is this slot's cost,
        # the rest waited for the other requests to park (their drafting) and the hand-over
        waited = max(0.0, time.perf_counter() - start - forward)
        self.waited_seconds += waited
        self.forward_seconds -= waited
        return logits


@dataclass(eq=False)
class BatchedRequest:
    """One request in a `BatchedRounds`; `result()` waits for it.

    Attributes:
        prompt: token ids (len >= 1).
        slot: the model slot it decodes in (None while queued).
        rows_last_round: rows it put in the last forward (0 before its first).
        cancelled: `cancel()` was called (or see `is_cancelled`).
        cancel_event: an event whose setting cancels it too (a server's disconnect flag).
    """

    prompt: list[int]
    policy: Policy
    kwargs: dict
    order: int = 0
    slot: int | None = None
    rows_last_round: int = 0
    cancelled: bool = False
    cancel_event: threading.Event | None = None     # set from elsewhere: as `cancel()` (anything with is_set())
    _done: threading.Event = field(default_factory=threading.Event)
    _result: DecodeResult | None = None
    _error: BaseException | None = None

    def cancel(self) -> None:
        """End this request at its next round boundary; the others are not affected."""
        self.cancelled = True

    def is_cancelled(self) -> bool:
        """`cancel()` was called or `cancel_event` is set."""
        return self.cancelled or (self.cancel_event is not None and self.cancel_event.is_set())

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> DecodeResult:
        """The request's `DecodeResult`, waiting up to `timeout` seconds (None: forever).

        Raises:
            Cancelled: when `cancel()` ended it.
            TimeoutError: when it is not done within `timeout`.
            Exception: whatever its decode raised (bad prompt, context full, ...).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not done within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class BatchedRounds:
    """Runs many `decode` calls on one `LlamaCppBatchModel`, one shared forward per round.

    Args:
        model: the multi-sequence target; at most `model.n_seq_max` requests decode at
            once, the others wait in arrival order for a slot.
        prefill_chunk: most prompt tokens of one request's prefill run per round (None:
            the whole prompt at once). A long prompt then does not stall the others'
            rounds; its prefill runs in pieces of this size, which equals the solo run
            exactly where llama.cpp's prefill kernels do not depend on the piece size
            (not so for K-quant weights above 7 rows: the tiled matmul; keep None there,
            or a multiple of 512 - docs/exactness.md).
        max_batched_rows: the most rows a round's forward carries (None: no bound). Every
            decoding sequence's rows (verification blocks, single steps) always run; prefill
            pieces (a prompt's rows beyond `INVARIANT_ROWS`, at most `prefill_chunk` each)
            join a round oldest request first while the round stays within the bound,
            except that the oldest waiting prefill gets one piece every round, so no
            prompt waits forever. A prefill left out waits, parked, for the next round.

    Use `submit` from any thread, `result()` on what it returns, and `close()` at the end
    (it waits for the running requests).
    """

    def __init__(self, model: LlamaCppBatchModel, prefill_chunk: int | None = None,
                 max_batched_rows: int | None = None) -> None:
        for name, value in (("prefill_chunk", prefill_chunk), ("max_batched_rows", max_batched_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
        self.model = model
        self.prefill_chunk, self.max_batched_rows = prefill_chunk, max_batched_rows
        self._arrivals = 0
        self._prefilled: dict[BatchedRequest, int] = {}   # prompt rows already run, per request
        self._cond = threading.Condition()
        self._queue: list[BatchedRequest] = []
        self._live: dict[BatchedRequest, _ParkedView] = {}
        self._parked: dict[BatchedRequest, tuple[list[int], int]] = {}
        self._answers: dict[BatchedRequest, tuple[torch.Tensor | BaseException, float]] = {}   # and forward s
        self._closing = False
        self.forwards = 0          # target forwards run (shared rounds, and a lone request's own), for statistics
        self.max_live = 0          # most requests decoding together so far
        self.on_round: Callable[[RoundTiming], None] | None = None   # told after every forward
        self._gather_from: float | None = None    # end of the last forward, while requests are live
        self._scheduler = threading.Thread(target=self._schedule, name="verispec-batch", daemon=True)
        self._scheduler.start()

    # -- public ---------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], policy: Policy, *, sampling: SamplingConfig,
               max_new_tokens: int, rng: Randomness, rule: Rule = standard,
               stop: Callable[[list[int]], bool] | None = None,
               on_commit: Callable[[list[int]], None] | None = None,
               observer: Callable[[RoundRecord], None] | None = None,
               eos_token_ids: Collection[int] | None = None,
               cancel_event: threading.Event | None = None) -> BatchedRequest:
        """Queue one generation; arguments as `verispec.decoding.decode` (its target is a slot).

        The policy, its drafters and `rng` must be this request's own (not shared with a
        request running at the same time). `cancel_event`: setting it cancels the request
        as `cancel()` does (also while its prompt waits for, or runs in, prefill pieces).

        Raises:
            ValueError: an empty prompt, or one that does not fit a slot's context.
            RuntimeError: after `close()`.
        """
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        if len(prompt) >= self.model.context_length:
            raise ValueError(f"prompt has {len(prompt)} tokens but a slot's context length is "
                             f"{self.model.context_length}; shorten the prompt or load the model "
                             f"with a larger n_ctx_per_seq")
        request = BatchedRequest(prompt, policy, dict(
            sampling=sampling, max_new_tokens=max_new_tokens, rng=rng, rule=rule, stop=stop,
            on_commit=on_commit, observer=observer, eos_token_ids=eos_token_ids),
            cancel_event=cancel_event)
        with self._cond:
            if self._closing:
                raise RuntimeError("this BatchedRounds is closed")
            request.order, self._arrivals = self._arrivals, self._arrivals + 1
            self._queue.append(request)
            self._admit()
        return request

    def close(self) -> None:
        """Refuse new requests, wait for the queued and running ones, stop the scheduler."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._scheduler.join()

    # -- request threads ------------------------------------------------------------------
    def _admit(self) -> None:
        """Start queued requests while slots are free (holding the condition)."""
        while self._queue and self.model.free_slots:
            if not self._live:
                self._gather_from = time.perf_counter()
            request = self._queue.pop(0)
            view = self.model.open(view_type=_ParkedView)
            view.driver, view.request = self, request
            request.slot = view.slot
            self._live[request] = view
            self.max_live = max(self.max_live, len(self._live))
            threading.Thread(target=self._run, args=(request, view), daemon=True,
                             name=f"verispec-seq{view.slot}").start()

    def _run(self, request: BatchedRequest, view: _ParkedView) -> None:
        kwargs = dict(request.kwargs)
        user_observer = kwargs.pop("observer")

        def observer(record: RoundRecord) -> None:
            if user_observer is not None:
                user_observer(record)
            if request.is_cancelled():
                raise Cancelled("cancelled")

        try:
            if request.is_cancelled():
                raise Cancelled("cancelled")
            request._result = decode(view, request.prompt, request.policy, observer=observer, **kwargs)
        except BaseException as e:   # noqa: BLE001 - handed to the caller by result()
            request._error = e
        finally:
            view.close()
            with self._cond:
                del self._live[request]
                self._parked.pop(request, None)
                self._prefilled.pop(request, None)
                self._admit()
                self._cond.notify_all()
            request._done.set()

    def _park(self, request: BatchedRequest, tokens: list[int], keep: int) -> tuple[torch.Tensor, float]:
        """Called by a request's view: wait for the shared forward and return this slot's rows
        and the forward's own seconds (the rest of the wait was for the others).

        Alone (no other live or queued request, no prefill to chunk) the request runs its
        forward itself, without the hand-over to the scheduler thread: the same rows, the
        same logits. A request admitted meanwhile is not served until this one parks.
        """
        with self._cond:
            alone = (len(self._live) == 1 and not self._queue and
                     (self.prefill_chunk is None or len(tokens) <= self.prefill_chunk))
            if not alone:
                self._parked[request] = (tokens, keep)
        if alone:
            costs = getattr(request.policy, "costs", None)
            if isinstance(costs, OnlineCostCurve):
                costs.set_load()
            request.rows_last_round = len(tokens)
            slot = self._live[request].slot
            start = time.perf_counter()
            try:
                logits = self.model.score_rows({slot: (tokens, keep)})[slot]
            finally:
                forward = self._timed(start, {request: (tokens, keep, 0)})
            return logits, forward
        with self._cond:
            self._cond.notify_all()
            self._cond.wait_for(lambda: request in self._answers)
            answer, forward = self._answers.pop(request)
        if isinstance(answer, BaseException):
            raise answer
        return answer, forward

    # -- the scheduler ----------------------------------------------------------------------
    def _plan(self, parked: dict) -> tuple[dict, dict]:
        """This round's rows: request -> (tokens, keep, offset), and the requests whose
        prompt is not all run by it (they stay parked). Decoding rows first, then prefill
        pieces, oldest request first, within `max_batched_rows` (class docstring)."""
        batch, unfinished, prefills = {}, {}, []
        for request, (tokens, keep) in parked.items():
            done = self._prefilled.get(request, 0)
            if is_prefill(len(tokens) - done, keep):
                prefills.append(request)
            else:
                batch[request] = (tokens[done:], keep, done)
                self._prefilled.pop(request, None)
        rows, pieces = sum(len(plan[0]) for plan in batch.values()), 0
        for request in sorted(prefills, key=lambda r: r.order):
            tokens, keep = parked[request]
            done = self._prefilled.get(request, 0)
            piece = len(tokens) - done if self.prefill_chunk is None else min(self.prefill_chunk,
                                                                             len(tokens) - done)
            limit = self.max_batched_rows
            if pieces and limit is not None and rows + piece > limit:
                unfinished[request] = (tokens, keep)          # waits for a later round
                continue
            rows, pieces = rows + piece, pieces + 1
            if done + piece < len(tokens):
                batch[request] = (tokens[done:done + piece], 0, done)   # no logits yet
                unfinished[request] = (tokens, keep)
                self._prefilled[request] = done + piece
            else:
                batch[request] = (tokens[done:], keep, done)
                self._prefilled.pop(request, None)
        return batch, unfinished

    def _timed(self, start: float, batch: dict) -> float:
        """Count a forward that began at `start` and just ended, over `batch`'s rows
        (request -> (tokens, keep, offset)), tell `on_round` where the round's time went,
        and return the forward's seconds."""
        end = time.perf_counter()
        with self._cond:
            gather = max(0.0, start - self._gather_from) if self._gather_from is not None else 0.0
            self._gather_from = end
            self.forwards += 1
        prefill = sum(len(tokens) for tokens, keep, offset in batch.values()
                      if is_prompt_piece(len(tokens), keep, offset))
        if self.on_round is not None:
            self.on_round(RoundTiming(gather=gather, forward=end - start, sequences=len(batch),
                                      rows=sum(len(plan[0]) for plan in batch.values()),
                                      prefill_rows=prefill))
        return end - start

    def _ready(self) -> bool:
        """Every live request is parked (holding the condition)."""
        return bool(self._live) and len(self._parked) == len(self._live)

    def _schedule(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ready() or (self._closing and not self._live
                                                               and not self._queue))
                if not self._ready():
                    return
                parked, self._parked = self._parked, {}
                slots = {r: self._live[r].slot for r in parked}
                gone = {r: (Cancelled("cancelled"), 0.0) for r in parked if r.is_cancelled()}
                if gone:          # cancelled while parked: answered now, not run (a long prefill)
                    self._answers.update(gone)
                    self._cond.notify_all()
                    parked = {r: v for r, v in parked.items() if r not in gone}
                    if not parked:
                        continue
            batch, unfinished = self._plan(parked)
            total = sum(len(plan[0]) for plan in batch.values())
            for request, plan in batch.items():   # each request is parked: its policy idles
                request.rows_last_round = len(plan[0])
                costs = getattr(request.policy, "costs", None)
                if isinstance(costs, OnlineCostCurve):
                    costs.set_load(sequences=len(batch), other_rows=total - len(plan[0]))
            start = time.perf_counter()
            try:
                logits = self.model.score_rows({slots[r]: plan for r, plan in batch.items()})
                answers = {r: logits[slots[r]] for r in batch if r not in unfinished}
            except BaseException as e:   # noqa: BLE001 - every request in the forward gets it
                answers = {r: e for r in batch}
                unfinished = {r: v for r, v in unfinished.items() if r not in batch}
            forward = self._timed(start, batch)
            with self._cond:
                self._answers.update({r: (answer, forward) for r, answer in answers.items()})
                self._parked.update(unfinished)   # still parked: the rest of its prompt next round
                self._cond.notify_all()
