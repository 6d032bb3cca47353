#!/usr/bin/env bash
# A token-level endpoint audit of `verispec serve` (SmolLM2-135M, self-draft of its first 10
# layers, k auto = the coupled rule; SERVE=... and REF_BACKEND=... for another server and
# reference backend), committed as NAME.txt (header + the 80-column report) and
# NAME/ (report.md, audit.json, PNGs). Run it under the heavy lock:
#   flock /tmp/verispec-heavy.lock benchmarks/audit/run_tokens_serve.sh NAME -- audit options...
set -euo pipefail
name=$1; shift 2
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
py=${PYTHON:-/work/main/.venv/bin/python}
port=${PORT:-8311}
start=$(date -u +%FT%TZ)
serve="${SERVE:-verispec serve --target smollm2-135m --draft self --draft-layers 10 --backend transformers --drafter model} --port $port"
PYTHONPATH=$root nice -n 5 "$py" -m verispec.cli ${serve#verispec } > /tmp/verispec-audit-serve-$port.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
audit="verispec audit --endpoint http://127.0.0.1:$port/v1 --target smollm2-135m --backend ${REF_BACKEND:-transformers} $*"
t0=$(date +%s)
PYTHONPATH=$root nice -n 10 "$py" -m verispec.cli ${audit#verispec } --report "$here/$name" > "$here/$name.body" 2> /tmp/verispec-audit-$name.err || true
{
  echo "# verispec audit --endpoint (token level): $name"
  echo "# server: $serve"
  echo "# command: $audit --report benchmarks/audit/$name"
  echo "# started $start, $(( $(date +%s) - t0 )) s; machine: $(uname -m), $(nproc) cores shared with other jobs, load: $(uptime | sed 's/.*load average: //')"
  echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), python $("$py" -c 'import platform; print(platform.python_version())'), torch $("$py" -c 'import torch; print(torch.__version__)'), transformers $("$py" -c 'import transformers; print(transformers.__version__)'), scipy $("$py" -c 'import scipy; print(scipy.__version__)')"
  cat "$here/$name.body"
} > "$here/$name.txt"
rm -f "$here/$name.body"
cat "$here/$name.txt"
tail -3 /tmp/verispec-audit-$name.err
