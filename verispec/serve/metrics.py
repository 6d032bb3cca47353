"""Prometheus metrics for `/metrics`, in the `verispec:` namespace, mirroring vLLM's names.

Counters are updated once per finished request, from the same numbers its response
reports, so summed over responses they equal the totals here exactly:

| metric | type | what (per request, summed) |
|---|---|---|
| `verispec:request_success_total{finished_reason}` | counter | requests by finish: stop, length, abort (client gone / shutdown), error |
| `verispec:prompt_tokens_total` | counter | `usage.prompt_tokens` |
| `verispec:generation_tokens_total` | counter | `usage.completion_tokens` |
| `verispec:prefix_cache_queries_total`, `verispec:prefix_cache_hits_total` | counter | prompt tokens looked up / found in the KV cache (`usage.prompt_tokens_details.cached_tokens`) |
| `verispec:spec_decode_num_drafts_total` | counter | `num_spec_steps`: verification rounds that carried drafts |
| `verispec:spec_decode_num_draft_tokens_total` | counter | `num_draft_tokens` |
| `verispec:spec_decode_num_accepted_tokens_total` | counter | `num_accepted_draft_tokens` |
| `verispec:spec_decode_num_accepted_tokens_per_pos_total{position}` | counter | `num_accepted_tokens_per_pos[position]` (0-based, as vLLM) |
| `verispec:spec_decode_num_rounds_total` | counter | `num_rounds`: all verification forwards (plain steps included) |
| `verispec:spec_decode_alpha_sum_total`, `verispec:spec_decode_num_verified_tokens_total` | counter | Σ min(p, q) over verified draft positions, and their number: exact α = the first / the second |
| `verispec:spec_decode_acceptance_length` | histogram | per round with drafts: accepted drafts + 1 (the tokens it committed, bonus included) |
| `verispec:time_to_first_token_seconds` | histogram | arrival to first token (queue wait included, as vLLM) |
| `verispec:inter_token_latency_seconds` | histogram | per token after the first round (see `RequestProgress.inter_token_latencies`) |
| `verispec:e2e_request_latency_seconds` | histogram | arrival to finish |
| `verispec:request_queue_time_seconds` | histogram | arrival to start of decoding |
| `verispec:num_requests_running`, `verispec:num_requests_waiting` | gauge | now: decoding (0 or 1, up to `--max-seqs` batched), queued |

With `--max-seqs` > 1 (continuous batching) four counters say, per target forward of the
batched mode (a shared round, or a request alone running its own; `verispec.batching.RoundTiming`),
where the server's time goes; they are not per request:

| metric | type | what (per forward, summed) |
|---|---|---|
| `verispec:batch_forwards_total`, `verispec:batch_rows_total` | counter | target forwards, and the rows they carried |
| `verispec:batch_forward_seconds_total{kind}` | counter | seconds inside forwards: `kind="decode"` (no prompt rows) or `"prefill"` (carried prompt pieces) |
| `verispec:batch_gather_seconds_total` | counter | seconds the target waited between forwards for every live request to park its rows (their rule, streaming, policy and drafting, and the hand-overs) |

(The exposition appends `_total` to counters, as vLLM's do: `vllm:spec_decode_num_drafts_total`.)
Every series carries a `model_name` label (the served model name), as vLLM's do, so
dashboards and readers written for vLLM can filter on it.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_ITL = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The server's Prometheus metrics, in their own registry (several apps can coexist).

    Args:
        model_name: the value of every series' `model_name` label.
        registry: where to register; default a fresh `CollectorRegistry`.
    """

    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.model_name = model_name

        def named(metric, labels=()):
            # a metric with no other label: its one child; with others: a labels() that
            # takes only them
            if not labels:
                return metric.labels(model_name=model_name)
            return _Partial(metric, model_name)

        def counter(name, doc, labels=()):
            return named(Counter(f"verispec:{name}", doc, ["model_name", *labels], registry=r), labels)

        def histogram(name, doc, buckets):
            return named(Histogram(f"verispec:{name}", doc, ["model_name"], buckets=buckets, registry=r))

        def gauge(name, doc):
            return named(Gauge(f"verispec:{name}", doc, ["model_name"], registry=r))

        self.requests = counter("request_success", "Finished requests by finish reason "
                                "(stop, length, abort, error).", ["finished_reason"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens of finished requests.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the KV cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the KV cache (not prefilled).")
        self.drafts = counter("spec_decode_num_drafts", "Verification rounds that carried drafts.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted (bonus excluded).")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted drafts by position in the block (0-based).", ["position"])
        self.rounds = counter("spec_decode_num_rounds", "Verification forwards, plain steps included.")
        self.alpha_sum = counter("spec_decode_alpha_sum", "Sum of Σ min(p, q) over verified draft "
                                 "positions (exact α = this / num_verified_tokens).")
        self.verified = counter("spec_decode_num_verified_tokens", "Draft positions verified.")
        self.acceptance_length = histogram(
            "spec_decode_acceptance_length", "Tokens committed by a round with drafts: "
            "accepted drafts + 1.", [i + 0.5 for i in range(17)])
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token.", _LATENCY)
        self.itl = histogram("inter_token_latency_seconds", "Seconds per token after the first round.", _ITL)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to start of decoding.", _LATENCY)
        self.batch_forwards = counter("batch_forwards", "Shared target forwards (batched mode).")
        self.batch_rows = counter("batch_rows", "Rows in shared target forwards (batched mode).")
        self.batch_forward_seconds = counter(
            "batch_forward_seconds", "Seconds inside shared target forwards, by kind: decode, or "
            "prefill (the forward carried prompt pieces).", ["kind"])
        self.batch_gather_seconds = counter(
            "batch_gather_seconds", "Seconds the target waited between forwards for every live "
            "request to park its rows (batched mode).")
        self.running = gauge("num_requests_running", "Requests being decoded (0 or 1; up to --max-seqs batched).")
        self.waiting = gauge("num_requests_waiting", "Requests queued.")
        for reason in ("stop", "length", "abort", "error"):
            self.requests.labels(reason)    # exported at 0 from the start

    def record(self, *, finished_reason: str, prompt_tokens: int, cached_tokens: int, progress,
               arrival: float, started: float | None, finished: float) -> None:
        """Count one finished request.

        Args:
            finished_reason: "stop", "length", "abort" or "error".
            prompt_tokens: its prompt length; cached_tokens: how many of them the KV cache held.
            progress: its `RequestProgress` (None if it never started decoding).
            arrival, started, finished: `time.perf_counter()` readings (started None: never ran).
        """
        self.requests.labels(finished_reason).inc()
        self.e2e.observe(finished - arrival)
        if started is None or progress is None:
            return
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)
        self.queue_time.observe(started - arrival)
        s = progress.stats
        self.generation_tokens.inc(len(progress.token_ids))
        self.drafts.inc(sum(sum(h) for h in progress.histogram.values()))
        self.draft_tokens.inc(s.drafted)
        self.accepted.inc(s.accepted)
        for pos, n in enumerate(s.accepted_at):
            self.accepted_per_pos.labels(str(pos)).inc(n)
        self.rounds.inc(progress.rounds)
        self.alpha_sum.inc(s.alpha_sum)
        self.verified.inc(sum(s.reached))
        for counts in progress.histogram.values():
            for j, c in enumerate(counts):
                for _ in range(c):
                    self.acceptance_length.observe(j + 1)
        if progress.token_times:
            self.ttft.observe(progress.token_times[0][0] - arrival)
        for gap in progress.inter_token_latencies():
            self.itl.observe(gap)

    def record_round(self, timing) -> None:
        """Count one shared forward of the batched mode (a `verispec.batching.RoundTiming`)."""
        self.batch_forwards.inc()
        self.batch_rows.inc(timing.rows)
        self.batch_forward_seconds.labels("prefill" if timing.prefill_rows else "decode").inc(timing.forward)
        self.batch_gather_seconds.inc(timing.gather)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _Partial:
    """A labelled metric whose `model_name` is already given: `.labels(*others)`."""

    def __init__(self, metric, model_name: str) -> None:
        self.metric, self.model_name = metric, model_name

    def labels(self, *values: str):
        return self.metric.labels(self.model_name, *values)
