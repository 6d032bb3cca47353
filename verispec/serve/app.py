"""The FastAPI application: OpenAI-compatible routes over one `SpeculativeDecoder`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
(and ``GET /v1/models/{id}``),
``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes: exact token ids for clients
and audits) and ``GET /tokenizer_info`` (what lm-eval's remote tokenizer reads), all
behind ``Authorization: Bearer KEY`` when an API key is set; ``GET /health`` (503 while
the models load) and ``GET /metrics`` (Prometheus) are open.

Every POST body passes `guard.Guard` first (size, read time, JSON content type) and
`guard.parse_json`; decoding and tokenizing run in worker threads, never on the event
loop, so a large request cannot stall `/health` or other clients' streams.

    from verispec import SpeculativeDecoder
    from verispec.serve import create_app
    app = create_app(SpeculativeDecoder("smollm2-135m", None, drafter="lookup"))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

A server whose acceptance rule is another one (e.g. the audit's deliberately biased
``verispec.audit.NAIVE_RULES["naive-agree"]``) is ``create_app(decoder, rule=that_rule)``;
any subclass of `SpeculativeDecoder` (one that changes what `generate` does) can be served.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine, Job, Outcome, QueueFull
from .errors import ApiError, bad_request, short
from .guard import Guard, Limits, check_api_key, parse_json
from .metrics import ServerMetrics
from .progress import Chunk
from .responses import DONE, Renderer, sse
from .schema import ServerDefaults, _messages, choice_seeds, parse
from .tokens import Prompter

log = logging.getLogger("verispec.serve")


class ServeState:
    """Everything the routes share; `app.state.verispec`.

    Attributes:
        decoder: the `SpeculativeDecoder`, or None while loading.
        engine: the queue and decode worker (None while loading).
        metrics: the Prometheus metrics (exist from the start).
        prompter, defaults: tokenization and request defaults (None while loading).
        limits: the server's `guard.Limits`.
    """

    def __init__(self, *, model_name: str | None, k, drafter: str | None, rule, api_key: str | None,
                 max_queue: int, prefix_reuse: bool, limits: Limits | None = None,
                 max_batched_rows: int | None = None) -> None:
        self.model_name, self.k, self.drafter, self.rule = model_name, k, drafter, rule
        self.api_key, self.max_queue, self.prefix_reuse = api_key, max_queue, prefix_reuse
        self.max_batched_rows = max_batched_rows
        self.limits = limits or Limits()
        self.metrics = ServerMetrics(model_name or "")
        self.decoder = self.engine = self.prompter = self.defaults = None

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def attach(self, decoder, batch=None) -> None:
        """Serve `decoder` from now on (the CLI loads the models after the server started);
        with `batch` (`batched.BatchModels`), several requests at once (`BatchedEngine`)."""
        target = decoder.target
        name = self.model_name or target.name
        if self.metrics.model_name != name:      # no request was served before: nothing is lost
            self.metrics = ServerMetrics(name)
        self.prompter = Prompter(decoder.tokenizer, target.vocab_size, target.context_length)
        self.defaults = ServerDefaults(
            model_names=(name,), k=self.k, drafter=decoder.drafter,
            drafter_names=decoder.drafter_names, sampling=decoder.sampling_config)
        self.decoder = decoder
        if batch is None:
            self.engine = Engine(decoder, self.metrics, max_queue=self.max_queue,
                                 prefix_reuse=self.prefix_reuse, rule=self.rule)
        else:
            from .batched import BatchedEngine

            self.engine = BatchedEngine(decoder, self.metrics, batch, max_queue=self.max_queue,
                                        rule=self.rule, max_batched_rows=self.max_batched_rows)

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(503, "the model is still loading; retry when GET /health answers 200",
                           code="model_loading")

    def drain(self, grace: float) -> None:
        """Graceful shutdown (from the server, before uvicorn's own): refuse new requests,
        answer the queued ones with a 503, give the one decoding `grace` seconds to finish."""
        if self.engine is not None:
            self.engine.drain(grace)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def create_app(decoder=None, *, model_name: str | None = None, k: int | str = "auto", rule="auto",
               api_key: str | None = None, max_queue: int = 32, prefix_reuse: bool = True,
               limits: Limits | None = None, batch=None, max_batched_rows: int | None = None) -> FastAPI:
    """An OpenAI-compatible FastAPI app serving `decoder` (run it with uvicorn).

    Args:
        decoder: a `SpeculativeDecoder` (or subclass); None starts in the loading state
            (`/health` 503) until ``app.state.verispec.attach(decoder)``.
        model_name: the name clients use as `model` (default: the target's name).
        k: the default draft length ("auto" or an integer >= 0); requests may override.
        rule: the acceptance rule for every request: "auto" (`SpeculativeDecoder.generate`'s
            choice), "standard", "gumbel", or any `verispec.verify.Rule`.
        api_key: when set, every /v1 route, /tokenize, /detokenize and /tokenizer_info need
            ``Authorization: Bearer <api_key>`` (401); printable ASCII, no surrounding space.
        max_queue: requests that may wait while one decodes; more get 429 + Retry-After.
        prefix_reuse: keep the KV caches between requests (False: prefill every prompt
            from scratch; for measurements).
        limits: body size, read time, prompt length and per-request time (`guard.Limits`;
            default its defaults).
        batch: `batched.BatchModels` (`load_batch_models`): decode up to its target's
            `n_seq_max` requests at once on llama.cpp (continuous batching; no prefix
            reuse, no prompt logprobs: see `verispec.serve.batched`); None: one at a time.
        max_batched_rows: with `batch`, the most rows one round's forward carries
            (`verispec.batching.BatchedRounds`); None: no bound.

    Returns:
        The app; `app.state.verispec` is its `ServeState` (engine, metrics).

    Raises:
        ValueError: naming `k`, `max_queue`, `api_key` or `max_batched_rows` when out of range.
    """
    if not (k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 0)):
        raise ValueError(f'k must be "auto" or an integer >= 0, got {k!r}')
    check_api_key(api_key)
    if max_batched_rows is not None and (isinstance(max_batched_rows, bool) or not isinstance(
            max_batched_rows, int) or max_batched_rows < 1):
        raise ValueError(f"max_batched_rows must be an integer >= 1 or None, got {max_batched_rows!r}")
    state = ServeState(model_name=model_name, k=k, drafter=None, rule=rule, api_key=api_key,
                       max_queue=max_queue, prefix_reuse=prefix_reuse, limits=limits,
                       max_batched_rows=max_batched_rows)
    if decoder is not None:
        state.attach(decoder, batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.close)

    app = FastAPI(title="verispec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.verispec = state
    _add_error_handlers(app)
    app.add_middleware(Guard, limits=state.limits)

    async def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "verispec",
                "max_model_len": state.decoder.target.context_length}

    @v1.get("/models")
    async def models() -> dict:
        state.require_ready()
        return {"object": "list", "data": [model_card(name) for name in state.defaults.model_names]}

    @v1.get("/models/{model:path}")
    async def model(model: str) -> dict:
        """One served model (the OpenAI SDK's `models.retrieve`); 404 naming it otherwise."""
        state.require_ready()
        if model not in state.defaults.model_names:
            raise ApiError(404, f"model {short(model)} is not served here; /v1/models lists "
                                f"{', '.join(state.defaults.model_names)}", param="model",
                           code="model_not_found")
        return model_card(model)

    @v1.post("/chat/completions")
    async def chat(request: Request):
        return await _generate("chat", request, state)

    @v1.post("/completions")
    async def completions(request: Request):
        return await _generate("completion", request, state)

    app.include_router(v1)

    @app.get("/health")
    async def health():
        if not state.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize", dependencies=[Depends(check_key)])
    async def tokenize(request: Request) -> dict:
        state.require_ready()
        body = await _json_body(request)
        return await run_in_threadpool(_tokenize, body, state)

    @app.post("/detokenize", dependencies=[Depends(check_key)])
    async def detokenize(request: Request) -> dict:
        state.require_ready()
        body = await _json_body(request)
        return await run_in_threadpool(_detokenize, body, state)

    @app.get("/tokenizer_info", dependencies=[Depends(check_key)])
    async def tokenizer_info() -> dict:
        state.require_ready()
        return _tokenizer_info(state.prompter.tokenizer, state.prompter.context_length)

    return app


def _tokenize(body: dict, state: ServeState) -> dict:
    _only(body, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                 "return_token_strs"})
    _check_model(body.get("model"), state)
    flags = {name: body.get(name, True) for name in ("add_special_tokens", "add_generation_prompt")}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise bad_request(name, f"{name} must be true or false")
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("prompt", "give exactly one of prompt (text) or messages (chat)")
    if "add_generation_prompt" in body and "messages" not in body:
        raise bad_request("add_generation_prompt", "add_generation_prompt applies to messages (chat), "
                                                   "not to a text prompt")
    add_special = flags["add_special_tokens"]
    if "messages" in body:
        ids = state.prompter.chat(_messages(body["messages"]), add_generation_prompt=flags["add_generation_prompt"])
    else:
        if not isinstance(body["prompt"], str):
            raise bad_request("prompt", "prompt must be a string")
        ids = state.prompter.text(body["prompt"], add_special_tokens=add_special)
    out = {"count": len(ids), "max_model_len": state.prompter.context_length, "tokens": ids}
    if body.get("return_token_strs"):
        out["token_strs"] = state.prompter.pieces(ids)
    return out


def _detokenize(body: dict, state: ServeState) -> dict:
    _only(body, {"model", "tokens"})
    _check_model(body.get("model"), state)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise bad_request("tokens", "tokens must be a list of token ids")
    return {"prompt": state.prompter.decode(state.prompter.check_ids(tokens, "tokens"))}


def _tokenizer_info(tokenizer, context_length: int) -> dict:
    """vLLM's `GET /tokenizer_info` fields that clients read (lm-eval's remote tokenizer:
    `eos_token`, `bos_token`, `pad_token`, `chat_template`), as strings or null."""
    if tokenizer is None:
        raise ApiError(404, "this model has no tokenizer; send prompts as token ids", code="no_tokenizer")

    def text(name):
        value = getattr(tokenizer, name, None)
        return None if value is None else str(value)

    return {"tokenizer_class": type(tokenizer).__name__, "eos_token": text("eos_token"),
            "bos_token": text("bos_token"), "pad_token": text("pad_token"),
            "unk_token": text("unk_token"), "chat_template": text("chat_template"),
            "model_max_length": context_length, "vocab_size": len(tokenizer)}


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return ApiError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return bad_request(None, str(exc)).response()

    # no handler for Exception: Starlette's would re-raise after answering, and uvicorn then
    # drops the keep-alive connection; `guard.Guard` answers a real fault and keeps it


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    body = await run_in_threadpool(parse_json, raw)      # a large body must not stall the loop
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _only(body: dict, allowed: set[str]) -> None:
    for name in body:
        if name not in allowed:
            raise bad_request(name, f"unrecognized request field {short(name)}", code="unknown_parameter")


def _check_model(model, state: ServeState) -> None:
    if model is not None and model not in state.defaults.model_names:
        raise ApiError(400, f"model {short(model)} is not served here; /v1/models lists "
                            f"{', '.join(state.defaults.model_names)}", param="model", code="model_not_found")


async def _watch_disconnect(receive, jobs: list[Job]) -> None:
    """Cancel `jobs` when the client disconnects (ASGI ``http.disconnect``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for job in jobs:
                job.cancel()
            return


async def _generate(endpoint: str, request: Request, state: ServeState):
    state.require_ready()
    body = await _json_body(request)
    req = await run_in_threadpool(parse, endpoint, body, state.prompter, state.defaults)
    cap = state.limits.max_prompt_tokens
    if len(req.prompt_ids) > cap:
        where = "messages" if endpoint == "chat" else "prompt"
        raise ApiError(400, f"the prompt has {len(req.prompt_ids)} tokens; this server takes at most "
                            f"{cap} (--max-prompt-tokens)", param=where, code="context_length_exceeded")
    if req.echo and req.logprobs is not None and not state.engine.prompt_logprobs:
        raise bad_request("echo", "echo with logprobs (prompt log-probabilities) is not supported while "
                                  "the server decodes several requests at once (--max-seqs > 1); "
                                  "drop echo or logprobs, or serve with --max-seqs 1")
    # n > 1: one job per choice, choice i with seed + i (`choice_seeds`), all under one id
    jobs = [Job(req if req.n == 1 else replace(req, seed=seed)) for seed in choice_seeds(req.seed, req.n)]
    for job in jobs:
        job.deadline = job.arrival + state.limits.request_timeout
    try:
        state.engine.submit_all(jobs)          # all n choices, or none
    except QueueFull as e:
        raise ApiError(429, f"the server is busy: {e}", code="rate_limit_exceeded",
                       headers={"Retry-After": str(e.retry_after)}) from None
    watcher = asyncio.create_task(_watch_disconnect(request.receive, jobs))
    renders = [Renderer(job, index=i, id=jobs[0].id) for i, job in enumerate(jobs)]
    events, forwarders = _merge(jobs)
    if req.stream:
        return StreamingResponse(_stream(jobs, events, [watcher, *forwarders], renders),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        outcomes: list[Outcome | None] = [None] * len(jobs)
        while None in outcomes:
            i, event = await events.get()
            if isinstance(event, ApiError):
                return event.response()
            if isinstance(event, Outcome):
                if event.finish_reason == "abort":       # stopped by the shutdown
                    return ApiError(503, "the server shut down before this request finished",
                                    code="server_shutting_down").response()
                outcomes[i] = event
        if len(jobs) == 1:
            return JSONResponse(renders[0].response(outcomes[0]))
        return JSONResponse(_choices_response(renders, outcomes))
    finally:
        _stop(jobs, [watcher, *forwarders])


def _merge(jobs: list[Job]) -> tuple[asyncio.Queue, list[asyncio.Task]]:
    """One queue of (choice index, event) fed from every job's events."""
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(i: int, job: Job) -> None:
        while True:
            event = await job.events.get()
            merged.put_nowait((i, event))
            if isinstance(event, (Outcome, ApiError)):
                return

    return merged, [asyncio.create_task(forward(i, job)) for i, job in enumerate(jobs)]


def _stop(jobs: list[Job], tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    for job in jobs:
        if not job.done:
            job.cancel()      # the client went away, or the server is shutting down


def _usage(renders: list[Renderer], outcomes: list[Outcome]) -> dict:
    """Usage of n choices: the prompt once, the completions summed (OpenAI's)."""
    usage = renders[0].usage(outcomes[0])
    usage["completion_tokens"] = sum(len(o.token_ids) for o in outcomes)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _choices_response(renders: list[Renderer], outcomes: list[Outcome]) -> dict:
    """The non-streaming body of n > 1 choices; each choice carries its own `metrics`."""
    body = renders[0].response(outcomes[0])
    body["choices"] = [{**r.choice(o), "metrics": o.metrics} for r, o in zip(renders, outcomes)]
    body["usage"] = _usage(renders, outcomes)
    del body["metrics"]
    return body


async def _stream(jobs: list[Job], events: asyncio.Queue, tasks: list[asyncio.Task], renders: list[Renderer]):
    try:
        for render in renders:
            for event in render.first():
                yield event
        outcomes: list[Outcome | None] = [None] * len(jobs)
        while None in outcomes:
            i, event = await events.get()
            if isinstance(event, Chunk):
                yield renders[i].chunk(event)
            elif isinstance(event, Outcome):
                outcomes[i] = event
                if len(jobs) == 1:
                    for text in renders[0].last(event):
                        yield text
                    return
                for text in renders[i].last(event, done=False):
                    yield text
            elif isinstance(event, ApiError):
                yield sse(event.body())
                yield DONE
                return
        if renders[0].req.include_usage:
            head = renders[0].response(outcomes[0])
            yield sse({key: head[key] for key in ("id", "object", "created", "model")}
                      | {"object": "chat.completion.chunk" if renders[0].chat else "text_completion",
                         "choices": [], "usage": _usage(renders, outcomes)})
        yield DONE
    finally:
        _stop(jobs, tasks)
