"""The bug zoo: a toy speculative server over real HTTP, exact or with one public bug.

Each entry of `FAULTS` is a class of lossless-breaking bug that servers shipped (the
endpoint-audit issue lists the threads); `zoo_app(fault)` serves a float64 toy
target (V = 16, a fixed random function of the last two tokens) with a noisy
draft (`k` drafts per round) behind ``/v1/models`` and ``/v1/completions``
(token ids, seeds, logprobs, SSE streaming, the sampling controls), so the
endpoint audit (`verispec.audit.tokens`, `verispec.audit.probes`) is tested on the
same wire a real server speaks. Randomness is `SeededRandomness(seed)`, keyed by
output position; the warps and controls are `verispec.sampling.warp` (history =
prompt + output + drafts so far, as `verispec.controls` requires).

The exact engine is the standard rule (Leviathan et al. 2023, Algorithm 1): accept
draft x_i with probability min(1, p_i(x_i)/q_i(x_i)); on the first rejection emit a
token of the residual norm(max(0, p_i − q_i)); after k acceptances a bonus token
from p_{k+1}. The two exact *variants* that look like bugs but are not:
"exact-sample-match" (draw y_i ~ p_i, accept x_i iff x_i = y_i, else emit y_i: the
output is y, a draw of p) and "exact-point-mass" (a greedy draft, q a point mass:
accept with probability p(x), the residual is p without x, renormalised).

Tokens print as the 16 characters of `ALPHABET` (some of them 2 or 3 UTF-8 bytes), so
streamed text can lose bytes. The prompt is a list of ids (or text in `ALPHABET`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..sampling import SamplingConfig, SeededRandomness, warp

__all__ = ["ALPHABET", "EXACT", "FAULTS", "V", "detokenize", "zoo_app", "zoo_logits", "zoo_reference"]

V = 16
ALPHABET = "abcdefghéßλπж中文ü"
CONTEXT = 256

#: fault -> what the server does wrong (the public bug class it stands for)
FAULTS = {
    "residual-is-p": "a rejected draft is replaced by a draw of p instead of the residual",
    "bonus-from-q": "the bonus token after k acceptances is drawn from the draft's q",
    "warp-mismatch": "the verifier's p ignores the request's temperature (the draft's does not)",
    "penalties-skipped": "penalties at draft positions ignore the drafts before them",
    "no-rollback": "the target's cache keeps rejected drafts (not rolled back)",
    "prefix-poison": "the prefix cache stores rows computed after a rejected draft",
    "slot-order": "a request's logits depend on its batch slot under concurrency",
    "argmax-spec": "the speculative path takes argmax instead of sampling",
    "logprob-zero": "drafted tokens are reported with logprob 0",
    "stream-drops-bytes": "streamed chunks of several tokens lose their last byte",
    "naive-agree": "accept a draft iff it equals the target's argmax",
}
#: exact servers, including the two variants that are not bugs
EXACT = ("exact", "exact-sample-match", "exact-point-mass")


def zoo_logits(prefix: Sequence[int], salt: int = 0) -> torch.Tensor:
    """[V] float64 target logits: a fixed random function of the last two tokens (and `salt`)."""
    key = (int(prefix[-1]) * 31 + (int(prefix[-2]) if len(prefix) > 1 else 0) * 7 + 101 * salt) % 10007
    return torch.randn(V, generator=torch.Generator().manual_seed(key), dtype=torch.float64) * 2.0


def _draft_logits(prefix: Sequence[int]) -> torch.Tensor:
    """A draft as drafts are: correlated with the target, less sure of itself (half the
    target's logits plus independent noise of the same scale)."""
    return 0.5 * zoo_logits(prefix) + 0.5 * zoo_logits(prefix, salt=7)


def zoo_reference():
    """The zoo's target as a local `CausalLM` (the exact reference of an audit)."""
    from ..models.toy import FunctionModel
    return FunctionModel(lambda prefix: zoo_logits(prefix), V, context_length=CONTEXT, name="zoo")


def detokenize(ids: Sequence[int]) -> str:
    return "".join(ALPHABET[int(t)] for t in ids)


class _Engine:
    """One toy speculative server's state (the prefix cache, the requests in flight)."""

    def __init__(self, fault: str, k: int, delay: float) -> None:
        self.fault, self.k, self.delay = fault, k, delay
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.lock = threading.Lock()
        self.in_flight = 0

    def _logits(self, view: list[int], slot: int) -> torch.Tensor:
        logits = self.cache.get(tuple(view)) if self.fault == "prefix-poison" else None
        return zoo_logits(view, salt=1 if self.fault == "slot-order" and slot > 0 else 0) \
            if logits is None else logits

    def _ps(self, view: list[int], ctx: list[int], drafts: list[int], cfg: SamplingConfig, n_prompt: int,
            slot: int) -> list[torch.Tensor]:
        """p_1..p_{k+1}: one verification forward over the drafts (rows warped with the
        history of their own position, or, penalties-skipped, all with the committed one)."""
        rows = torch.stack([self._logits(view + drafts[:i], slot) for i in range(len(drafts) + 1)])
        if self.fault == "warp-mismatch" and cfg.temperature > 0:
            cfg = SamplingConfig(**{**cfg.__dict__, "temperature": 1.0})
        if self.fault == "penalties-skipped":
            return [warp(r[None], cfg, history=ctx, n_prompt=n_prompt)[0].double() for r in rows]
        return list(warp(rows, cfg, history=ctx, n_prompt=n_prompt, drafts=drafts).double())

    def _q(self, ctx: list[int], cfg: SamplingConfig, n_prompt: int, history: list[int]) -> torch.Tensor:
        logits = _draft_logits(ctx)
        if self.fault == "exact-point-mass":
            cfg = SamplingConfig(**{**cfg.__dict__, "temperature": 0.0})
        return warp(logits[None], cfg, history=history, n_prompt=n_prompt)[0].double()

    def generate(self, prompt: list[int], m: int, cfg: SamplingConfig, seed: int | None,
                 slot: int) -> tuple[list[int], list[float], list[int]]:
        """(tokens, their reported logprobs, tokens committed per round)."""
        rng = SeededRandomness(seed)
        n0, out, logprobs, rounds = len(prompt), [], [], []
        view = list(prompt)              # what the target's cache holds (no-rollback keeps drafts)
        poison: dict = {}
        draw = (lambda d, pos, s: int(d.argmax())) if self.fault == "argmax-spec" and not cfg.greedy \
            else rng.categorical
        while len(out) < m:
            pos, ctx, drafts, qs = len(out), prompt + out, [], []
            for i in range(self.k):
                hist = ctx + (drafts if self.fault != "penalties-skipped" else [])
                q = self._q(ctx + drafts, cfg, n0, hist)
                drafts.append(rng.categorical(q, pos + i, "draft"))
                qs.append(q)
            ps = self._ps(view, ctx, drafts, cfg, n0, slot)
            u = rng.uniform(self.k, pos)
            new, lp = [], []
            for i, x in enumerate(drafts):
                p, q = ps[i], qs[i]
                if self.fault == "exact-sample-match":
                    y = rng.categorical(p, pos + i, "sample")
                    ok, nxt = y == x, y
                elif self.fault == "naive-agree":
                    ok = x == int(p.argmax())
                    nxt = None if ok else rng.categorical(p, pos + i, "sample")
                else:
                    ok = float(u[i]) * float(q[x]) < float(p[x])
                    nxt = None
                    if not ok:
                        res = p if self.fault == "residual-is-p" else (p - q).clamp_min(0)
                        if float(res.sum()) <= 0:
                            res = p
                        nxt = draw(res / res.sum(), pos + i, "sample")
                if ok:
                    new.append(x)
                    lp.append(0.0 if self.fault == "logprob-zero" else _log(p[x]))
                    continue
                new.append(nxt)
                lp.append(_log(p[nxt]))
                if self.fault == "prefix-poison" and i + 1 < len(ps):
                    poison[tuple(view + drafts[:i] + [nxt])] = zoo_logits(view + drafts[:i + 1])
                break
            else:
                bonus = ps[self.k]
                if self.fault == "bonus-from-q":
                    hist = ctx + drafts
                    bonus = self._q(ctx + drafts, cfg, n0, hist)
                nxt = draw(bonus, pos + self.k, "sample")
                new.append(nxt)
                lp.append(_log(ps[self.k][nxt]))
            rejected = len(new) <= self.k
            # no-rollback: the cache keeps every drafted row, the correction lands after them
            view = view + (drafts + [new[-1]] if self.fault == "no-rollback" and rejected else new)
            take = new[:m - len(out)]
            out += take
            logprobs += lp[:len(take)]
            rounds.append(len(take))
            if self.delay:
                time.sleep(self.delay)
        if poison:
            with self.lock:
                self.cache.update(poison)
        return out, logprobs, rounds


def _log(x) -> float:
    x = float(x)
    return float(np.log(x)) if x > 0 else -1e9


def _error(status: int, message: str, param: str | None = None):
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": None}}, status_code=status)


def zoo_app(fault: str = "exact", *, k: int = 3, delay: float = 0.002, context_length: int = CONTEXT):
    """A FastAPI app serving the zoo's toy model with `fault` (a key of `FAULTS`, or one of `EXACT`).

    Args:
        fault: which bug (module doc).
        k: drafts per round.
        delay: seconds slept per round (requests overlap under concurrency, as on a real server).
        context_length: prompt + max_tokens limit (a 400 beyond it), listed as ``max_model_len``.

    Raises:
        ValueError: naming `fault` when unknown.
    """
    if fault not in FAULTS and fault not in EXACT:
        raise ValueError(f"fault must be one of {', '.join((*EXACT, *FAULTS))}, got {fault!r}")
    engine = _Engine(fault, k, delay)
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "zoo", "object": "model", "max_model_len": context_length}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = [ALPHABET.index(c) for c in prompt if c in ALPHABET]
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) and 0 <= t < V for t in prompt):
            return _error(400, f"prompt must be token ids in 0..{V - 1} or text in {ALPHABET!r}", "prompt")
        m = int(body.get("max_tokens", 16))
        if len(prompt) + m > context_length:
            return _error(400, f"prompt ({len(prompt)}) + max_tokens ({m}) exceeds the context length "
                               f"{context_length}", "max_tokens")
        try:
            cfg = SamplingConfig(temperature=float(body.get("temperature", 1.0)), top_k=int(body.get("top_k", 0) or 0),
                                 top_p=float(body.get("top_p", 1.0)), min_p=float(body.get("min_p", 0.0)),
                                 repetition_penalty=float(body.get("repetition_penalty", 1.0)),
                                 presence_penalty=float(body.get("presence_penalty", 0.0)),
                                 frequency_penalty=float(body.get("frequency_penalty", 0.0)),
                                 logit_bias=body.get("logit_bias") or {})
        except ValueError as e:
            return _error(400, str(e))
        seed = body.get("seed")
        import anyio

        def run():
            with engine.lock:
                slot = engine.in_flight
                engine.in_flight += 1
            try:
                return engine.generate(prompt, m, cfg, seed, slot)
            finally:
                with engine.lock:
                    engine.in_flight -= 1

        tokens, logprobs, rounds = await anyio.to_thread.run_sync(run)
        lp = {"tokens": [ALPHABET[t] for t in tokens], "token_logprobs": logprobs} if body.get("logprobs") else None
        if body.get("stream"):
            def events():
                i = 0
                for n in rounds:
                    chunk = tokens[i:i + n]
                    text = detokenize(chunk)
                    if fault == "stream-drops-bytes" and n > 1:
                        text = text.encode()[:-1].decode(errors="ignore")
                    yield "data: " + json.dumps({"choices": [{"index": 0, "text": text, "token_ids": chunk,
                                                              "finish_reason": None}]}) + "\n\n"
                    i += n
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}) + "\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return {"object": "text_completion", "model": "zoo",
                "choices": [{"index": 0, "text": detokenize(tokens), "token_ids": tokens,
                             "finish_reason": "length", "logprobs": lp}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)}}

    return app
