"""The decode worker: a bounded FIFO queue of requests, decoded one at a time.

Guarantees (batch size 1):

* Requests are decoded in arrival order by one worker thread, each by one call of
  `SpeculativeDecoder.generate` with the request's prompt ids and settings, so its
  output is exactly what `generate` gives for the same prompt, settings and seed
  (the models' numerics aside: on llama.cpp a batched forward can differ in the last
  bits, see docs/exactness.md).
* At most `max_queue` requests wait; one more is refused (`QueueFull`: HTTP 429 with
  ``Retry-After``, the estimated seconds until a place frees up).
* Prefix reuse: a request starts from the KV caches the previous one left. The core's
  rollback (`CausalLM.rollback_to`, called by `decode` and by the draft model) keeps the
  longest common prefix with the new prompt and prefills only the rest — a shared system
  prompt or the earlier turns of a chat are not computed again. The number of prompt
  tokens found is reported (`usage.prompt_tokens_details.cached_tokens`). With
  ``prefix_reuse=False`` both caches are emptied before every request instead.
* Cancellation: `Job.cancel` (a client that disconnected) stops the generation at the
  end of the round in flight (`RequestProgress.observe` raises), so at most one more
  round is decoded; the caches then hold the committed tokens and the next request
  starts at once. A request cancelled while queued is never decoded.
* Time limit: a request whose `Job.deadline` passes is stopped the same way (checked
  when it leaves the queue and after every round) and answered with a 408 naming the
  server's ``--request-timeout``.
* Shutdown (`drain`): queued requests get a 503; the one decoding gets a grace period,
  then stops after its round; a stream then ends with a final chunk (finish reason
  "abort", as vLLM's) and ``[DONE]``.
* Any exception from `generate` other than a `ValueError` (bad input: 400) empties both
  caches before the next request (500): a failed forward may leave them out of step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from .errors import ApiError, bad_request
from .metrics import ServerMetrics
from .progress import Cancelled, Chunk, RequestProgress, TokenLogprob, token_logprobs
from .schema import GenerationRequest

log = logging.getLogger("verispec.serve")

PROMPT_BLOCK = 256      # prompt tokens scored per forward for echo + logprobs


class QueueFull(Exception):
    """The queue holds `max_queue` requests; retry after `retry_after` seconds."""

    def __init__(self, retry_after: int, waiting: int) -> None:
        super().__init__(f"{waiting} requests are waiting; retry after {retry_after} s")
        self.retry_after, self.waiting = retry_after, waiting


@dataclass
class Outcome:
    """A finished generation, as the HTTP side renders it.

    Attributes:
        text: the generated text (cut before a stop string).
        token_ids: every generated id (EOS / the stop string's last token included).
        finish_reason: OpenAI's: "stop" (EOS or a stop string) or "length" (budget or
            context full).
        logprobs: one `TokenLogprob` per id when asked for, else empty.
        cached_tokens: prompt tokens the KV cache already held.
        metrics: vLLM's per-request timing fields plus `speculative_decoding`.
        prompt_logprobs: with echo and logprobs, one per prompt token (the first with
            logprob None: nothing precedes it).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)


