"""Control: vLLM-CPU's C++ recovered-token kernel, given correct inputs, samples correctly.

    ~/.cache/verispec/vllm-venv/bin/python benchmarks/vllm/recovered_check.py

An 8-token target p, a one-hot draft (n-gram: no draft probabilities) on token 1: the
recovered token must follow p with token 1 removed, renormalised. 20 000 draws, each with
fresh exponentials as `sample_recovered_tokens` makes them; prints observed vs expected and the
largest difference (the binomial standard error at p = 0.33 is 0.0033).
"""

import collections

import torch
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()        # loads vllm._C's CPU kernels too
import vllm._C  # noqa: F401

torch.manual_seed(0)
V, N = 8, 20000
p = torch.tensor([[0.05, 0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05]], dtype=torch.float32)
draft, cu = torch.tensor([1], dtype=torch.int64), torch.tensor([1], dtype=torch.int64)
count = collections.Counter()
for _ in range(N):
    inv_q = torch.empty(1, V).exponential_().reciprocal()
    out = torch.empty(1, dtype=torch.int64)
    torch.ops._C.sample_recovered_tokens_kernel_impl(out, cu, draft, None, p, inv_q, V, True)
    count[int(out)] += 1
want = p[0].clone()
want[1] = 0
want /= want.sum()
got = torch.tensor([count[i] / N for i in range(V)])
print("observed:", [round(float(x), 4) for x in got])
print("expected:", [round(float(x), 4) for x in want])
print(f"max |observed - expected| = {float((got - want).abs().max()):.4f} over {N} draws")
