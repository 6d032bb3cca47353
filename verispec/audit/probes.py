"""Stateful probes: the bugs a cold, one-request-at-a-time sampler never sees.

Servers break losslessness in state and plumbing more often than in the acceptance
arithmetic: caches written over rejected drafts and reused by a later request sharing
the prefix, caches not rolled back, output that depends on the batch slot, penalties
skipped at draft positions, logprob 0 for drafted tokens, streams that drop bytes.
Each probe is a small deterministic check, greedy unless stated, against the local
reference scored by teacher forcing (`verispec.audit.scoring`): a greedy token that
is not the reference's argmax is a bug unless its top-2 margin is within the numerics
floor (then "numerics", counted, not a FAIL), and two requests that must agree must
agree token for token.

| probe | requests | FAILs when |
|---|---|---|
| ``cold-warm`` | a fresh prompt twice | either is not the argmax path, or they differ |
| ``shared-prefix`` | P+a, P+b, P+a again | any is not the argmax path, or the two P+a differ |
| ``concurrency`` | 4 prompts solo, then staggered together | a concurrent output differs from its solo one beyond a near-tie |
| ``context-limit`` | prompt + m = the context length | not the argmax path (skipped: limit unknown) |
| ``stream`` | the same request (≥ 64 tokens) streamed and not | ids or text differ, or text ≠ detokenised ids |
| ``controls`` | penalties and a logit bias on, ≥ 64 tokens (penalties alone if the bias is refused with a 400) | not the argmax path of the controlled p |
| ``logprobs`` | T = 1, logprobs on | a returned logprob is off the reference's by > tol |
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..models.base import CausalLM
from ..sampling import SamplingConfig
from .endpoint import Endpoint, EndpointError
from .scoring import NEAR_TIE_MARGIN, score_completion

__all__ = ["PROBES", "ProbeContext", "ProbeResult", "attribute_to_spec_off", "run_probes"]

PROBES = ("cold-warm", "shared-prefix", "concurrency", "context-limit", "stream", "controls", "logprobs")

#: the controls probe's request fields
#: (strong, so that a penalty skipped at a draft position changes some argmax within 2m tokens)
CONTROLS = (("presence_penalty", 2.0), ("frequency_penalty", 1.0), ("repetition_penalty", 1.3))

#: the stream probe's least tokens per request: byte-losing chunk bugs show only in chunks that
#: carry several tokens (an accepted draft); on the zoo at k = 3, 16 greedy tokens of a random
#: prompt commit one token per round throughout in 2 % of prompts, 64 tokens far more rarely
STREAM_TOKENS = 64

#: the controls probe's least tokens per request: a penalty skipped at draft positions moves an
#: argmax only once a token repeats; on the zoo, 2 prompts x 32 tokens missed it in 2 of 300
#: nonces, x 64 tokens in none
CONTROLS_TOKENS = 64


@dataclass
class ProbeResult:
    name: str
    status: str          # pass | FAIL | skipped | spec-off too (fails without speculation as well)
    detail: str
    requests: int = 0
    numerics: int = 0    # greedy near-ties seen (not failures)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ProbeContext:
    """What the probes need: the audited endpoint, the local reference, the audit's
    prompts (ids), tokens per request, the near-tie margin, and optionally a
    detokeniser (ids -> text) and the context length (else read from /v1/models).

    `nonce` salts the probes' fresh prompts (so that no server has them cached); None takes
    one from the clock. A rerun on the spec-off server passes the audited run's nonce, so
    that both servers answer the very same prompts (`attribute_to_spec_off`)."""

    endpoint: Endpoint
    reference: CausalLM
    prompts: list[list[int]]
    m: int = 16
    margin: float = NEAR_TIE_MARGIN
    detokenize: Callable[[Sequence[int]], str] | None = None
    context_length: int | None = None
    seed: int = 0
    nonce: int | None = None

    def __post_init__(self) -> None:
        if self.nonce is None:
            self.nonce = time.time_ns() % (1 << 32)


class _Probe:
    def __init__(self, ctx: ProbeContext, name: str) -> None:
        self.ctx, self.name, self.requests, self.numerics = ctx, name, 0, 0

    def ask(self, prompt, m=None, temperature=0.0, controls=(), logprobs=None, seed=None):
        self.requests += 1
        return self.ctx.endpoint.complete(list(prompt), m or self.ctx.m, temperature, 0, 1.0, seed,
                                          tuple(controls), logprobs)

    def argmax_path(self, prompt, ids, controls=()) -> str | None:
        """None when every token is the reference's argmax (or a near-tie), else the first bug."""
        if not ids:
            return "the server returned no tokens"
        cfg = SamplingConfig(temperature=0.0, **{k: (v if k != "logit_bias" else dict(v)) for k, v in controls})
        s = score_completion(self.ctx.reference, prompt, ids, cfg, margin=self.ctx.margin)
        for t in np.flatnonzero(~s.top1):
            if s.margin[t] <= self.ctx.margin:
                self.numerics += 1
                continue
            return (f"position {t + 1}: token {int(s.tokens[t])}, reference argmax {int(s.argmax[t])} "
                    f"(margin {s.margin[t]:.3g} > {self.ctx.margin:g})")
        return None

    def differs(self, prompt, a, b) -> bool:
        """Whether greedy outputs a and b of one prompt differ beyond a near-tie: at their first
        differing position (shared prefix) the reference's logit gap between the two tokens
        must exceed the numerics floor (else counted as numerics: a batch of another shape
        may flip a near-tie on batch-variant kernels)."""
        if a == b:
            return False
        if isinstance(a, str) or isinstance(b, str):
            return True                  # an error message instead of tokens
        t = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
        if t is None:
            return True                  # one is a prefix of the other
        cfg = SamplingConfig(temperature=0.0)
        sa = score_completion(self.ctx.reference, prompt, a[:t + 1], cfg, margin=self.ctx.margin)
        sb = score_completion(self.ctx.reference, prompt, b[:t + 1], cfg, margin=self.ctx.margin)
        if abs(float(sa.margin[t]) - float(sb.margin[t])) <= self.ctx.margin:
            self.numerics += 1
            return False
        return True

    def result(self, problems: list[str], ok: str) -> ProbeResult:
        return ProbeResult(self.name, "FAIL" if problems else "pass", "; ".join(problems) if problems else ok,
                           self.requests, self.numerics)