class Job:
    """One request from arrival to its last event.

    Events for the HTTP side arrive on `events` (an asyncio queue of the loop that
    created the job): `Chunk`s while streaming, then one `Outcome` or one `ApiError`.

    Args:
        request: the validated request.
        loop: the event loop to deliver events to (default: the running one).
    """

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.request = request
        prefix = "chatcmpl" if request.endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.arrival = time.perf_counter()
        self.started: float | None = None
        self.finished: float | None = None
        self.finish_reason: str | None = None       # stop, length, abort, error
        self.cancel_requested = threading.Event()
        self.rounds_at_cancel: int | None = None
        self.deadline: float | None = None      # perf_counter reading; None = no time limit
        self.slot: int | None = None            # the sequence slot it decoded in (batched engine)
        self.shutting_down = False
        self.progress: RequestProgress | None = None
        self.loop = loop or asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def post(self, event) -> None:
        """Deliver an event to the HTTP side (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:      # the loop is closed: nobody is listening any more
            pass

    def cancel(self) -> None:
        """Stop this request: skipped if queued, stopped after the round in flight if running."""
        if not self.cancel_requested.is_set():
            self.rounds_at_cancel = self.progress.rounds if self.progress is not None else 0
            self.cancel_requested.set()


class Engine:
    """The queue and the decode worker thread (batch size 1; `batched.BatchedEngine`
    decodes several requests at once on llama.cpp).

    Args:
        decoder: a `SpeculativeDecoder` (or a subclass: its `generate`, `target`, `draft`
            and `tokenizer` are used).
        metrics: where finished requests are counted.
        max_queue: requests that may wait while one is decoded (>= 0).
        prefix_reuse: keep the KV caches between requests (see the module docstring).
        rule: the acceptance rule passed to every `generate` call ("auto", a name, or a
            `verispec.verify.Rule`, e.g. a deliberately biased one for an audit).
    """

    def __init__(self, decoder, metrics: ServerMetrics, *, max_queue: int = 32,
                 prefix_reuse: bool = True, rule="auto") -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0, got {max_queue!r}")
        self.decoder, self.metrics = decoder, metrics
        self.max_queue, self.prefix_reuse, self.rule = max_queue, prefix_reuse, rule
        self.running: list[Job] = []         # decoding now, oldest first (at most `slots`)
        self.history: deque[dict] = deque(maxlen=1024)   # finished jobs, newest last
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._service_seconds = 1.0     # decayed mean decode time, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="verispec-decode", daemon=True)
        self._thread.start()

    # -- the HTTP side -----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue `job` (`submit_all` of one)."""
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue `jobs` (the n choices of one request) all together, or none of them: a
        request is never half admitted, so a refused one leaves no choice behind to hold a
        queue place or be counted as aborted.

        Raises:
            QueueFull: when fewer than len(jobs) of the `max_queue` places are free.
            ApiError: 400 naming `n` when len(jobs) exceeds `max_queue` (it could never be
                admitted: retrying would not help); 503 when the server is shutting down.
        """
        with self._cv:
            if self._closed:
                raise ApiError(503, "the server is shutting down")
            if len(jobs) > max(self.max_queue, 1):
                raise bad_request("n", f"n = {len(jobs)} choices need {len(jobs)} queue places; this "
                                       f"server queues at most {self.max_queue} (--max-queue): ask for "
                                       f"fewer choices or send several requests")
            if len(self._queue) + len(jobs) > self.max_queue:
                ahead = len(self._queue) + len(jobs)
                raise QueueFull(max(1, math.ceil(self._service_seconds * ahead / self.slots)), len(self._queue))
            self._queue.extend(jobs)
            self.metrics.waiting.set(len(self._queue))
            self._cv.notify_all()

    slots = 1                       # requests decoded at once
    prompt_logprobs = True          # echo + logprobs supported

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def current(self) -> Job | None:
        """The oldest request decoding now, or None."""
        running = self.running
        return running[0] if running else None

    def idle(self) -> bool:
        """True when nothing is queued or decoding."""
        with self._cv:
            return not self._queue and not self.running

    def drain(self, grace: float) -> None:
        """Graceful shutdown: refuse new requests, answer the queued ones with a 503, let
        the ones decoding run up to `grace` seconds, then stop them after their round."""
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self.metrics.waiting.set(0)
        for job in pending:
            job.cancel()
            self._finish(job, "abort")
            job.post(_shutting_down())
        end = time.monotonic() + grace
        while True:
            with self._cv:
                running = list(self.running)
            if not running or time.monotonic() >= end:
                break
            time.sleep(0.02)
        for job in running:
            job.shutting_down = True
            job.cancel()

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new requests, cancel the queued ones and the ones decoding, and stop the
        worker (it finishes the round in flight)."""
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self.metrics.waiting.set(0)
            running = list(self.running)
            self._cv.notify_all()
        for job in pending:
            job.cancel()
            self._finish(job, "abort")
            job.post(_shutting_down())
        for job in running:
            job.shutting_down = True
            job.cancel()
        self._thread.join(timeout)

    # -- the worker thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not (self._queue and len(self.running) < self.slots):
                    self._cv.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
                self.metrics.waiting.set(len(self._queue))
                self.running.append(job)
                self.metrics.running.set(len(self.running))
            self._launch(job)

    def _launch(self, job: Job) -> None:
        """Decode `job` (here, in the worker thread: one at a time)."""
        self._serve(job)

    def _serve(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception:                     # never let the worker die
            log.exception("request %s failed outside generate", job.id)
        finally:
            with self._cv:
                self.running.remove(job)
                self.metrics.running.set(len(self.running))
                self._cv.notify_all()

    def _reuse(self, prompt_ids: list[int]) -> int:
        """Prepare the caches for `prompt_ids`; return how many prompt tokens they hold."""
        target, draft = self.decoder.target, self.decoder.draft
        if not self.prefix_reuse:
            target.reset()
            if draft is not None:
                draft.reset()
            return 0
        cached, limit = 0, min(len(target.tokens), len(prompt_ids) - 1)
        while cached < limit and target.tokens[cached] == prompt_ids[cached]:
            cached += 1
        return cached

    def _run(self, job: Job) -> None:
        req = job.request
        if job.cancel_requested.is_set():          # the client left while queued
            self._finish(job, "abort")
            job.post(ApiError(503, "the request was cancelled"))
            return
        if job.deadline is not None and time.perf_counter() > job.deadline:
            self._finish(job, "abort")
            job.post(_timed_out(job, 0))
            return
        job.started = time.perf_counter()
        tokenizer = self.decoder.tokenizer
        progress = RequestProgress(tokenizer, logprobs=req.logprobs,
                                   emit=job.post if req.stream else None,
                                   cancelled=job.cancel_requested, deadline=job.deadline)
        job.progress = progress
        cached = self._reuse(req.prompt_ids)
        prompt_lps: list[TokenLogprob] = []
        try:
            if req.echo and req.logprobs is not None:
                prompt_lps, cached = self._prompt_logprobs(req, progress), 0
            if req.echo and req.stream:
                job.post(Chunk(req.prompt_text or "", [], prompt_lps))
            result = self._generate(job, progress)
        except Cancelled:
            self._finish(job, "abort", cached)
            if progress.expired:
                job.post(_timed_out(job, len(progress.token_ids)))
            elif job.shutting_down:     # what was generated, ended as vLLM ends an aborted request
                progress.finish(progress.text_sent)
                job.post(Outcome(text=progress.text_sent, token_ids=list(progress.token_ids),
                                 finish_reason="abort", logprobs=progress.logprobs, cached_tokens=cached))
            else:
                job.post(ApiError(503, "the request was cancelled"))
            return
        except ValueError as e:                    # bad input the parser did not catch
            self._finish(job, "error", cached)
            job.post(bad_request(None, str(e)))
            return
        except Exception as e:
            log.exception("request %s failed", job.id)
            self._hard_reset()
            self._finish(job, "error", cached)
            job.post(ApiError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error"))
            return
        progress.finish(result.text)
        finished = time.perf_counter()
        spec = progress.spec_metrics(req.k)
        spec.update(rule=result.stats.rule, seed=result.stats.seed)
        outcome = Outcome(
            text=result.text, token_ids=list(result.token_ids),
            finish_reason=result.finish_reason,
            logprobs=progress.logprobs, cached_tokens=cached, prompt_logprobs=prompt_lps,
            metrics={**progress.timing(job.arrival, job.started, finished), "speculative_decoding": spec})
        self._finish(job, outcome.finish_reason, cached, finished)
        job.post(outcome)

    def _generate(self, job: Job, progress: RequestProgress, **extra):
        """`SpeculativeDecoder.generate` for the job's request (`extra`: more keywords)."""
        req = job.request
        return self.decoder.generate(
            req.prompt_ids, max_new_tokens=req.max_tokens, sampling=req.sampling, k=req.k,
            drafter=req.drafter, seed=req.seed, stop_strings=req.stop_strings, rule=self.rule,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            on_text=progress.on_text if req.stream and self.decoder.tokenizer is not None else None,
            observer=progress.observe, **extra)

    def _prompt_logprobs(self, req: GenerationRequest, progress: RequestProgress) -> list[TokenLogprob]:
        """Each prompt token's log-probability given the tokens before it (echo + logprobs).

        The target's cache is emptied and the prompt (but its last token) scored in
        blocks of `PROMPT_BLOCK` tokens, keeping every row: these forwards are also the
        prefill `generate` then skips, so the prompt is computed once. Blocks bound the
        memory to PROMPT_BLOCK x V logits at a time.
        """
        ids, target = req.prompt_ids, self.decoder.target
        target.truncate(0)
        text, raw = progress.pieces(ids[0])
        out = [TokenLogprob(ids[0], text, None, [], raw)]      # nothing precedes the first token
        for start in range(0, len(ids) - 1, PROMPT_BLOCK):
            block = ids[start:min(start + PROMPT_BLOCK, len(ids) - 1)]
            rows = target.forward(block)
            out += token_logprobs(rows, ids[start + 1:start + 1 + len(block)], req.logprobs, progress.pieces)
        return out

    def _hard_reset(self) -> None:
        for model in (self.decoder.target, self.decoder.draft):
            if model is not None:
                try:
                    model.reset()
                except Exception:
                    log.exception("could not reset %s", model.name)

    def _finish(self, job: Job, reason: str, cached: int = 0, finished: float | None = None) -> None:
        job.finished = finished or time.perf_counter()
        if job.started is not None:
            self._service_seconds = 0.8 * self._service_seconds + 0.2 * (job.finished - job.started)
        progress = job.progress
        self.metrics.record(finished_reason=reason, prompt_tokens=len(job.request.prompt_ids),
                            cached_tokens=cached, progress=progress, arrival=job.arrival,
                            started=job.started, finished=job.finished)
        self.history.append({"id": job.id, "finish_reason": reason,
                             "rounds": progress.rounds if progress else 0,
                             "rounds_at_cancel": job.rounds_at_cancel, "slot": job.slot,
                             "tokens": len(progress.token_ids) if progress else 0})
        job.finish_reason = reason


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down; retry later or on another replica",
                    code="server_shutting_down")


def _timed_out(job: Job, tokens: int) -> ApiError:
    limit = job.deadline - job.arrival if job.deadline is not None else 0.0
    return ApiError(408, f"the request ran past the server's time limit of {limit:g} s "
                         f"(--request-timeout; {tokens} tokens were generated): ask for fewer "
                         "max_tokens or a shorter prompt", code="request_timeout")
