"""The batched server's plumbing on a toy multi-sequence model (no llama.cpp, fast).

`ToyBatchModel` is a `LlamaCppBatchModel` whose forward is a fixed function of each slot's
own prefix (`test_serve_toys.toy_logits`), so whatever shares a round, a slot's logits are
its solo logits by construction: what is tested here is the engine - join and leave at round
boundaries, per-request seeds, budgets, stop ids, n > 1, slot reuse, the queue - not
llama.cpp's arithmetic (tests/test_serve_batched.py does that on SmolLM2).
"""

from __future__ import annotations

import json
import threading

import httpx
import torch
from test_serve_toys import CONTEXT, V, toy_logits, wait_for

from verispec.api import SpeculativeDecoder
from verispec.models.llamacpp_batch import LlamaCppBatchModel
from verispec.models.toy import FunctionModel
from verispec.serve import BackgroundServer, create_app
from verispec.serve.batched import BatchModels

WAIT = 120      # a hang guard, not a timing assertion


class ToyBatchModel(LlamaCppBatchModel):
    """`n_seq_max` toy sequences; each row's logits are toy_logits(its slot's prefix)."""

    def __init__(self, n_seq_max: int) -> None:   # noqa: D107 - no llama.cpp handles
        self.vocab_size, self.context_length, self.n_seq_max = V, CONTEXT, n_seq_max
        self.batch_invariant, self.max_rows, self.tokenizer, self.name = True, 7, None, "toy-batch"
        self.eos_token_ids = frozenset()
        self._views, self._cache, self.decodes = {}, {}, 0
        self.lock = threading.RLock()
        self.rounds: list[set[int]] = []        # the slots of each forward

    def _open(self, slot, view_type):
        free = self.free_slots
        slot = free[0] if slot is None else slot
        self._cache[slot] = []
        view = self._views[slot] = view_type(self, slot)
        return view

    def close(self, view) -> None:
        with self.lock:
            if self._views.get(view.slot) is view:
                del self._views[view.slot]
        view.closed = True
        view.tokens.clear()

    def _seq_rm(self, slot: int, length: int) -> None:
        del self._cache[slot][length:]

    def _decode_locked(self, plan):
        self.rounds.append(set(plan))
        out = {}
        for slot, (tokens, keep, *offset) in plan.items():
            cache = self._cache[slot]
            del cache[len(self._views[slot].tokens) + (offset[0] if offset else 0):]
            rows = []
            for t in tokens:
                cache.append(int(t))
                rows.append(toy_logits(tuple(cache)))
            out[slot] = torch.stack(rows[len(rows) - keep:]) if keep else torch.zeros(0, V, dtype=torch.float64)
        return out


def test_concurrent_toy_requests_equal_generate_and_reuse_slots():
    decoder = SpeculativeDecoder(FunctionModel(toy_logits, V, context_length=CONTEXT, name="toy"), None,
                                 drafter="auto")
    model = ToyBatchModel(3)
    app = create_app(decoder, batch=BatchModels(model), max_queue=16)
    specs = [dict(prompt=[1, 2, 3], max_tokens=20, temperature=0.0, k=3),
             dict(prompt=[4, 5], max_tokens=4, temperature=0.9, seed=7, k=2, drafter="lookup"),
             dict(prompt=[6, 7, 8, 9], max_tokens=16, temperature=1.0, seed=3, k="auto", n=2),
             dict(prompt=[2, 2, 2], max_tokens=24, temperature=0.0, k=0, stop_token_ids=[5]),
             dict(prompt=[9, 1], max_tokens=12, temperature=0.7, seed=11, k=1, top_p=0.8),
             dict(prompt=[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7], max_tokens=8, temperature=0.0, k=4)]

    def solo(spec):
        out = []
        for i in range(spec.get("n", 1)):
            seed = spec.get("seed")
            r = decoder.generate(spec["prompt"], max_new_tokens=spec["max_tokens"], temperature=spec["temperature"],
                                 top_p=spec.get("top_p", 1.0), seed=None if seed is None else seed + i,
                                 k=spec["k"], drafter=spec.get("drafter"), stop_token_ids=spec.get("stop_token_ids"))
            out.append((r.token_ids, r.finish_reason))
        return out

    want = [solo(s) for s in specs]
    got: list = [None] * len(specs)
    with BackgroundServer(app) as url:
        def client(i):
            with httpx.Client(base_url=url, timeout=WAIT) as http:
                resp = http.post("/v1/completions", json={**specs[i], "return_token_ids": True})
                assert resp.status_code == 200, resp.text
                choices = sorted(resp.json()["choices"], key=lambda c: c["index"])
                got[i] = [(c["token_ids"], c["finish_reason"]) for c in choices]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(specs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        engine = app.state.verispec.engine
        history = list(engine.history)
        with httpx.Client(base_url=url, timeout=WAIT) as http:       # echo + logprobs: not in batched mode
            resp = http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "echo": True, "logprobs": 1})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "echo"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"request {i} ({specs[i]}) left its solo run"
    assert want[3][0][1] == "stop" or len(want[3][0][0]) == 24
    assert len(history) == 7 and {h["slot"] for h in history} == {0, 1, 2}    # 7 jobs on 3 slots
    assert max(len(r) for r in model.rounds) == 3                           # three shared a forward
    assert all(not v for v in [engine.running, model._views])


