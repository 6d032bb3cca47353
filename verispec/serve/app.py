"""The FastAPI application: OpenAI-compatible routes over one `SpeculativeDecoder`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
(behind ``Authorization: Bearer KEY`` when an API key is set), ``GET /health`` (503
while the models load), ``GET /metrics`` (Prometheus), ``POST /tokenize`` and
``POST /detokenize`` (vLLM's shapes: exact token ids for clients and audits).

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
import json
import logging
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine, Job, Outcome, QueueFull
from .errors import ApiError, bad_request
from .metrics import ServerMetrics
from .progress import Chunk
from .responses import DONE, Renderer, sse
from .schema import ServerDefaults, _messages, parse
from .tokens import Prompter

log = logging.getLogger("verispec.serve")


class ServeState:
    """Everything the routes share; `app.state.verispec`.

    Attributes:
        decoder: the `SpeculativeDecoder`, or None while loading.
        engine: the queue and decode worker (None while loading).
        metrics: the Prometheus metrics (exist from the start).
        prompter, defaults: tokenization and request defaults (None while loading).
    """

    def __init__(self, *, model_name: str | None, k, drafter: str | None, rule, api_key: str | None,
                 max_queue: int, prefix_reuse: bool) -> None:
        self.model_name, self.k, self.drafter, self.rule = model_name, k, drafter, rule
        self.api_key, self.max_queue, self.prefix_reuse = api_key, max_queue, prefix_reuse
        self.metrics = ServerMetrics()
        self.decoder = self.engine = self.prompter = self.defaults = None

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def attach(self, decoder) -> None:
        """Serve `decoder` from now on (the CLI loads the models after the server started)."""
        target = decoder.target
        name = self.model_name or target.name
        self.prompter = Prompter(decoder.tokenizer, target.vocab_size, target.context_length)
        self.defaults = ServerDefaults(
            model_names=(name,), k=self.k, drafter=decoder.drafter,
            drafter_names=decoder.drafter_names, sampling=decoder.sampling_config)
        self.decoder = decoder
        self.engine = Engine(decoder, self.metrics, max_queue=self.max_queue,
                             prefix_reuse=self.prefix_reuse, rule=self.rule)

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(503, "the model is still loading; retry when GET /health answers 200",
                           code="model_loading")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def create_app(decoder=None, *, model_name: str | None = None, k: int | str = "auto", rule="auto",
               api_key: str | None = None, max_queue: int = 32, prefix_reuse: bool = True) -> FastAPI:
    """An OpenAI-compatible FastAPI app serving `decoder` (run it with uvicorn).

    Args:
        decoder: a `SpeculativeDecoder` (or subclass); None starts in the loading state
            (`/health` 503) until ``app.state.verispec.attach(decoder)``.
        model_name: the name clients use as `model` (default: the target's name).
        k: the default draft length ("auto" or an integer >= 0); requests may override.
        rule: the acceptance rule for every request: "auto" (`SpeculativeDecoder.generate`'s
            choice), "standard", "gumbel", or any `verispec.verify.Rule`.
        api_key: when set, every /v1 route needs ``Authorization: Bearer <api_key>`` (401).
        max_queue: requests that may wait while one decodes; more get 429 + Retry-After.
        prefix_reuse: keep the KV caches between requests (False: prefill every prompt
            from scratch; for measurements).

    Returns:
        The app; `app.state.verispec` is its `ServeState` (engine, metrics).

    Raises:
        ValueError: naming `k` or `max_queue` when out of range.
    """
    if not (k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 0)):
        raise ValueError(f'k must be "auto" or an integer >= 0, got {k!r}')
    state = ServeState(model_name=model_name, k=k, drafter=None, rule=rule, api_key=api_key,
                       max_queue=max_queue, prefix_reuse=prefix_reuse)
    if decoder is not None:
        state.attach(decoder)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.close)

    app = FastAPI(title="verispec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.verispec = state
    _add_error_handlers(app)

    async def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @v1.get("/models")
    async def models() -> dict:
        state.require_ready()
        target = state.decoder.target
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "verispec",
             "max_model_len": target.context_length} for name in state.defaults.model_names]}

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

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        state.require_ready()
        body = await _json_body(request)
        _only(body, {"model", "prompt", "messages", "add_special_tokens", "return_token_strs"})
        _check_model(body.get("model"), state)
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise bad_request("add_special_tokens", "add_special_tokens must be true or false")
        if ("prompt" in body) == ("messages" in body):
            raise bad_request("prompt", "give exactly one of prompt (text) or messages (chat)")
        if "messages" in body:
            ids = state.prompter.chat(_messages(body["messages"]))
        else:
            if not isinstance(body["prompt"], str):
                raise bad_request("prompt", "prompt must be a string")
            ids = state.prompter.text(body["prompt"], add_special_tokens=add_special)
        out = {"count": len(ids), "max_model_len": state.prompter.context_length, "tokens": ids}
        if body.get("return_token_strs"):
            out["token_strs"] = state.prompter.pieces(ids)
        return out

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        state.require_ready()
        body = await _json_body(request)
        _only(body, {"model", "tokens"})
        _check_model(body.get("model"), state)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise bad_request("tokens", "tokens must be a list of token ids")
        return {"prompt": state.prompter.decode(state.prompter.check_ids(tokens, "tokens"))}

    return app


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

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return ApiError(500, f"internal error: {type(exc).__name__}", type="server_error").response()


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(None, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _only(body: dict, allowed: set[str]) -> None:
    for name in body:
        if name not in allowed:
            raise bad_request(name, f"unrecognized request field {name!r}", code="unknown_parameter")


def _check_model(model, state: ServeState) -> None:
    if model is not None and model not in state.defaults.model_names:
        raise ApiError(400, f"model {model!r} is not served here; /v1/models lists "
                            f"{', '.join(state.defaults.model_names)}", param="model", code="model_not_found")


async def _watch_disconnect(receive, job: Job) -> None:
    """Cancel `job` when the client disconnects (ASGI ``http.disconnect``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _generate(endpoint: str, request: Request, state: ServeState):
    state.require_ready()
    body = await _json_body(request)
    req = parse(endpoint, body, state.prompter, state.defaults)
    job = Job(req)
    try:
        state.engine.submit(job)
    except QueueFull as e:
        raise ApiError(429, f"the server is busy: {e}", code="rate_limit_exceeded",
                       headers={"Retry-After": str(e.retry_after)}) from None
    watcher = asyncio.create_task(_watch_disconnect(request.receive, job))
    render = Renderer(job)
    if req.stream:
        return StreamingResponse(_stream(job, watcher, render), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, Outcome):
                return JSONResponse(render.response(event))
            if isinstance(event, ApiError):
                return event.response()
    finally:
        watcher.cancel()
        if not job.done:
            job.cancel()      # the handler itself was cancelled (server shutting down)


async def _stream(job: Job, watcher: asyncio.Task, render: Renderer):
    try:
        for event in render.first():
            yield event
        while True:
            event = await job.events.get()
            if isinstance(event, Chunk):
                yield render.chunk(event)
            elif isinstance(event, Outcome):
                for text in render.last(event):
                    yield text
                return
            elif isinstance(event, ApiError):
                yield sse(event.body())
                yield DONE
                return
    finally:
        watcher.cancel()
        if not job.done:
            job.cancel()      # the client went away, or the server is shutting down
