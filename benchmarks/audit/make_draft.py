"""A draft model for auditing llama-server's draft-simple speculation on SmolLM2-135M:
the target's GGUF (Q4_1) requantized with llama.cpp's Q2_K recipe. SmolLM2's 576-wide
rows are not a multiple of 256, so most tensors fall back to Q4_0 and the FFN-down ones
become Q3_K: a draft close to the target but not equal to it (llama-server accepted
~30 % of its drafted tokens at T = 0.8 in the smoke run), so rejections happen and the
audit sees the verification path. Writes ~/.cache/verispec/gguf/smollm2-135m-q2k-draft.gguf.

    python benchmarks/audit/make_draft.py
"""

import ctypes
from pathlib import Path

import llama_cpp

src = Path.home() / ".cache/verispec/gguf/smollm2-135m.gguf"
dst = src.with_name("smollm2-135m-q2k-draft.gguf")
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K
params.allow_requantize = True
params.nthread = 1
if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
    raise SystemExit(f"quantizing {src} failed (run `verispec models fetch smollm2-135m` first)")
print(dst)
