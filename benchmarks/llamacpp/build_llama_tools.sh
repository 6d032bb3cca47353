#!/usr/bin/env bash
# Build llama.cpp's llama-speculative, llama-server and llama-bench from the llama.cpp that ships inside the
# llama-cpp-python sdist (the same llama.cpp verispec's llama.cpp backend runs), outside the repository.
# Usage: bash benchmarks/llamacpp/build_llama_tools.sh [extra cmake -D options]
# Env: PYTHON (pip to download with, default python3), VERISPEC_BUILD (default ~/.cache/verispec/build),
#      JOBS (parallel compile jobs, default 2). See build-llama-tools.md.
set -euo pipefail
VERSION=0.3.36
COMMIT=0c1e570
PYTHON=${PYTHON:-python3}
ROOT=${VERISPEC_BUILD:-$HOME/.cache/verispec/build}
SRC=$ROOT/src/llama_cpp_python-$VERSION/vendor/llama.cpp
OUT=$ROOT/llama.cpp-$COMMIT

mkdir -p "$ROOT/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$ROOT/src"
    tar -xzf "$ROOT/src/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT/src"
fi
# CMake's defaults (GGML_NATIVE=ON, llamafile's sgemm on), as for the published comparison; no curl or
# OpenSSL (models are local files), and no web UI (the prebuilt one would be downloaded at build time).
cmake -S "$SRC" -B "$OUT" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "$@"
cmake --build "$OUT" --target llama-speculative llama-server llama-bench -j "${JOBS:-2}"
"$OUT/bin/llama-speculative" --version
"$OUT/bin/llama-server" --version
"$OUT/bin/llama-bench" --help | head -n 3 || true   # head closes the pipe: SIGPIPE (141) under pipefail
