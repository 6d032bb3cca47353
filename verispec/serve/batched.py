"""The batched decode worker: several requests decode at once on llama.cpp (continuous batching).

`BatchedEngine` keeps `Engine`'s queue, limits, cancellation, deadlines and shutdown, and
replaces its one-at-a-time worker: up to `slots` requests decode together, each in a thread
of its own running `SpeculativeDecoder.generate` (same prompt handling, stop strings, seeds,
stop ids, streaming and statistics as the single-request path) whose target forwards go to a
shared `verispec.batching.BatchedRounds`. Every round, ONE llama.cpp forward scores every
running request's rows (its verification block, a plain step, or a piece of its prompt);
a request joins at the next round boundary after a slot frees up and leaves when it ends
(EOS, budget, stop string, disconnect, deadline), whichever slot it held and in whatever
order the requests arrived.

Why each response is its solo response (token for token under greedy decoding; under
sampling, the seeded solo sample with the coupled rule, the same law with the standard
rule): `decode` depends only on the logits its target returns and on the request's own
randomness, keyed by (seed, position); each request has its own policy, drafters and
random stream; and `LlamaCppBatchModel` (batch-invariant kernels, one KV stream per slot,
prompt pieces of llama.cpp's own n_batch = 512) returns every slot's logits bit-identical
to a solo forward whatever else shares the forward (`verispec.batching`,
tests/test_llamacpp_batch.py, tests/test_serve_batched.py).

What batched mode does differently from batch size 1 (said in `verispec serve --help`):

* no prefix reuse: a slot's cache is emptied when its request ends, so every prompt is
  prefilled from scratch (`usage.prompt_tokens_details.cached_tokens` is 0);
* no prompt log-probabilities (`echo` with `logprobs`: a 400 naming `echo`);
* the suffix drafter drafts from the prompt and the output only, not from earlier
  responses (the cross-request suffix cache is not shared between threads);
* a draft model decodes in a second `LlamaCppBatchModel` with one slot per request; its
  forwards are each request's own (serialised), not batched, and priced so: B sequences'
  drafts cost B·k·T_d (`verispec.policy.costs`), so under load the draft model drafts only
  where that still pays on the prices already measured (no probes, no untimed catch-up under
  load: `verispec.policy.adaptive`);
* k = "auto": each request has its own adaptive policy, started from the decoder's
  calibrated cost curve and told the load every round (`OnlineCostCurve.set_load`), so
  it drafts less as other requests fill the forward.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass

from ..batching import BatchedRounds
from ..batching import Cancelled as BatchCancelled
from ..drafters import build_drafters
from ..models.llamacpp_batch import N_BATCH, LlamaCppBatchModel
from ..policy import make_policy
from .engine import Engine, Job
from .metrics import ServerMetrics
from .progress import Cancelled, RequestProgress


@dataclass
class BatchModels:
    """The multi-sequence twins of a decoder's llama.cpp models (`load_batch_models`).

    Attributes:
        target: the target with `n_seq_max` slots (the most requests decoding at once).
        draft: the draft model with as many slots, or None.
    """

    target: LlamaCppBatchModel
    draft: LlamaCppBatchModel | None = None

    def free(self) -> None:
        """Release llama.cpp's memory of both models."""
        for model in (self.target, self.draft):
            if model is not None:
                model.free()


def check_max_seqs(max_seqs, backend: str | None) -> None:
    """Raise ValueError naming `max_seqs` unless it is an integer >= 1, and > 1 only on llama.cpp."""
    if isinstance(max_seqs, bool) or not isinstance(max_seqs, int) or max_seqs < 1:
        raise ValueError(f"max_seqs must be an integer >= 1, got {max_seqs!r}")
    if max_seqs > 1 and backend not in (None, "llamacpp"):
        raise ValueError(f"max_seqs {max_seqs} needs the llama.cpp backend: the {backend} backend "
                         "decodes one request at a time (use max_seqs 1, or the llama.cpp backend)")


def load_batch_models(decoder, max_seqs: int, n_ctx_per_seq: int | None = None) -> BatchModels:
    """Open `decoder`'s llama.cpp target (and draft) again with `max_seqs` slots each.

    The GGUF files, threads, tokenizer and batch-invariant mode are the decoder's models'
    (llama.cpp maps the weights, so they are shared; each slot adds its KV cache).

    Args:
        decoder: a `SpeculativeDecoder` on the llama.cpp backend.
        max_seqs: slots, >= 1.
        n_ctx_per_seq: context length of each slot (default: the target's).

    Raises:
        ValueError: naming `max_seqs` when it is not an integer >= 1, or when the decoder's
            target is not a llama.cpp model (the transformers backend decodes one request
            at a time).
    """
    check_max_seqs(max_seqs, getattr(decoder.target, "backend", None))
    if not hasattr(decoder.target, "llama"):
        raise ValueError(f"max_seqs > 1 needs a llama.cpp target loaded from a GGUF file; "
                         f"{decoder.target.name} is a {type(decoder.target).__name__}")

    def twin(model) -> LlamaCppBatchModel:
        batch = LlamaCppBatchModel.load(
            model.llama.model_path, n_seq_max=max_seqs, name=model.name,
            n_ctx_per_seq=min(n_ctx_per_seq or decoder.target.context_length, model.context_length),
            n_threads=getattr(model.llama, "n_threads", None), batch_invariant=model.batch_invariant)
        batch.tokenizer, batch.eos_token_ids = model.tokenizer, model.eos_token_ids
        return batch

    draft = decoder.draft
    return BatchModels(twin(decoder.target), twin(draft) if hasattr(draft, "llama") else None)


