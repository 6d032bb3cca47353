"""`verispec serve`: an OpenAI-compatible HTTP server over exact speculative decoding.

One idea per room:

| module | job |
|---|---|
| `app` | `create_app`: the FastAPI routes, API key, SSE streaming, error handlers |
| `schema` | request bodies -> a validated `GenerationRequest`, or a 400 naming the field |
| `tokens` | prompts -> token ids (chat template, text, ids) and back, on the HTTP side |
| `engine` | the bounded FIFO queue and the decode worker (batch size 1, prefix reuse, cancellation) |
| `batched` | `BatchedEngine`: several requests at once on llama.cpp (continuous batching, `--max-seqs`) |
| `progress` | one request round by round: stream chunks, logprobs, acceptance counters |
| `responses` | OpenAI response bodies and stream chunks |
| `metrics` | Prometheus metrics (`verispec:` names mirroring vLLM's) |
| `errors` | the OpenAI error object |
| `guard` | `Limits`; the middleware in front of the routes (body size and time, JSON content type, 500s that keep the connection); `parse_json` (depth, integers, surrogates) |
| `pieces` | each token's own text and real bytes (logprobs) |
| `server` | uvicorn in the foreground or a background thread (`BackgroundServer`), with a header timeout and a draining shutdown |
"""

from .app import ServeState, create_app
from .engine import Engine, Job, Outcome, QueueFull
from .errors import ApiError
from .guard import Limits
from .server import BackgroundServer, bind, make_server, url_of

__all__ = ["ApiError", "BackgroundServer", "Engine", "Job", "Limits", "Outcome", "QueueFull", "ServeState",
           "bind", "create_app", "make_server", "url_of"]
