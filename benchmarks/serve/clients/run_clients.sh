#!/usr/bin/env bash
# Run real third-party clients (guidellm, lm-eval) against `verispec serve` on SmolLM2-135M
# (llama.cpp), bounded, under the machine's heavy-job lock: start the server, wait for
# /health (bounded), run the client(s), stop the server on exit (trap).
#
#   benchmarks/serve/clients/run_clients.sh [guidellm|lm-eval|all] [OUT_DIR]
#
# Environment:
#   CLIENTS_PY   python of a venv with guidellm and lm-eval (default /tmp/clients-venv/bin/python;
#                they are heavy, so they are not verispec dependencies:
#                `python3 -m venv /tmp/clients-venv && /tmp/clients-venv/bin/pip install
#                torch==2.13.0 guidellm lm-eval`)
#   VERISPEC_PY  python that imports this checkout's verispec (default /work/main/.venv/bin/python)
#   PORT         server port on 127.0.0.1 (default 8420)
#   TOKENIZER    local tokenizer directory for guidellm's synthetic prompts
#                (default ~/.cache/verispec/hf/smollm2-135m)
# Runs from the repository root; writes OUT_DIR/{guidellm,lm-eval}/ and OUT_DIR/env.txt.
set -euo pipefail

which_client=${1:-all}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
out=$(realpath -m "${2:-$repo/benchmarks/serve/clients/results}")
lock=/tmp/verispec-heavy.lock

# Take the heavy-job lock once (re-exec under flock; waits at most 20 min for it).
if [ "${VERISPEC_CLIENTS_LOCKED:-}" != 1 ]; then
  exec env VERISPEC_CLIENTS_LOCKED=1 flock -w 1200 "$lock" "$0" "$@"
fi

cd "$repo"
clients_py=${CLIENTS_PY:-/tmp/clients-venv/bin/python}
verispec_py=${VERISPEC_PY:-/work/main/.venv/bin/python}
clients_bin=$(dirname "$clients_py")
port=${PORT:-8420}
tokenizer=${TOKENIZER:-$HOME/.cache/verispec/hf/smollm2-135m}
base=http://127.0.0.1:$port
mkdir -p "$out"

# Everything that identifies the run, for the results' headers.
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "verispec: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- verispec || echo ' (+ uncommitted changes in verispec/)')"
  echo "llama-cpp-python: $("$verispec_py" -c 'import llama_cpp; print(llama_cpp.__version__)')"
  echo "guidellm: $("$clients_py" -c 'import importlib.metadata as m; print(m.version("guidellm"))')"
  echo "lm-eval: $("$clients_py" -c 'import importlib.metadata as m; print(m.version("lm_eval"))')"
  echo "server: $verispec_py -m verispec.cli serve --target smollm2-135m --backend llamacpp --port $port --log-level info"
} > "$out/env.txt"

server_pid=
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT INT TERM

start_server() {  # $1: log file
  PYTHONPATH=$repo "$verispec_py" -m verispec.cli serve --target smollm2-135m --backend llamacpp \
    --port "$port" --log-level info > "$1" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 120); do
    if curl -sf "$base/health" > /dev/null; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || { echo "server exited; see $1" >&2; return 1; }
    sleep 1
  done
  echo "server not healthy after 120 s; see $1" >&2
  return 1
}

run_guidellm() {
  local d=$out/guidellm
  rm -rf "$d"; mkdir -p "$d"
  start_server "$d/server.log"
  # guidellm's default profile (sweep: synchronous, throughput, then 8 constant rates between),
  # streaming (its default), chat completions (its default request format), bounded per
  # strategy by 12 requests and 30 s; synthetic prompts of 64 tokens, outputs of 32.
  local cmd=("$clients_bin/guidellm" run
    --backend "kind=openai_http,target=$base,model=smollm2-135m"
    --profile kind=sweep
    --constraint kind=max_requests,count=12
    --constraint kind=max_duration,seconds=30
    --data kind=synthetic_text,prompt_tokens=64,output_tokens=32
    --tokenizer "kind=huggingface_auto,model=$tokenizer"
    --output kind=console --output "kind=json,path=$d/benchmarks.json"
    --output "kind=csv,path=$d/benchmarks.csv"
    --disable-progress)
  printf '%q ' "${cmd[@]}" > "$d/command.txt"; echo >> "$d/command.txt"
  local rc=0
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 timeout 900 "${cmd[@]}" > "$d/console.txt" 2>&1 || rc=$?
  echo "$rc" > "$d/exit_code.txt"
  stop_server
}

run_lm_eval() {
  local d=$out/lm-eval
  rm -rf "$d"; mkdir -p "$d"
  start_server "$d/server.log"
  # local-completions with its default tokenizer backend ("auto": remote when the server
  # answers GET /tokenizer_info); a local 10-question multiple-choice task (loglikelihood).
  local cmd=("$clients_bin/lm_eval" run --model local-completions
    --model_args "base_url=$base/v1/completions,model=smollm2-135m,num_concurrent=1,max_retries=1"
    --include_path benchmarks/serve/clients/lm_eval_task
    --tasks verispec_tiny_mc --limit 10 --log_samples
    --output_path "$d/out")
  printf '%q ' "${cmd[@]}" > "$d/command.txt"; echo >> "$d/command.txt"
  local rc=0
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 timeout 600 "${cmd[@]}" > "$d/console.txt" 2>&1 || rc=$?
  echo "$rc" > "$d/exit_code.txt"
  stop_server
}

case $which_client in
  guidellm) run_guidellm ;;
  lm-eval) run_lm_eval ;;
  all) run_guidellm; run_lm_eval ;;
  *) echo "usage: $0 [guidellm|lm-eval|all] [OUT_DIR]" >&2; exit 2 ;;
esac
echo "done: $out"