def test_toy_slot_freed_early_goes_to_a_newcomer_and_a_disconnect_frees_its_slot():
    """A long stream holds slot 0; a short request in slot 1 ends, a newcomer takes slot 1
    (not arrival order) and equals its solo run; the long stream's client then leaves and
    its request ends after a round, its tokens so far its solo run's first tokens."""
    long_ctx = 4096
    decoder = SpeculativeDecoder(FunctionModel(toy_logits, V, context_length=long_ctx, name="toy"), None,
                                 drafter="auto")
    model = ToyBatchModel(2)
    model.context_length = long_ctx
    app = create_app(decoder, batch=BatchModels(model))
    long = dict(prompt=[1, 2], max_tokens=4000, temperature=0.8, seed=1, k=2, stream=True)
    short = dict(prompt=[5, 6, 7], max_tokens=5, temperature=0.9, seed=2, k=3)
    newcomer = dict(prompt=[8], max_tokens=6, temperature=1.0, seed=3, k="auto")
    want = {name: decoder.generate(s["prompt"], max_new_tokens=s["max_tokens"], temperature=s["temperature"],
                                   seed=s["seed"], k=s["k"]).token_ids
            for name, s in (("long", long), ("short", short), ("newcomer", newcomer))}
    engine = app.state.verispec.engine
    with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=WAIT) as http:
        streamed = []
        with httpx.Client(base_url=url, timeout=WAIT) as stream_http:
            with stream_http.stream("POST", "/v1/completions", json={**long, "return_token_ids": True}) as resp:
                lines = resp.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        streamed += json.loads(line[6:])["choices"][0].get("token_ids") or []
                        if streamed:
                            break
                got = {}
                for name, spec in (("short", short), ("newcomer", newcomer)):
                    r = http.post("/v1/completions", json={**spec, "return_token_ids": True})
                    assert r.status_code == 200, r.text
                    got[name] = r.json()["choices"][0]["token_ids"]
                for line in lines:                       # a few more chunks, then leave
                    if line.startswith("data: {"):
                        streamed += json.loads(line[6:])["choices"][0].get("token_ids") or []
                        if len(streamed) > 20:
                            break
        wait_for(lambda: len(engine.history) == 3, WAIT, "the abandoned stream to end")
    assert got == {"short": want["short"], "newcomer": want["newcomer"]}
    assert streamed == want["long"][:len(streamed)]
    order = [(h["slot"], h["finish_reason"]) for h in engine.history]
    assert order == [(1, "length"), (1, "length"), (0, "abort")], order
    assert engine.history[2]["tokens"] < 4000


def test_a_request_stopped_while_its_prompt_runs_in_pieces_ends_before_its_prefill_does():
    """The stop flag (a client gone, a deadline passed) is read between prompt pieces too:
    the request ends without prefilling the rest, the other request decodes on, exact."""
    from verispec.batching import BatchedRounds, Cancelled
    from verispec.decoding import decode
    from verispec.policy import make_policy
    from verispec.sampling import SamplingConfig, SeededRandomness

    model = ToyBatchModel(2)
    model.context_length = 4096
    driver = BatchedRounds(model, prefill_chunk=8, max_batched_rows=8)
    greedy = SamplingConfig(temperature=0.0)
    stop = threading.Event()
    pieces = []
    decode_locked = model._decode_locked

    def counting(plan):
        for slot, (tokens, keep, *_) in plan.items():
            if slot == 1 and keep == 0:
                pieces.append(len(tokens))
                stop.set()                     # the client leaves after the first piece
        return decode_locked(plan)

    model._decode_locked = counting
    other = driver.submit([1, 2, 3], make_policy(2, {}), sampling=greedy, max_new_tokens=300,
                          rng=SeededRandomness(0))
    long_prompt = [(7 * i) % V for i in range(200)]
    stopped = driver.submit(long_prompt, make_policy(0, {}), sampling=greedy, max_new_tokens=4,
                            rng=SeededRandomness(0), cancel_event=stop)
    try:
        stopped.result(WAIT)
        raise AssertionError("the stopped request finished")
    except Cancelled:
        pass
    solo = FunctionModel(toy_logits, V, context_length=4096)
    assert other.result(WAIT).tokens == decode(solo, [1, 2, 3], make_policy(2, {}), sampling=greedy,
                                               max_new_tokens=300, rng=SeededRandomness(0)).tokens
    driver.close()
    assert pieces and sum(pieces) < 100          # most of its 200-token prompt never ran


