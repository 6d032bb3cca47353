"""Check lm-eval's loglikelihoods from `verispec serve` against an independent scorer.

    flock /tmp/verispec-heavy.lock /work/main/.venv/bin/python \
        benchmarks/serve/clients/check_lm_eval.py SAMPLES.jsonl [--model DIR] [--out FILE]

lm-eval's local-completions model scores a (context, continuation) pair by sending the
tokens of context + continuation with ``echo: true, logprobs: 1, max_tokens: 1`` and
summing the echoed prompt-token logprobs of the continuation; ``is_greedy`` is whether
every continuation token is the top token. This recomputes both with Hugging Face
transformers (float32, CPU) on the same model's safetensors, tokenised as lm-eval does
(``encode(context + continuation)`` split at ``len(encode(context))``,
lm_eval/api/model.py ``TemplateLM._encode_pair``), and prints the differences.

The server runs llama.cpp on the GGUF file: other kernels and quantised weights (verispec's
SmolLM2 GGUF is 98 MB for 135M parameters), so the sums differ by up to a few tenths of a
nat (0.37 measured); the ranking of the choices (what ``acc`` uses) and ``is_greedy`` are
what must agree.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("samples", type=Path, help="lm-eval --log_samples JSONL")
    ap.add_argument("--model", type=Path,
                    default=Path.home() / ".cache/verispec/hf/smollm2-135m")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows, max_diff, argmax_agree, greedy_agree, n_docs, n_pairs = [], 0.0, 0, 0, 0, 0
    for line in args.samples.read_text().splitlines():
        s = json.loads(line)
        served, local = [], []
        for gen_args, resp in zip(s["arguments"].values(), s["resps"]):
            ctx, cont = gen_args["arg_0"], gen_args["arg_1"]
            whole = tok(ctx + cont, add_special_tokens=False)["input_ids"]
            n_ctx = len(tok(ctx, add_special_tokens=False)["input_ids"])
            with torch.no_grad():
                logits = model(torch.tensor([whole])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            targets = whole[n_ctx:]
            rows_lp = logp[n_ctx - 1:len(whole) - 1]
            ll = float(sum(rows_lp[i, t] for i, t in enumerate(targets)))
            greedy = all(int(rows_lp[i].argmax()) == t for i, t in enumerate(targets))
            srv_ll, srv_greedy = float(resp[0][0]), resp[0][1] == "True"
            served.append(srv_ll)
            local.append(ll)
            max_diff = max(max_diff, abs(ll - srv_ll))
            greedy_agree += greedy == srv_greedy
            n_pairs += 1
            rows.append({"doc_id": s["doc_id"], "continuation": cont, "served_ll": srv_ll,
                         "transformers_ll": ll, "served_is_greedy": srv_greedy,
                         "transformers_is_greedy": greedy})
        argmax_agree += max(range(len(served)), key=served.__getitem__) == max(
            range(len(local)), key=local.__getitem__)
        n_docs += 1
    summary = {"pairs": n_pairs, "docs": n_docs, "max_abs_ll_diff_nats": max_diff,
               "argmax_choice_agrees": f"{argmax_agree}/{n_docs}",
               "is_greedy_agrees": f"{greedy_agree}/{n_pairs}"}
    assert math.isfinite(max_diff)
    print(json.dumps(summary, indent=1))
    for r in rows:
        print(f"doc {r['doc_id']:2d} {r['continuation']!r:18} served {r['served_ll']:9.4f} "
              f"transformers {r['transformers_ll']:9.4f} greedy {r['served_is_greedy']}/"
              f"{r['transformers_is_greedy']}")
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
