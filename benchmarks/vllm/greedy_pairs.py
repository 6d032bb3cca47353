"""Greedy spec-on vs spec-off, token for token, from a token-level audit's raw samples.

    python benchmarks/vllm/greedy_pairs.py STEM

STEM is the audit's ``--out`` without ``.jsonl``: the audited arm's samples are
``STEM.pJ.jsonl`` and the reference endpoint's ``STEM.reference.pJ.jsonl`` (J = prompt).
At T = 0 both servers must return the same ids (speculation is lossless; the two runs
differ only in the draft/verify kernels' batch shapes, so a divergence at a near-tie is
numerics, which the audit's own greedy check classifies against the local reference).
Prints one line per prompt: completions identical, the first differing position and
both tokens, then the total. No server and no model needed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rows(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row["i"]), row["token_ids"])
    return out


def main(stem: str) -> int:
    base = Path(stem)
    files = sorted(base.parent.glob(base.name + ".p[0-9]*.jsonl"), key=lambda p: int(p.suffixes[-2][2:]))
    if not files:
        print(f"greedy_pairs: no {stem}.pJ.jsonl files", file=sys.stderr)
        return 2
    same = total = tokens = agree = 0
    for f in files:
        j = f.suffixes[-2][1:]
        ref_path = base.parent / f"{base.name}.reference.{j}.jsonl"
        if not ref_path.exists():
            print(f"{j}: no reference arm ({ref_path.name})")
            continue
        on, off = _rows(f), _rows(ref_path)
        for i in sorted(set(on) & set(off)):
            a, b = on[i], off[i]
            total += 1
            n = min(len(a), len(b))
            first = next((t for t in range(n) if a[t] != b[t]), None)
            agree += first if first is not None else n
            tokens += max(len(a), len(b))
            if a == b:
                same += 1
                print(f"{j} #{i}: identical ({len(a)} tokens)")
            elif first is None:
                print(f"{j} #{i}: one is a prefix of the other ({len(a)} vs {len(b)} tokens)")
            else:
                print(f"{j} #{i}: first difference at position {first + 1}: spec-on {a[first]}, spec-off {b[first]}")
    print(f"total: {same}/{total} completions identical; {agree}/{tokens} tokens agree before the first difference")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