def test_every_shared_forward_is_timed_once_with_its_rows_and_prompt_rows():
    """`on_round` hears of every forward (the alone path's too) with the rows the model
    scored, prompt pieces counted apart; the server's batch counters sum those reports."""
    from verispec.batching import BatchedRounds
    from verispec.policy import make_policy
    from verispec.sampling import SamplingConfig, SeededRandomness
    from verispec.serve.metrics import ServerMetrics

    model = ToyBatchModel(2)
    scored, decode_locked = [], model._decode_locked

    def counting(plan):
        scored.append((sum(len(tokens) for tokens, *_ in plan.values()),
                       sum(len(tokens) for tokens, keep, *_ in plan.values() if keep <= 1 and len(tokens) > 7)))
        return decode_locked(plan)

    model._decode_locked = counting
    driver = BatchedRounds(model)
    timings, metrics = [], ServerMetrics("toy")
    driver.on_round = lambda t: (timings.append(t), metrics.record_round(t))
    greedy = SamplingConfig(temperature=0.0)
    alone = driver.submit([1, 2, 3], make_policy(2, {}), sampling=greedy, max_new_tokens=5,
                          rng=SeededRandomness(0))
    alone.result(WAIT)                          # alone: runs its own forwards
    with driver._cond:       # both admitted before either parks: they share forwards
        handles = [driver.submit(prompt, make_policy(k, {}), sampling=greedy, max_new_tokens=12,
                                 rng=SeededRandomness(0)) for prompt, k in
                   (([(3 * i) % V for i in range(1, 30)], 0), ([5, 6], 3))]
    for h in handles:
        h.result(WAIT)
    driver.close()
    assert len(timings) == driver.forwards == len(scored)
    assert [(t.rows, t.prefill_rows) for t in timings] == scored
    assert sum(t.prefill_rows for t in timings) == 28   # the 29-token prompt but its last token
    assert max(t.sequences for t in timings) == 2
    assert all(t.forward >= 0 and t.gather >= 0 for t in timings)
    text = metrics.exposition().decode()
    assert f'verispec:batch_forwards_total{{model_name="toy"}} {float(len(timings))}' in text
    assert f'verispec:batch_rows_total{{model_name="toy"}} {float(sum(t.rows for t in timings))}' in text


class _SlowDrafter:
    """Drafts k copies of token 0 in `delay` seconds (a stand-in for a draft model's forwards)."""

    name, point_mass, alpha_prior = "slow", True, 0.5
    forwards, seconds, catchup_seconds = 0, 0.0, 0.0

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def available(self, context):
        return 1 << 20

    def propose(self, context, k, sample):
        import time

        time.sleep(self.delay)
        self.forwards, self.seconds = self.forwards + 1, self.seconds + self.delay
        return [0] * k, None

    def rollback(self, committed):
        pass

    def reset(self):
        pass


def test_a_rounds_target_time_is_its_shared_forward_not_the_wait_for_the_others_drafts():
    """In a shared forward a plain request waits while another request drafts; that wait is
    the other's cost (its policy prices B·k·T_d), so it goes to `waited_seconds`, not to
    the plain request's T_t (it made a plain step look dear, and drafting cheap, until both
    requests drafted: `benchmarks/serve/README.md`)."""
    from verispec.batching import BatchedRounds
    from verispec.decoding import decode
    from verispec.policy import FixedPolicy, make_policy
    from verispec.sampling import SamplingConfig, SeededRandomness

    model, delay = ToyBatchModel(2), 0.05
    driver = BatchedRounds(model)
    greedy = SamplingConfig(temperature=0.0)
    plain_rounds = []
    with driver._cond:       # both admitted before either parks: they share forwards
        drafting = driver.submit([1, 2, 3], FixedPolicy(_SlowDrafter(delay), 2), sampling=greedy,
                                 max_new_tokens=60, rng=SeededRandomness(0))
        plain = driver.submit([4, 5], make_policy(0, {}), sampling=greedy, max_new_tokens=12,
                              rng=SeededRandomness(0), observer=plain_rounds.append)
    solo = FunctionModel(toy_logits, V, context_length=CONTEXT)
    assert plain.result(WAIT).tokens == decode(solo, [4, 5], make_policy(0, {}), sampling=greedy,
                                               max_new_tokens=12, rng=SeededRandomness(0)).tokens
    drafting.result(WAIT)
    driver.close()
    waited = sum(r.waited_seconds for r in plain_rounds)
    forward = sum(r.target_seconds for r in plain_rounds)
    # most of the plain request's rounds wait out the other's `delay`-second draft; a toy
    # forward is far shorter (a margin of ~10x, not a speed measurement)
    assert waited >= 0.3 * delay * len(plain_rounds)
    assert forward < waited / 3
