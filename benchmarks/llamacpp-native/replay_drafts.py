"""Greedy replay of the n-gram drafters on a bench run's plain outputs: draft quality without the policy.

Under greedy decoding a point-mass draft is accepted exactly as far as it equals the
plain output, so a drafter's proposals can be scored offline, with no model: for every
first-turn `plain` row of RESULTS (a `bench` results.jsonl), the prompt is encoded as
`bench` encodes it (the target's chat template), and at each round the drafter drafts
min(k_max, what it offers) tokens after prompt + the output so far; the round commits the
matching prefix plus one token. Printed per prompt and drafter: rounds in which it had a
proposal, tokens drafted, tokens accepted, tokens per such round. This always drafts, so
it measures what a drafter could give; how much of it the adaptive policy takes is what
the bench rows show.

    PYTHONPATH=. .venv/bin/python benchmarks/llamacpp-native/replay_drafts.py \
        --results benchmarks/llamacpp-native/bench-stock/results.jsonl --categories summarization,rag
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from verispec import registry
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.suffix import SuffixDrafter
from verispec.encoding import encode
from verispec.prompts import dataset_path, load_prompts


def replay(drafter, prompt: list[int], out: list[int], k_max: int) -> tuple[int, int, int]:
    """(rounds with a proposal, drafted, accepted) of `drafter` always drafting along `out`."""
    pos = rounds = drafted = accepted = 0
    while pos < len(out) - 1:
        ctx = prompt + out[:pos]
        n = min(k_max, drafter.available(ctx), len(out) - pos - 1)
        if n <= 0:
            pos += 1
            continue
        x = drafter.forecast(ctx)[0][:n]
        a = 0
        while a < len(x) and x[a] == out[pos + a]:
            a += 1
        rounds, drafted, accepted, pos = rounds + 1, drafted + len(x), accepted + a, pos + a + 1
    return rounds, drafted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--categories", required=True)
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--k-max", type=int, default=8)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(registry.resolve(args.target, weights=False).hf_path)
    questions = {q.id: q for q in load_prompts(dataset_path(args.dataset), args.categories.split(","), 10**6)}
    for line in Path(args.results).read_text().splitlines():
        r = json.loads(line)
        if r["method"] != "plain" or r["turn"] != 1 or r["question_id"] not in questions:
            continue
        q = questions[r["question_id"]]
        prompt = encode(tok, q.text, len(tok))
        for d in (LookupDrafter(), SuffixDrafter()):
            rounds, drafted, accepted = replay(d, prompt, r["token_ids"], args.k_max)
            print(f"{q.category:15s} q{q.id} {d.name:7s} rounds {rounds:3d}  drafted {drafted:4d}  "
                  f"accepted {accepted:4d}  tokens/round {(accepted + rounds) / max(rounds, 1):.2f}")


if __name__ == "__main__":
    main()
