"""`verispec serve`: the OpenAI-compatible server (see `verispec.serve`).

The socket is bound first (a port in use fails at once), the HTTP server starts and
answers `/health` with 503 while the models load in a thread, then the URL is printed.
Ctrl-C (SIGINT) or SIGTERM: no new connections, in-flight requests get
`--graceful-seconds` to finish and are then cancelled, and the process exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading

import typer

from ..drafters import SERVE_CACHE_TOKENS
from .common import (BACKEND, BATCH_INVARIANT, DRAFT, DRAFTER, K_MAX, RULE, TARGET, THREADS, build_decoder, check_rule, err,
                     fail, parse_k)

# The warm-up prompt: long enough (> 34 tokens) for a draft model to time its catch-up and
# its draft steps too (`ModelDrafter.calibrate`); with "Hello" it could not, and the adaptive
# policy priced a draft model's first catch-up over a whole prompt at 0 s.
WARMUP_TEXT = ("A server times its models once before the first request: the target's forwards over "
               "one to nine tokens, and the draft model reading a few dozen tokens of context and then "
               "drafting one, so that the adaptive policy knows every price before it must choose.")


def warm_up(decoder) -> None:
    """Time this machine's prices for k = auto once, before the first request: one short
    generation of `WARMUP_TEXT` (token ids 0..63 without a tokenizer) calibrates the
    target's cost curve and the draft model's catch-up and draft step
    (`AdaptivePolicy.calibrate`)."""
    vocab = decoder.target.vocab_size
    prompt = [i % vocab for i in range(64)] if decoder.tokenizer is None else WARMUP_TEXT
    decoder.generate(prompt, max_new_tokens=2, k="auto", use_chat_template=False)


def serve(
    target: str | None = TARGET,
    draft: str | None = DRAFT,
    draft_layers: int | None = typer.Option(None, "--draft-layers", min=1,
                                            help="keep only the draft's first N layers ('--draft self' uses the target's)"),
    backend: str | None = BACKEND,
    drafter: str = DRAFTER,
    k: str = typer.Option("auto", "--k", help="default draft length (requests may set 'k'), or 'auto'"),
    rule: str = RULE,
    k_max: int = K_MAX,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port (0: any free port)"),
    served_model_name: str | None = typer.Option(None, "--served-model-name",
                                                 help="the name clients pass as 'model' (default: the target's)"),
    max_queue: int = typer.Option(32, "--max-queue", min=0,
                                  help="requests that may wait while all --max-seqs slots decode; more get 429 + Retry-After"),
    api_key: str | None = typer.Option(None, "--api-key", envvar="VERISPEC_API_KEY",
                                       help="require 'Authorization: Bearer KEY' on /v1 routes"),
    no_prefix_reuse: bool = typer.Option(False, "--no-prefix-reuse",
                                         help="prefill every prompt from scratch (default: reuse the KV cache "
                                              "of the prefix shared with the previous request)"),
    suffix_cache_size: int = typer.Option(SERVE_CACHE_TOKENS, "--suffix-cache-size", min=0,
                                          help="tokens of earlier responses the suffix drafter may draft "
                                               "from (cross-request suffix decoding; 0 = off)"),
    batch_invariant: bool | None = BATCH_INVARIANT,
    threads: int | None = THREADS,
    graceful_seconds: float = typer.Option(10.0, "--graceful-seconds", min=0.0,
                                           help="at shutdown, seconds in-flight requests get before they are cancelled"),
    max_request_bytes: int = typer.Option(1 << 20, "--max-request-bytes", min=1,
                                          help="largest request body (413 beyond)"),
    max_prompt_tokens: int = typer.Option(2048, "--max-prompt-tokens", min=1,
                                          help="longest prompt in tokens, chat template included (400 beyond)"),
    request_timeout: float = typer.Option(300.0, "--request-timeout", min=0.001,
                                          help="seconds from arrival to the last token, queue included (408 beyond)"),
    read_timeout: float = typer.Option(30.0, "--read-timeout", min=0.001,
                                       help="seconds a client has to send its request headers, and its body"),
    max_seqs: int = typer.Option(1, "--max-seqs", min=1,
                                 help="requests decoded at once (continuous batching: one llama.cpp forward "
                                      "per round scores every running request's rows; each response stays "
                                      "exactly its solo response). llama.cpp only: the transformers backend "
                                      "decodes one request at a time. Above 1: no prefix reuse, no echo with "
                                      "logprobs, no cross-request suffix cache"),
    max_batched_rows: int | None = typer.Option(None, "--max-batched-rows", min=1,
                                                help="with --max-seqs > 1: the most rows one round's forward "
                                                     "carries. Running requests' rows always go; prompt pieces "
                                                     "(512 tokens each) join while the round stays within it, "
                                                     "the oldest waiting prompt one piece per round regardless, "
                                                     "so a long prompt never freezes the others' decoding "
                                                     "[default: 512]"),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level"),
) -> None:
    """Serve the target (with speculative decoding) over an OpenAI-compatible HTTP API.

    One request decodes at a time unless --max-seqs N (llama.cpp backend) batches up to N.
    """
    from ..serve import bind, create_app, make_server, url_of
    from ..serve.batched import load_batch_models
    from ..serve.guard import Limits, check_api_key   # the option defaults above are Limits'

    k_value = parse_k(k)
    check_rule(rule)
    if max_seqs > 1 and backend == "transformers":
        fail("--max-seqs > 1 needs the llama.cpp backend: the transformers backend decodes one request "
             "at a time (drop --max-seqs, or use --backend llamacpp)")
    if max_batched_rows is not None and max_seqs == 1:
        fail("--max-batched-rows applies only with --max-seqs > 1 (several requests in one forward)")
    try:
        check_api_key(api_key)
    except ValueError as e:
        fail(str(e).replace("api_key", "--api-key"))
    limits = Limits(max_request_bytes=max_request_bytes, read_timeout=read_timeout,
                    max_prompt_tokens=max_prompt_tokens, request_timeout=request_timeout)
    try:
        sock = bind(host, port)
    except OSError as e:
        fail(f"{e} (--host/--port)")
    url = url_of(sock)
    app = create_app(None, model_name=served_model_name, k=k_value, rule=rule, api_key=api_key,
                     max_queue=max_queue, prefix_reuse=not no_prefix_reuse, limits=limits,
                     max_batched_rows=(max_batched_rows or 512) if max_seqs > 1 else None)
    server = make_server(app, log_level=log_level, graceful_seconds=graceful_seconds)
    failure: list[int] = []

    def load() -> None:
        try:
            decoder, used_backend = build_decoder(target, draft, backend, drafter, draft_layers,
                                                  suffix_cache_size=suffix_cache_size,
                                                  batch_invariant=batch_invariant, k_max=k_max,
                                                  threads=threads)
            if k_value == "auto":    # time this machine's cost curve once, before the first request
                with err.status("warming up (k=auto times the target's cost curve)"):
                    warm_up(decoder)
            batch = None
            if max_seqs > 1:
                if used_backend != "llamacpp":
                    fail(f"--max-seqs > 1 needs the llama.cpp backend, and the {used_backend} backend was "
                         "chosen: it decodes one request at a time (add --backend llamacpp, or drop --max-seqs)")
                with err.status(f"opening {max_seqs} llama.cpp sequence slots"):
                    batch = load_batch_models(decoder, max_seqs)
        except typer.Exit as e:
            failure.append(e.exit_code or 2)
            server.should_exit = True
            return
        except Exception as e:  # noqa: BLE001 - anything else loading raised: say it, stop serving
            err.print(f"[bold red]error:[/] loading failed: {type(e).__name__}: {e}")
            failure.append(1)
            server.should_exit = True
            return
        app.state.verispec.attach(decoder, batch)
        name = served_model_name or decoder.target.name
        err.print(f"verispec serve: [bold]{url}/v1[/] (model {name!r}, backend {used_backend}, "
                  f"draft {decoder.draft.name if decoder.draft else None}, k {k_value}, "
                  f"{max_seqs} at once); Ctrl-C stops")
        print(f"{url}/v1", flush=True)

    err.print(f"verispec serve: listening on {url} (loading the models; /health answers 503 until ready)")
    threading.Thread(target=load, name="verispec-load", daemon=True).start()
    # uvicorn handles SIGINT/SIGTERM while it runs (graceful shutdown), then raises the
    # signal again for the handlers it found; those are no-ops here, so a stop exits 0
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise typer.Exit(failure[0])
    err.print("verispec serve: stopped")
    sys.stdout.flush()