def _fresh(ctx: ProbeContext, base: Sequence[int], salt: int) -> list[int]:
    """`base` plus a suffix of its own tokens in an order unlikely to be cached."""
    rng = np.random.default_rng([ctx.seed, salt, ctx.nonce])
    return list(base) + [int(t) for t in rng.choice(np.asarray(base), size=min(6, len(base)))]


def _tokens(ctx: ProbeContext, prompt: Sequence[int], m: int) -> int:
    """m, or fewer where the context length is known and prompt + m would not fit."""
    return max(1, min(m, ctx.context_length - len(prompt))) if ctx.context_length else m


def _cold_warm(ctx: ProbeContext) -> ProbeResult:
    pr = _Probe(ctx, "cold-warm")
    prompt = _fresh(ctx, ctx.prompts[0], 1)
    cold, warm = pr.ask(prompt).token_ids, pr.ask(prompt).token_ids
    problems = [f"{w}: {b}" for w, ids in (("cold", cold), ("warm", warm))
                if (b := pr.argmax_path(prompt, ids))]
    if cold != warm:
        problems.append(f"warm output differs from cold at position "
                        f"{next(i for i, (a, b) in enumerate(zip(cold + [-1], warm + [-2])) if a != b) + 1}")
    return pr.result(problems, "cold and warm equal, argmax path")


def _shared_prefix(ctx: ProbeContext) -> ProbeResult:
    pr = _Probe(ctx, "shared-prefix")
    base = _fresh(ctx, ctx.prompts[0], 2)
    a, b = base + [base[0]], base + [base[-1]]
    first, other, again = pr.ask(a).token_ids, pr.ask(b).token_ids, pr.ask(a).token_ids
    problems = [f"{w}: {x}" for w, p, ids in (("P+a", a, first), ("P+b", b, other), ("P+a again", a, again))
                if (x := pr.argmax_path(p, ids))]
    if first != again:
        problems.append("P+a differs after P+b shared its prefix")
    return pr.result(problems, "3 requests sharing a prefix, argmax paths")


