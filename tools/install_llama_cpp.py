"""Build and install llama-cpp-python with one switch added to its llama.cpp: `llama_set_use_ref`.

    python tools/install_llama_cpp.py [--version 0.3.36] [--build-dir DIR]

Why: verispec's batch-invariant mode (docs/exactness.md) needs every row of a verification
forward computed exactly as a single-token forward. llama.cpp's CPU backend already has such
a path, its "reference" kernels (`ggml_backend_cpu_set_use_ref`: no tiled K-quant matmul, no
split-KV or tiled flash attention, no op fusion), but llama.cpp offers no call to reach it
from a context, and llamafile's sgemm ignores it. Without a switch the only way was a build
without sgemm and with flash attention off, which costs native speed (prefill 0.75x,
decode 0.88x of llama-bench; benchmarks/llamacpp-native/). With it, verispec turns the
reference kernels on for decodes and verification forwards and off for prefills, keeping
sgemm, the tiled matmul and flash attention wherever a prompt is prefilled.

The patch, applied to the llama-cpp-python sdist's vendored llama.cpp (each edit must
apply exactly once, or the script stops naming it):

* ggml-cpu.c: llamafile's sgemm is skipped when the compute params say use_ref (as the
  tiled matmul and flash attention already are);
* repack.cpp: under use_ref, weights repacked at load (CPU_REPACK: Q4_0, Q4_K, Q6_K, IQ4_NL, ...
  interleaved for AVX2 / NEON) score every row of a batch as a single token is scored: its
  activations quantized by the row quantizer and each row scored by the gemv a single token
  gets, never the 4-row gemm; so the mode keeps llama.cpp's repacked weights (native default
  speed) instead of turning them off. For Q4_K on AVX2 (the repacked type of Q4_K_M models on
  x86) one kernel, `gemv_rows_q4_K.cpp`, scores all rows of a verification forward at once: it
  loads and unpacks each weight super-block once, then runs every row through the gemv's own
  instructions in the gemv's order (integer dot products, then the same FMAs), so each row's
  floats are the single token's bit for bit while the unpacking is shared (a verified row cost
  ~15.6 ms after a 31 ms single step with one gemv per row, ~11.8 ms with the kernel: Qwen2.5
  1.5B Q4_K_M, 2-core AMD EPYC; benchmarks/llamacpp-native/README.md);
* llama.h / llama-context.{h,cpp}: `void llama_set_use_ref(struct llama_context *, bool)`,
  which hands the flag to the context's CPU backend, and `int llama_verispec_patch(void)`,
  which says which of these edits the build has (`PATCH_LEVEL`).

Downloads the sdist with pip (so pip's index settings apply), builds with pip install
--no-cache-dir (a cached unpatched wheel must not be reused), then checks that the installed
library exports the switch.

Raises SystemExit naming the step that failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
#: what `llama_verispec_patch()` returns in a build of these edits: 1 was the switch alone (no such
#: call), 2 adds repacked weights under use_ref, 3 the multi-row Q4_K kernel; verispec reads it
#: (`verispec.models.llamacpp`)
PATCH_LEVEL = 3

#: repack.cpp: the rows of a use_ref forward, each scored by its gemv (a loop of single-token gemvs;
#: kernels that unpack a weight block once for all rows specialise it)
GEMV_ROWS = """
// verispec: nr rows (activations vy_stride bytes apart, outputs bs floats apart), each scored
// exactly as a single token's gemv scores it
template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>
static void gemv_rows(int n, float * s, size_t bs, int ne01, const void * vx, const char * vy, size_t vy_stride,
                      int nr, int nc) {
    for (int y = 0; y < nr; y++) {
        gemv<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(n, s + y * bs, ne01, vx, vy + y * vy_stride, 1, nc);
    }
}

