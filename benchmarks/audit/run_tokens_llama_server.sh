#!/usr/bin/env bash
# A token-level audit of llama-server's speculative decoding against its own spec-off run:
# two llama-server processes on SmolLM2-135M (THREADS threads each, default 1: the arms are
# drawn one after the other, so one server decodes at a time; SCORE_THREADS for the local
# scorer, default 1; repacking off: AMX SIGILLs on
# this VM), the reference without speculation, the audited one with SPEC (llama-server flags),
# compared completion by completion (`--reference-endpoint`; add `--paired` for the same
# seeds on both arms, the default is disjoint seeds); the local exact p
# (verispec's llama.cpp backend) is the scoring function and is reported beside. SPEC empty:
# the spec-off server audited against the local exact p alone. Committed as NAME.txt + NAME/.
# The draft model comes from make_draft.py. Run it under the heavy lock:
#   flock /tmp/verispec-heavy.lock benchmarks/audit/run_tokens_llama_server.sh NAME "SPEC" -- audit options...
set -euo pipefail
name=$1; spec=$2; shift 3
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
py=${PYTHON:-/work/main/.venv/bin/python}
bin=${LLAMA_BIN:-$HOME/.cache/verispec/build/llama.cpp-0c1e570/bin}
gguf=${GGUF:-$HOME/.cache/verispec/gguf/smollm2-135m.gguf}
common="-m $gguf -t ${THREADS:-1} --no-repack --host 127.0.0.1 -c 4096 --no-webui"
start=$(date -u +%FT%TZ)
pids=()
trap 'kill ${pids[@]} 2>/dev/null || true' EXIT
# REFERENCE=none with a SPEC: no spec-off server; the speculating one against the local exact p
# alone (with --reference-kernels llama-server, llama-server's own logits)
ports=()
if [ -z "$spec" ] || [ "${REFERENCE:-endpoint}" != none ]; then
  "$bin/llama-server" $common --port 8321 > /tmp/llama-server-ref.log 2>&1 & pids+=($!); ports+=(8321)
fi
endpoint=http://127.0.0.1:8321/v1; reference=()
if [ -n "$spec" ]; then
  "$bin/llama-server" $common --port 8322 $spec > /tmp/llama-server-spec.log 2>&1 & pids+=($!); ports+=(8322)
  endpoint=http://127.0.0.1:8322/v1
  [ "${REFERENCE:-endpoint}" != none ] && reference=(--reference-endpoint http://127.0.0.1:8321/v1)
fi
for port in "${ports[@]}"; do
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
done
# the local scorer's threads (SCORE_THREADS, default 1): it scores after the draws, while the servers idle
audit=(audit --endpoint "$endpoint" "${reference[@]}" --target "$gguf" --backend llamacpp --threads "${SCORE_THREADS:-1}" "$@")
t0=$(date +%s)
# the local reference holds its weights as the servers do (--no-repack): VERISPEC_LLAMACPP_REPACK=0
# (also what --reference-kernels llama-server needs to compute their logits bit for bit)
rc=0
VERISPEC_LLAMACPP_REPACK=0 PYTHONPATH=$root nice -n 10 "$py" -m verispec.cli "${audit[@]}" --report "$here/$name" \
  > "$here/$name.body" 2> /tmp/verispec-audit-$name.err || rc=$?
[ "$rc" = 0 ] || echo "audit exited with status $rc (see /tmp/verispec-audit-$name.err)" >> "$here/$name.body"
# what the audited server drafted, summed over its per-request timing lines
drafted=$(grep -o 'draft acceptance = [0-9.]* ( *[0-9]* accepted / *[0-9]* generated)' /tmp/llama-server-spec.log 2>/dev/null \
  | awk '{a += $6; g += $9; n++} END {if (n) printf "%d requests drafted: %d of %d draft tokens accepted (%.3f)", n, a, g, a / g}' || true)
{
  echo "# verispec audit --endpoint (token level): $name"
  [ ${#reference[@]} -gt 0 ] || [ -z "$spec" ] && echo "# reference server: llama-server $common --port 8321"
  [ -n "$spec" ] && echo "# audited server: llama-server $common --port 8322 $spec"
  [ -n "$spec" ] && echo "# drafting: ${drafted:-none recorded}"
  echo "# command: verispec ${audit[*]} --report benchmarks/audit/$name"
  echo "# started $start, $(( $(date +%s) - t0 )) s; machine: $(uname -m), $(nproc) cores shared with other jobs, load: $(uptime | sed 's/.*load average: //')"
  echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), llama.cpp $(basename "$(dirname "$bin")"), llama-cpp-python $("$py" -c 'import llama_cpp; print(llama_cpp.__version__)'), scipy $("$py" -c 'import scipy; print(scipy.__version__)')"
  cat "$here/$name.body"
} > "$here/$name.txt"
rm -f "$here/$name.body"
cat "$here/$name.txt"
tail -3 /tmp/verispec-audit-$name.err