def _concurrency(ctx: ProbeContext) -> ProbeResult:
    pr = _Probe(ctx, "concurrency")
    prompts = [_fresh(ctx, ctx.prompts[i % len(ctx.prompts)], 10 + i) for i in range(4)]
    solo = [pr.ask(p, m=2 * ctx.m).token_ids for p in prompts]
    together: list = [None] * 4

    def go(i: int) -> None:
        time.sleep(0.01 * i)            # staggered arrivals
        try:
            together[i] = pr.ask(prompts[i], m=2 * ctx.m).token_ids
        except EndpointError as e:
            together[i] = str(e)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    problems = [f"request {i + 1} under concurrency differs from its solo run (beyond a near-tie)"
                for i in range(4) if pr.differs(prompts[i], together[i], solo[i])]
    problems += [f"solo {i + 1}: {x}" for i in range(4) if (x := pr.argmax_path(prompts[i], solo[i]))]
    return pr.result(problems, "4 staggered concurrent requests equal their solo runs")


def _context_limit(ctx: ProbeContext) -> ProbeResult:
    pr = _Probe(ctx, "context-limit")
    limit = ctx.context_length
    if limit is None:
        try:
            data = ctx.endpoint._json(ctx.endpoint._request("GET", ctx.endpoint.v1 + "/models"), "models")
            limit = next((int(d["max_model_len"]) for d in data.get("data", [])
                          if d.get("id") == ctx.endpoint.model and d.get("max_model_len")), None)
        except (EndpointError, ValueError, TypeError):
            limit = None
    if not limit:
        return ProbeResult("context-limit", "skipped", "context length unknown (pass --context-length)")
    base = ctx.prompts[0]
    prompt = (list(base) * (limit // len(base) + 1))[:limit - ctx.m]
    try:
        ids = pr.ask(prompt).token_ids
    except EndpointError as e:
        return pr.result([f"a request of exactly the context length ({limit}) was refused: {e}"], "")
    bug = pr.argmax_path(prompt, ids)
    return pr.result([bug] if bug else [], f"prompt {len(prompt)} + {ctx.m} = {limit} tokens, argmax path")


def _stream(ctx: ProbeContext) -> ProbeResult:
    pr = _Probe(ctx, "stream")
    prompt = _fresh(ctx, ctx.prompts[0], 3)
    m = _tokens(ctx, prompt, max(ctx.m, STREAM_TOKENS))
    plain = pr.ask(prompt, m)
    ep = ctx.endpoint
    body = ep._body(prompt, m, 0.0, 0, 1.0, None)
    body["stream"] = True
    text, ids, several = [], [], 0
    pr.requests += 1
    with ep.http.stream("POST", ep.v1 + "/completions", json=body) as r:
        if r.status_code != 200:
            return ProbeResult("stream", "skipped", f"streaming refused: HTTP {r.status_code}", pr.requests)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            text.append(choice.get("text") or "")
            ids += choice.get("token_ids") or []
            several += len(choice.get("token_ids") or []) > 1
    streamed = "".join(text)
    problems = []
    if streamed != plain.text:
        problems.append(f"streamed text {streamed!r} ≠ non-streamed {plain.text!r}")
    if ids and ids != plain.token_ids:
        problems.append("streamed token ids differ from non-streamed")
    if ctx.detokenize is not None and ctx.detokenize(plain.token_ids) != plain.text:
        problems.append("text ≠ detokenised ids")
    return pr.result(problems, "streamed = non-streamed" + (" = detokenised ids" if ctx.detokenize else "")
                     + (f", {several} of {len(text)} chunks carried several token ids" if ids else ""))


def _refused(e: EndpointError) -> bool:
    """A 400 answer: the server declines the request's fields (e.g. vLLM: "logit_bias ... not
    yet supported with speculative decoding"), which is a refusal, not a wrong output."""
    return "HTTP 400" in str(e)


def _controls(ctx: ProbeContext) -> ProbeResult:
    """Penalties and a logit bias; a server that refuses the logit bias with a 400 is
    probed with the penalties alone (said in the detail); refusing those too: skipped."""
    pr = _Probe(ctx, "controls")
    problems, refusal = [], None
    for j, base in enumerate(ctx.prompts[:2]):
        prompt = _fresh(ctx, base, 4 + j)
        controls = CONTROLS if refusal else CONTROLS + (("logit_bias", ((int(prompt[-1]), 2.0),)),)
        while True:
            try:
                ids = pr.ask(prompt, m=_tokens(ctx, prompt, max(2 * ctx.m, CONTROLS_TOKENS)),
                             controls=controls).token_ids
                break
            except EndpointError as e:
                if not _refused(e):
                    raise
                if controls == CONTROLS:
                    return ProbeResult("controls", "skipped", f"the server refuses penalties: {e}", pr.requests)
                refusal, controls = str(e), CONTROLS
        if bug := pr.argmax_path(prompt, ids, controls):
            problems.append(f"prompt {j + 1}: {bug}")
    if refusal is None:
        return pr.result(problems, "penalties + logit bias: argmax path of the controlled p")
    return pr.result(problems, f"penalties: argmax path of the controlled p (logit bias refused: {refusal})")


def _logprobs(ctx: ProbeContext, tol: float = 0.05) -> ProbeResult:
    pr = _Probe(ctx, "logprobs")
    worst, seen = 0.0, 0
    problems = []
    for i in range(4):
        prompt = ctx.prompts[i % len(ctx.prompts)]
        s = pr.ask(prompt, m=ctx.m, temperature=1.0, logprobs=1, seed=ctx.seed + 7_000_000 + i)
        if not s.logprobs:
            return ProbeResult("logprobs", "skipped", "the server returns no logprobs", pr.requests)
        ref = score_completion(ctx.reference, prompt, s.token_ids, SamplingConfig(temperature=1.0))
        diff = np.abs(np.asarray(s.logprobs[:ref.m]) - ref.logp[:len(s.logprobs)])
        seen += len(diff)
        if len(diff) and float(np.nanmax(diff)) > worst:
            worst = float(np.nanmax(diff))
            t = int(np.nanargmax(diff))
            if worst > tol:
                problems = [f"position {t + 1}: logprob {s.logprobs[t]:.3f}, reference {ref.logp[t]:.3f} "
                            f"(|Δ| {worst:.3f} > {tol})"]
    return pr.result(problems, f"{seen} logprobs within {tol} of the reference (max |Δ| {worst:.2g})")


_RUN = {"cold-warm": _cold_warm, "shared-prefix": _shared_prefix, "concurrency": _concurrency,
        "context-limit": _context_limit, "stream": _stream, "controls": _controls, "logprobs": _logprobs}


def run_probes(ctx: ProbeContext, names: Sequence[str] = PROBES) -> list[ProbeResult]:
    """Run the named probes in order (module doc); an `EndpointError` in one probe makes
    that probe FAIL with the message (the others still run).

    Raises:
        ValueError: naming an unknown probe.
    """
    unknown = [n for n in names if n not in _RUN]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}")
    out = []
    for n in names:
        try:
            out.append(_RUN[n](ctx))
        except EndpointError as e:
            out.append(ProbeResult(n, "FAIL", f"the server failed the probe's request: {e}"))
    return out


def attribute_to_spec_off(audited: list[ProbeResult], ctx_off: ProbeContext) -> list[ProbeResult]:
    """With a spec-off reference endpoint the question is whether *speculation* changes
    the output: each probe the audited server FAILs is run on the spec-off server too, and
    one that fails there as well (llama-server's batch-variant kernels under concurrency,
    its own penalty semantics) is a property of the server, not of its speculation. It is
    reported as "spec-off too" with both details and does not decide; a probe that fails
    only with speculation on stays FAIL. The spec-off run asks the very same prompts
    (`ctx_off` carries the audited run's nonce): a probe FAIL on one fresh prompt, at a
    near-tie of the server's kernels, must not be blamed on speculation because the spec-off
    server was asked another prompt.

    Args:
        audited: the audited server's probe results (`run_probes`).
        ctx_off: the same probe context with the spec-off endpoint (and the same nonce).

    Returns:
        The results, FAILs shared with the spec-off server re-labelled.
    """
    failed = [r.name for r in audited if r.status == "FAIL"]
    if not failed:
        return audited
    off = {r.name: r for r in run_probes(ctx_off, failed)}
    out = []
    for r in audited:
        o = off.get(r.name)
        if r.status == "FAIL" and o is not None and o.status == "FAIL":
            r = ProbeResult(r.name, "spec-off too", f"{r.detail}; spec-off: {o.detail}",
                            r.requests + o.requests, r.numerics + o.numerics)
        out.append(r)
    return out
