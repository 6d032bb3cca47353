#!/usr/bin/env bash
# One endpoint audit, committed as NAME.json (the --json report) and NAME.txt (header + table).
# usage: benchmarks/audit/run_endpoint.sh NAME "server description" -- verispec audit options...
set -euo pipefail
name=$1; server=$2; shift 3
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
py=${PYTHON:-/work/main/.venv/bin/python}
start=$(date -u +%FT%TZ)
PYTHONPATH=$root nice -n 10 "$py" -m verispec.cli audit "$@" --out "$here/$name.jsonl" --json > "$here/$name.json"
{
  echo "# verispec audit --endpoint: $name"
  echo "# server: $server"
  echo "# command: verispec audit $*  --out benchmarks/audit/$name.jsonl --json"
  echo "# started $start, finished $(date -u +%FT%TZ); machine: $(uname -m), $(nproc) cores shared with other jobs, load: $(uptime | sed 's/.*load average: //')"
  echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), python $("$py" -c 'import platform; print(platform.python_version())'), llama-cpp-python $("$py" -c 'import llama_cpp; print(llama_cpp.__version__)'), scipy $("$py" -c 'import scipy; print(scipy.__version__)')"
  PYTHONPATH=$root "$py" - "$here/$name.json" <<'PY'
import json, sys
from rich.console import Console
from verispec.audit.reference import EndpointReport
d = json.load(open(sys.argv[1]))
r = EndpointReport.from_dict(d)
c = Console(width=170, color_system=None)
c.print(r.table())
i = r.info
print(f"token ids: {i.get('id_source')}; prompt: {i.get('prompt_note', '')}; retries: {i.get('retries')}; "
      f"seed check: {i.get('seed_check')}; numerics floor from {i.get('numerics_kernels')} along {i.get('numerics_path')}; "
      f"wall {i.get('seconds')} s")
PY
} > "$here/$name.txt"
cat "$here/$name.txt"
