#!/usr/bin/env bash
# `verispec bench --endpoint` on a server pair (speculation on / off) started here on 127.0.0.1, the
# table committed under benchmarks/endpoint/NAME/ with a header (command, servers, machine, versions).
#
#   flock /tmp/verispec-heavy.lock flock /tmp/verispec-quiet.lock benchmarks/endpoint/bench_pair.sh vllm-cpu-ngram
#   flock /tmp/verispec-heavy.lock flock /tmp/verispec-quiet.lock benchmarks/endpoint/bench_pair.sh verispec-serve-smollm2
#
# NAME vllm-cpu-CONFIG: vLLM-CPU (benchmarks/vllm/serve.sh) with CONFIG (ngram | draft | suffix) against
# vLLM-CPU without speculation. NAME verispec-serve-smollm2: `verispec serve` on SmolLM2-135M
# (llama.cpp backend, k auto) against the same command with --k 0. Both servers are up at once; the
# bench sends one request at a time (plain, plain-again = A/A, endpoint per prompt), so one is idle
# while the other is timed. A speed measurement: run it under the exclusive quiet lock (HELPERS.md).
# Environment: CATEGORIES (Spec-Bench, default the first six), PER_CATEGORY (2), MAX_NEW (64).
set -euo pipefail
name=${1:?usage: bench_pair.sh vllm-cpu-CONFIG | verispec-serve-smollm2}
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
vs_py=${PYTHON:-$root/.venv/bin/python}; [[ -x "$vs_py" ]] || vs_py=/work/main/.venv/bin/python
dataset=${VERISPEC_SPEC_BENCH:-$root/../shared/data/spec_bench/question.jsonl}
[[ -f "$dataset" ]] || dataset=/work/shared/data/spec_bench/question.jsonl
out=$here/$name
export PYTHONPATH=$root name here root vs_py dataset out
export PER_CATEGORY=${PER_CATEGORY:-2} MAX_NEW=${MAX_NEW:-64} CATEGORIES=${CATEGORIES:-}

bench() {   # ON_URL, OFF_URL, SERVERS set by the caller
  local start t0; start=$(date -u +%FT%TZ); t0=$SECONDS
  rm -rf "$out"
  local args=(bench --endpoint "$ON_URL" --reference-endpoint "$OFF_URL" --dataset "$dataset"
              --per-category "$PER_CATEGORY" --max-new-tokens "$MAX_NEW" --temperature 0 --out "$out" --no-progress)
  [[ -n "$CATEGORIES" ]] && args+=(--categories "$CATEGORIES")
  "$vs_py" -m verispec.cli "${args[@]}" > /dev/null
  {
    echo "# verispec bench --endpoint: $name"
    echo "# servers: $SERVERS"
    echo "# command: verispec ${args[*]//$root\//}" | sed "s#$dataset#shared/data/spec_bench/question.jsonl#"
    echo "# started $start, $((SECONDS - t0)) s; machine: $(uname -m), $(nproc --all) cores ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')), under the exclusive quiet lock; load: $(uptime | sed 's/.*load average: //')"
    echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), python $("$vs_py" -c 'import platform; print(platform.python_version())'), ${VERSIONS:-}"
    echo
    cat "$out/table.md"
  } > "$out/README.md"
  cat "$out/README.md"
}
export -f bench

case "$name" in
  vllm-cpu-*)
    spec_config=${name#vllm-cpu-}
    vpy=${VLLM_VENV:-$HOME/.cache/verispec/vllm-venv}/bin/python
    export VERSIONS=$("$vpy" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))')
    export spec_config
    inner() {
      export OFF_URL=$VLLM_URL
      "$root/benchmarks/vllm/serve.sh" "$spec_config" -- bash -c 'export ON_URL=$VLLM_URL SERVERS="vLLM-CPU (benchmarks/vllm/serve.sh: SmolLM2-135M float32, --enforce-eager, 127.0.0.1) with speculative config $VLLM_SPEC at $VLLM_URL vs the same without speculation at $OFF_URL"; bench'
    }
    export -f inner
    "$root/benchmarks/vllm/serve.sh" off -- bash -c inner
    ;;
  verispec-serve-smollm2)
    export VERSIONS="llama-cpp-python $("$vs_py" -c 'import llama_cpp; print(llama_cpp.__version__)')"
    serve=(-m verispec.cli serve --target smollm2-135m --backend llamacpp)
    "$vs_py" "${serve[@]}" --port 8331 > /tmp/verispec-bench-on.log 2>&1 &
    on=$!
    "$vs_py" "${serve[@]}" --k 0 --port 8332 > /tmp/verispec-bench-off.log 2>&1 &
    off=$!
    trap 'kill $on $off 2>/dev/null || true; wait 2>/dev/null || true' EXIT
    for port in 8331 8332; do
      for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
      curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null || { echo "verispec serve on $port did not start" >&2; tail /tmp/verispec-bench-*.log >&2; exit 1; }
    done
    export ON_URL=http://127.0.0.1:8331/v1 OFF_URL=http://127.0.0.1:8332/v1
    export SERVERS="verispec serve --target smollm2-135m --backend llamacpp (k auto) at $ON_URL vs the same with --k 0 at $OFF_URL"
    bench
    ;;
  *) echo "bench_pair.sh: NAME must be vllm-cpu-CONFIG or verispec-serve-smollm2, got '$name'" >&2; exit 2 ;;
esac
