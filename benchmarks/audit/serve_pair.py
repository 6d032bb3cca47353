"""Serve the default pair (qwen2.5-coder-1.5b / 0.5b, llama.cpp) like `verispec serve`, with a
chosen number of llama.cpp threads.

`verispec serve --backend llamacpp` runs llama.cpp on every core; on this shared 2-core machine
(load 4-5 from other jobs) its spinning threads made a 3-token request take ~6 s instead of
~0.6 s with one thread. This script builds the same app (`verispec.serve.create_app` over a
`SpeculativeDecoder` of the default pair, drafter auto, k auto, rule auto, the serve default
suffix cache) with `load_model(..., n_threads=N)` and serves it on 127.0.0.1 until killed.

    python benchmarks/audit/serve_pair.py --port 8101 --threads 1
"""

import argparse

from verispec import registry
from verispec.api import SpeculativeDecoder, load_model
from verispec.cli.serve import SERVE_CACHE_TOKENS
from verispec.serve import bind, create_app, make_server, url_of

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=8101)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--k", default="auto")
args = ap.parse_args()
target = load_model(registry.DEFAULT_TARGET, backend="llamacpp", n_threads=args.threads)
draft = load_model(registry.DEFAULT_DRAFT, backend="llamacpp", n_threads=args.threads)
decoder = SpeculativeDecoder(target, draft, drafter="auto", suffix_cache_size=SERVE_CACHE_TOKENS)
k = args.k if args.k == "auto" else int(args.k)
sock = bind("127.0.0.1", args.port)
print(f"serving {target.name} + {draft.name} (batch-invariant {target.batch_invariant}, "
      f"{args.threads} thread(s), k={k}) on {url_of(sock)}", flush=True)
make_server(create_app(decoder, model_name=registry.DEFAULT_TARGET, k=k)).run(sockets=[sock])
