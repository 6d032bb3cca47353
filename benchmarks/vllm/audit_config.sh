#!/usr/bin/env bash
# The audit set for one vLLM config: serve it (serve.sh), run today's `verispec audit --endpoint`
# against SmolLM2's exact p (N = $N samples of m = 3 tokens at T = 1), then the raw probes
# (probe.py), and stop the server. Reports go to benchmarks/audit/vllm-cpu-CONFIG.{json,jsonl,txt}
# and benchmarks/vllm/runs/CONFIG/.
#   benchmarks/vllm/audit_config.sh off|ngram|draft     (run it under the heavy-job lock)
set -euo pipefail
config=${1:?usage: audit_config.sh off|ngram|draft|suffix}
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
vs_py=${PYTHON:-$root/.venv/bin/python}; [[ -x "$vs_py" ]] || vs_py=/work/main/.venv/bin/python
N=${N:-300}
PROMPT="Repeat after me: red, green, blue, red, green, blue, red, green"
PROMPT_IDS=48010,990,549,42,2382,28,2654,28,4461,28,2382,28,2654,28,4461,28,2382,28,2654
name=vllm-cpu-$config-t1${PATCH_EXPAND:+-patched}
audit_dir=$root/benchmarks/audit; run_dir=$here/runs/$config${PATCH_EXPAND:+-patched}
mkdir -p "$run_dir"
export PYTHONPATH=$root OMP_NUM_THREADS=1
vpy=${VLLM_VENV:-$HOME/.cache/verispec/vllm-venv}/bin/python
vllm_version=$("$vpy" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))' 2>/dev/null)

job() {   # runs while the server is up
  start=$(date -u +%FT%TZ); t0=$SECONDS
  rm -f "$audit_dir/$name.jsonl"
  timeout 900 "$vs_py" -m verispec.cli audit --endpoint "$VLLM_URL" --model "$VLLM_MODEL" \
    --target smollm2-135m --backend transformers --prompt "$PROMPT" --n-samples "$N" --m 3 \
    --temperature 1 --concurrency 4 --out "$audit_dir/$name.jsonl" --json > "$audit_dir/$name.json" || true
  {
    echo "# verispec audit --endpoint: $name"
    echo "# server: vLLM-CPU (benchmarks/vllm/serve.sh $config): $vllm_version; python -m vllm.entrypoints.openai.api_server --model ~/.cache/verispec/hf/smollm2-135m (verispec's float32 conversion) --dtype float32 --enforce-eager --max-model-len 2048 --seed 0, 127.0.0.1; speculative config: ${VLLM_SPEC:-none}${PATCH_EXPAND:+ (PATCH_EXPAND=1: benchmarks/vllm/patch/sitecustomize.py replaces the CPU expand fallback)}; VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1, LD_PRELOAD tcmalloc + libiomp5"
    echo "# command: verispec audit --endpoint \$VLLM_URL --model $VLLM_MODEL --target smollm2-135m --backend transformers --prompt '$PROMPT' --n-samples $N --m 3 --temperature 1 --concurrency 4 --out benchmarks/audit/$name.jsonl --json"
    echo "# started $start, finished $(date -u +%FT%TZ) ($((SECONDS - t0)) s); machine: $(uname -m), $(nproc --all) cores shared with other jobs, load: $(uptime | sed 's/.*load average: //')"
    echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), python $("$vs_py" -c 'import platform; print(platform.python_version())'), transformers $("$vs_py" -c 'import transformers; print(transformers.__version__)'), scipy $("$vs_py" -c 'import scipy; print(scipy.__version__)')"
    "$vs_py" - "$audit_dir/$name.json" <<'PY'
import json, sys
from rich.console import Console
from verispec.audit.reference import EndpointReport
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    print("(no report: the audit failed; see the server log)"); sys.exit(0)
r = EndpointReport.from_dict(d)
Console(width=170, color_system=None).print(r.table())
i = r.info
print(f"token ids: {i.get('id_source')}; prompt: {i.get('prompt_note', '')}; retries: {i.get('retries')}; "
      f"seed check: {i.get('seed_check')}; wall {i.get('seconds')} s")
PY
  } > "$audit_dir/$name.txt"
  cat "$audit_dir/$name.txt"
  timeout 600 "$vs_py" "$here/probe.py" "$VLLM_URL" "$VLLM_MODEL" "$run_dir" "$PROMPT_IDS" || echo "probe failed"
  cp "/tmp/verispec-vllm-$config.log" "$run_dir/server.log" 2>/dev/null || true
}
export -f job; export name audit_dir run_dir vs_py N PROMPT PROMPT_IDS here root vllm_version config
"$here/serve.sh" "$config" -- bash -c job