#if defined(__AVX2__)
template <> void gemv_rows<block_q4_K, 8, 8, GGML_TYPE_Q8_K>(int n, float * s, size_t bs, int ne01, const void * vx,
                                                            const char * vy, size_t vy_stride, int nr, int nc) {
    GGML_ASSERT(vy_stride == (n / QK_K) * sizeof(block_q8_K));
    if (nr == 1) {
        ggml_gemv_q4_K_8x8_q8_K(n, s, ne01, vx, vy, 1, nc);
    } else {
        ggml_gemv_rows_q4_K_8x8_q8_K(n, s, bs, vx, vy, nr, nc);
    }
}
#endif
"""

#: arch/x86/repack.cpp: the Q4_K 8x8 rows kernel (`GEMV_ROWS`)
GEMV_ROWS_Q4_K = (Path(__file__).with_name("gemv_rows_q4_K.cpp")).read_text()

#: (file under vendor/llama.cpp, text to find, replacement); each must match exactly once
EDITS = [
    ("ggml/src/ggml-cpu/ggml-cpu.c",
     "    if (src1_cont) {\n        for (int64_t i13 = 0; i13 < ne13; i13++)",
     "    if (src1_cont && !params->use_ref) {\n        for (int64_t i13 = 0; i13 < ne13; i13++)"),
    ("ggml/src/ggml-cpu/ggml-cpu.c",
     "#if GGML_USE_LLAMAFILE\n    if (src1->type != vec_dot_type) {",
     "#if GGML_USE_LLAMAFILE\n    if (src1->type != vec_dot_type && !params->use_ref) {"),
    # repacked weights (CPU_REPACK: Q4_0, Q4_K, Q6_K, ... interleaved at load) under use_ref: every row
    # quantized by the row quantizer and scored by the gemv a single token gets, never the 4-row gemm
    ("ggml/src/ggml-cpu/repack.cpp",
     "i11 < ne11 - ne11 % 4; i11 += nth * 4",
     "i11 < (params->use_ref ? 0 : ne11 - ne11 % 4); i11 += nth * 4"),
    ("ggml/src/ggml-cpu/repack.cpp",
     "const int64_t i11_processed = ne11 - ne11 % 4;",
     "const int64_t i11_processed = params->use_ref ? 0 : ne11 - ne11 % 4;"),
    # ... and scored by `gemv_rows`: per row the single token's gemv, where one kernel (Q4_K 8x8 on
    # AVX2, the repacked type of Q4_K_M models on x86) unpacks each weight block once for every row
    ("ggml/src/ggml-cpu/repack.cpp",
     "        if (nrows > 3) {",
     ("        if (params->use_ref) {   // verispec: every row exactly as a single token's gemv\n"
      "            gemv_rows<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) dst_ptr + src0_start, "
      "nb1 / nb0, ne01, src0_ptr + src0_start * nb01, src1_ptr, src1_col_stride, nrows, ncols);\n"
      "            return;\n        }\n        if (nrows > 3) {")),
    ("ggml/src/ggml-cpu/repack.cpp",
     "// gemv\ntemplate <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>\n"
     "void gemv(int, float *, size_t, const void *, const void *, int, int);\n",
     "// gemv\ntemplate <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>\n"
     "void gemv(int, float *, size_t, const void *, const void *, int, int);\n" + GEMV_ROWS),
    ("ggml/src/ggml-cpu/repack.h",
     "void ggml_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, "
     "const void * GGML_RESTRICT vy, int nr, int nc);\n",
     "void ggml_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, "
     "const void * GGML_RESTRICT vy, int nr, int nc);\n"
     "void ggml_gemv_rows_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, "
     "const void * GGML_RESTRICT vy, int nr, int nc);\n"),
    ("ggml/src/ggml-cpu/arch/x86/repack.cpp",
     "void ggml_gemv_iq4_nl_8x8_q8_0(int n,",
     GEMV_ROWS_Q4_K + "void ggml_gemv_iq4_nl_8x8_q8_0(int n,"),
    ("include/llama.h",
     ("    LLAMA_API void llama_set_abort_callback(struct llama_context * ctx, ggml_abort_callback "
      "abort_callback, void * abort_callback_data);\n"),
     ("    LLAMA_API void llama_set_abort_callback(struct llama_context * ctx, ggml_abort_callback "
      "abort_callback, void * abort_callback_data);\n\n"
      "    // verispec: run the CPU backend's reference kernels (no llamafile sgemm, no tiled matmul,\n"
      "    // no split-KV or tiled flash attention, no op fusion) in the following decodes, so that\n"
      "    // every row of a decode is computed as in a single-token decode\n"
      "    LLAMA_API void llama_set_use_ref(struct llama_context * ctx, bool use_ref);\n\n"
      "    // verispec: which of verispec's edits this build has (2: use_ref also covers repacked weights; 3: one unpack per weight block for all rows)\n"
      "    LLAMA_API int llama_verispec_patch(void);\n")),
    ("src/llama-context.h",
     "    void set_warmup(bool value);\n",
     "    void set_warmup(bool value);\n    void set_use_ref(bool value);\n"),
    ("src/llama-context.cpp",
     "void llama_set_warmup(llama_context * ctx, bool warmup) {\n    ctx->set_warmup(warmup);\n}\n",
     ("void llama_set_warmup(llama_context * ctx, bool warmup) {\n    ctx->set_warmup(warmup);\n}\n\n"
      "void llama_set_use_ref(llama_context * ctx, bool use_ref) {\n    ctx->set_use_ref(use_ref);\n}\n\n"
      f"int llama_verispec_patch(void) {{\n    return {PATCH_LEVEL};\n}}\n")),
    ("src/llama-context.cpp",
     "void llama_context::set_abort_callback(",
     ("void llama_context::set_use_ref(bool value) {\n"
      "    if (backend_cpu == nullptr) {\n        return;\n    }\n"
      "    auto * reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(backend_cpu));\n"
      "    auto * fn = (decltype(ggml_backend_cpu_set_use_ref) *) ggml_backend_reg_get_proc_address(reg, "
      "\"ggml_backend_cpu_set_use_ref\");\n"
      "    if (fn) {\n        fn(backend_cpu, value);\n    }\n}\n\n"
      "void llama_context::set_abort_callback(")),
]

CHECK = ("import llama_cpp, llama_cpp.llama_cpp as c, sys; "
         "f = getattr(c._lib, 'llama_verispec_patch', None); "
         "sys.exit(0 if hasattr(c._lib, 'llama_set_use_ref') and f is not None and f() >= int(sys.argv[2]) "
         "and llama_cpp.__version__ == sys.argv[1] else 'llama_set_use_ref or patch level missing')")


def installed(version: str) -> bool:
    """Whether this Python already has llama-cpp-python `version` with the switch."""
    return subprocess.run([sys.executable, "-c", CHECK, version, str(PATCH_LEVEL)], capture_output=True,
                          check=False).returncode == 0


def patch(llama_cpp_dir: Path) -> None:
    """Apply `EDITS` under `llama_cpp_dir` (the vendored llama.cpp).

    Raises:
        SystemExit: naming the file and edit that does not match exactly once.
    """
    for name, old, new in EDITS:
        path = llama_cpp_dir / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"install_llama_cpp: {name}: expected the text to patch once, found it "
                             f"{text.count(old)} times (another llama-cpp-python version?): {old[:60]!r}")
        path.write_text(text.replace(old, new))


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise SystemExit(f"install_llama_cpp: failed: {' '.join(cmd)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=VERSION, help="llama-cpp-python version (default %(default)s)")
    ap.add_argument("--build-dir", default=None, help="where to unpack and build (default: a temporary directory)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the switch is already installed")
    args = ap.parse_args()
    if not args.force and installed(args.version):
        print("install_llama_cpp: llama-cpp-python", args.version, "with llama_set_use_ref is already installed")
        return
    with tempfile.TemporaryDirectory(prefix="verispec-llama-") as tmp:
        root = Path(args.build_dir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={args.version}", "-d", str(root)])
        sdist = root / f"llama_cpp_python-{args.version}.tar.gz"
        if not sdist.exists():
            raise SystemExit(f"install_llama_cpp: pip did not download {sdist.name} into {root}")
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):     # Python >= 3.10.12 / 3.11.4
                tar.extractall(root, filter="data")
            else:                                   # pragma: no cover - older Pythons
                tar.extractall(root)
        source = root / f"llama_cpp_python-{args.version}"
        patch(source / "vendor" / "llama.cpp")
        # with its dependencies; then again in place if pip kept an unpatched build of the same version
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", str(source)])
        if not installed(args.version):
            run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--force-reinstall",
                 "--no-deps", str(source)])
    if not installed(args.version):
        raise SystemExit("install_llama_cpp: the installed llama-cpp-python has no llama_set_use_ref")
    print("install_llama_cpp: llama-cpp-python", args.version, "installed with llama_set_use_ref")


if __name__ == "__main__":
    main()
