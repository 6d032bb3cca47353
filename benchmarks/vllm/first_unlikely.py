"""The shortest sampled request whose output has a token the target almost never draws.

    python benchmarks/vllm/first_unlikely.py RUNS_GLOB [THRESHOLD]

For every completion of audit_tokens.sh's raw samples (e.g. runs/tokens-suffix/t0.8.p*.jsonl,
spec-on arm; each line has token_ids, seed and the request's settings), the exact p of
SmolLM2 (transformers, float32, warped with the request's temperature / top-k / top-p) is
evaluated along the completion, and the first token with p(x) < THRESHOLD (default 1e-6) is
found. Prints the shortest such request (prompt ids, seed, T, max_tokens = its position) and
how many completions hold such a token. Under an exact server the chance at one position is the
p-mass of the tokens below the threshold (at most V × THRESHOLD, ~0.05 for SmolLM2's 49,152
tokens at 1e-6, usually far less), so run it on the spec-off arm too (t0.8.reference.p*.jsonl)
as the control. A reduction aid for benchmarks/audit/vllm-cpu.md, not a test.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

from verispec.api import load_model
from verispec.audit.reference import target_next_probs
from verispec.sampling import SamplingConfig


def main(pattern: str, threshold: float = 1e-6) -> None:
    model = load_model("smollm2-135m", backend="transformers")
    best, hits, tokens = None, 0, 0
    for path in sorted(glob.glob(pattern)):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for r in rows:
            s = r["settings"]
            cfg = SamplingConfig(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
            probs = target_next_probs(model, list(s["prompt"]), cfg)
            ids = r["token_ids"] or []
            for t, x in enumerate(ids):
                tokens += 1
                p = float(probs(tuple(ids[:t]))[x])
                if p < threshold:
                    hits += 1
                    if best is None or t + 1 < best["max_tokens"]:
                        best = {"file": path.rsplit("/", 1)[-1], "prompt_ids": s["prompt"], "seed": r["seed"],
                                "temperature": s["temperature"], "max_tokens": t + 1,
                                "token_ids": ids[:t + 1], "token": x, "p": p}
                    break   # the first per completion
    print(f"{pattern}: {tokens} tokens scored up to each completion's first p < {threshold:g}; "
          f"{hits} completions contain such a token")
    print(f"shortest: {json.dumps(best)}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-6)
