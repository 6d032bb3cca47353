"""The sampled token-level verdict recomputed from an audit's raw samples, without the servers.

    python benchmarks/vllm/verdict_offline.py STEM PROMPTS T [TOL]

STEM is the audit's ``--out`` without ``.jsonl`` (spec-on samples ``STEM.pJ.jsonl``,
spec-off ``STEM.reference.pJ.jsonl``), PROMPTS the prompt file it used (one per line), T its
temperature. Every completion found is scored by SmolLM2 (teacher forcing, as
`verispec.audit.tokens.run_token_audit` does) and the same statistics decide: the two-sample
spec-on vs spec-off tests at significance 0.01 (Holm over 2), the exact-p comparison beside.
For a session whose server time ran out before one arm was complete: the arms may hold
different numbers of completions per prompt (the permutation test is stratified by prompt
and weights each stratum by n_on n_off / (n_on + n_off)). No probes, no seed check (they
need the servers). Run it under the shared quiet lock.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from verispec.audit.endpoint import Sample
from verispec.audit.render import text
from verispec.audit.scoring import stack
from verispec.audit.tokens import TokenAudit, score_samples
from verispec.audit.tokenstats import per_position, token_effects
from verispec.audit.twosample import two_sample_effects
from verispec.audit.verdict import decide, impossible_tokens
from verispec.cli.audit_endpoint import load_reference
from verispec.prompts import load_prompts
from verispec.sampling import SamplingConfig

SIGNIFICANCE = 0.01


def _read(path: Path) -> list[Sample]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows.setdefault(int(r["i"]), Sample(r["token_ids"], r.get("text", ""), r["source"],
                                                r.get("finish_reason"), r.get("seed")))
    return [rows[i] for i in sorted(rows)]


def main(stem: str, prompts_file: str, temperature: float, tolerance: float = 0.02) -> None:
    base = Path(stem)
    ref = load_reference("smollm2-135m", "transformers", None, "as the scorer")
    prompts = [list(ref.tokenizer.encode(r.text)) for r in load_prompts(prompts_file, per_category=0)]
    # the prompts the audit drew (an audit with --per-category 2 used the first 2 of a text file)
    prompts = [p for j, p in enumerate(prompts) if (base.parent / f"{base.name}.p{j}.jsonl").exists()]
    on = {j: _read(base.parent / f"{base.name}.p{j}.jsonl") for j in range(len(prompts))}
    off = {j: _read(base.parent / f"{base.name}.reference.p{j}.jsonl") for j in range(len(prompts))}
    sampling = SamplingConfig(temperature=temperature)
    scores = score_samples(ref, prompts, on, sampling, seed=0)
    ref_scores = score_samples(ref, prompts, off, sampling, seed=1)
    tok = stack(scores)
    two = two_sample_effects(scores, ref_scores, SIGNIFICANCE / 2, seed=0)
    local = token_effects(tok, SIGNIFICANCE / 2)     # as the CLI: the family is the 2 two-sample tests
    bad, near, examples = impossible_tokens(tok)
    v = decide(two, SIGNIFICANCE, tolerance, impossible=bad, impossible_examples=examples)
    counts = {j: (len(on[j]), len(off[j])) for j in on}
    audit = TokenAudit(f"{stem}.pJ.jsonl (spec-on)", f"{stem}.reference.pJ.jsonl (spec-off)", len(prompts),
                       max(len(s) for s in on.values()), max(len(s.token_ids) for ss in on.values() for s in ss),
                       len(tok["tokens"]), {"temperature": temperature, "top_k": 0, "top_p": 1.0, "controls": []},
                       SIGNIFICANCE, tolerance, two, local, per_position(tok, SIGNIFICANCE), bad, near, [], [],
                       v.verdict, v.reasons, v.tokens_needed, v.error_rate,
                       info={"completions per prompt (on, off)": counts,
                             "reference tokens": len(stack(ref_scores)["tokens"])})
    print(f"completions per prompt (spec-on, spec-off): {counts}; spec-off tokens: "
          f"{audit.info['reference tokens']:,}")
    print(text(audit))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), *(float(a) for a in sys.argv[4:5]))