class _Stop:
    """A job's stop flag as `BatchedRounds` reads it (`is_set`): its client left, or its
    time limit passed (so a prompt still in prefill pieces stops too)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def expired(self) -> bool:
        return self.job.deadline is not None and time.perf_counter() > self.job.deadline

    def is_set(self) -> bool:
        return self.job.cancel_requested.is_set() or self.expired()


class BatchedEngine(Engine):
    """`Engine` with up to `batch.target.n_seq_max` requests decoding at once (module docstring).

    Args:
        decoder: the `SpeculativeDecoder` whose settings, tokenizer and cost curve are used
            (its own models decode nothing here, but calibrate the cost curve).
        metrics: where finished requests are counted.
        batch: the multi-sequence models (`load_batch_models`).
        max_queue: requests that may wait while all slots decode.
        rule: as `Engine`.
        max_batched_rows: the most rows a round's forward carries (`BatchedRounds`);
            None: no bound.
        prefill_chunk: prompt rows per piece (default 512, llama.cpp's n_batch, which
            keeps a prompt in pieces exactly as a solo prefill; see `BatchedRounds`).

    Raises:
        ValueError: naming `max_batched_rows`, `prefill_chunk` or `max_queue` when out of range.
    """

    prompt_logprobs = False

    def __init__(self, decoder, metrics: ServerMetrics, batch: BatchModels, *, max_queue: int = 32,
                 rule="auto", max_batched_rows: int | None = None, prefill_chunk: int = N_BATCH) -> None:
        self.batch = batch
        self.slots = batch.target.n_seq_max
        self.rounds = BatchedRounds(batch.target, prefill_chunk=prefill_chunk,
                                    max_batched_rows=max_batched_rows)
        self.rounds.on_round = lambda timing: self.metrics.record_round(timing)   # self.metrics may be replaced
        self._policies = threading.Lock()      # the decoder's shared policies, calibration
        super().__init__(decoder, metrics, max_queue=max_queue, prefix_reuse=False, rule=rule)

    def _launch(self, job: Job) -> None:
        threading.Thread(target=self._serve, args=(job,), name=f"verispec-{job.id[-8:]}",
                         daemon=True).start()

    def _reuse(self, prompt_ids: list[int]) -> int:
        return 0          # every slot starts empty (module docstring)

    def _hard_reset(self) -> None:
        pass              # the failed request's slot was emptied when it ended

    def close(self, timeout: float | None = 30.0) -> None:
        super().close(timeout)
        self.rounds.close()

    def _generate(self, job: Job, progress: RequestProgress, **extra):
        req = job.request
        uses_model = self.batch.draft is not None and "model" in self.decoder.drafter_names(req.drafter)
        draft = self.batch.draft.open() if uses_model else None
        try:
            policy = self._policy(req, build_drafters(req.drafter, draft))

            def run(ids, policy, **kwargs):
                handle = self.rounds.submit(ids, policy, cancel_event=_Stop(job), **kwargs)
                job.slot = handle.slot
                try:
                    return handle.result()
                except BatchCancelled:      # stopped while its prompt waited or ran in pieces
                    progress.expired = _Stop(job).expired()
                    raise Cancelled("cancelled") from None

            return super()._generate(job, progress, policy=policy, run=run, **extra)
        finally:
            if draft is not None:
                draft.close()

    def _policy(self, req, drafters: dict):
        """This request's own policy: a fixed k, or an adaptive one started from a copy of
        the decoder's calibrated cost curve for the request's drafter choice."""
        k_max = self.decoder.k_max
        if req.k != "auto":
            return make_policy(req.k, drafters, k_max=k_max)
        policy = make_policy("auto", drafters, k_max=k_max)
        if drafters:
            with self._policies:
                shared = self.decoder.auto_policy(req.drafter, req.prompt_ids if req.max_tokens > 1 else None)
                policy.costs = copy.deepcopy(shared.costs)
                policy.calibrated = shared.calibrated
        policy.start(req.max_tokens)
        return policy
