"""verispec vs llama.cpp's own `llama-speculative` example, same pair, prompts and threads.

For each selected Spec-Bench prompt (the same selection as `verispec bench`), in one
interleaved pass:

    plain      verispec's loop with k = 0 on llama-cpp-python (the baseline)
    verispec   verispec, draft model, adaptive k (llama-cpp-python, same process)
    verispec-auto  verispec, model + prompt lookup + plain chosen per round
    llama-speculative --draft-max N   (a subprocess per prompt and N)

The prompt is the chat-templated token sequence the bench uses, turned back into text
(special tokens kept) and checked to re-tokenize to the same ids with llama.cpp's
tokenizer, so both sides see identical tokens. llama-speculative's time is its own
reported prompt time ("encoded ... in S seconds": target and draft prefill) plus its
decode time, i.e. model loading is excluded for it as it is for us. Its speed is
n_predict / (encode + decode); n_predict can overshoot the budget by up to --draft-max
tokens. Greedy (--temp 0) everywhere; identical = llama-speculative's text starts with
plain's text.

Usage (from the repository root, after `make setup` and building the example, see
benchmarks/llamacpp/llama-speculative.md):

    .venv/bin/python benchmarks/llamacpp/llama_speculative.py \
        --binary ~/.cache/verispec/build/llama.cpp-0c1e570/bin/llama-speculative \
        --out benchmarks/llamacpp/llama-speculative
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verispec import registry
from verispec.api import SpeculativeDecoder
from verispec.bench import (RESULTS, TABLE, collect_meta, decoder_for, load_results, loadavg, run_one,
                            write_report)
from verispec.prompts import dataset_path, load_prompts

CATEGORIES = "translation,summarization,qa,math_reasoning,rag,multi-turn,coding"
_ENC = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DEC = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_FIELDS = {name: re.compile(rf"{name}\s*=\s*([\d.]+)") for name in
           ("n_draft", "n_predict", "n_drafted", "n_accept")}


def _norm(text: str) -> str:
    """Generated text for comparison: end-of-turn marker and outer whitespace removed."""
    return text.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip()


def run_llama_speculative(binary: str, target: Path, draft: Path, prompt: str, draft_max: int,
                          max_new_tokens: int, threads: int, n_ctx: int) -> dict:
    """One llama-speculative run; returns its reported counts and seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(prompt)
        prompt_file = f.name
    cmd = [binary, "-m", str(target), "-md", str(draft), "-f", prompt_file,
           "-n", str(max_new_tokens), "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0",
           "--temp", "0", "--seed", "0", "-t", str(threads), "-tb", str(threads),
           "-td", str(threads), "-tbd", str(threads), "-c", str(n_ctx),
           "-b", str(n_ctx), "-ub", "512", "-fa", "off"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    finally:
        os.unlink(prompt_file)
    log = proc.stdout + "\n" + proc.stderr
    enc, dec = _ENC.search(log), _DEC.search(log)
    if proc.returncode != 0 or not enc or not dec:
        raise RuntimeError(f"llama-speculative failed (rc {proc.returncode}): {log[-2000:]}")
    out = {name: float(rx.search(log).group(1)) for name, rx in _FIELDS.items() if rx.search(log)}
    seconds = float(enc.group(2)) + float(dec.group(2))
    n = int(dec.group(1))
    # stdout is the prompt (as pieces) then the generated text
    text = proc.stdout
    marker = "<|im_start|>assistant"
    generated = text[text.rfind(marker) + len(marker):] if marker in text else text
    return {"new_tokens": n, "prefill_seconds": float(enc.group(2)),
            "wall_seconds": seconds, "tokens_per_second": n / seconds,
            "n_drafted": out.get("n_drafted"), "n_accept": out.get("n_accept"),
            "draft_acceptance_rate": (out["n_accept"] / out["n_drafted"]) if out.get("n_drafted") else None,
            "text": generated, "command": " ".join(cmd[:1] + ["..."] + cmd[5:])}


PREAMBLE = """\
**llama.cpp's own speculative decoding, side by side.** `llama-speculative-dN` is the
`llama-speculative` example of llama.cpp commit 0c1e570 (the source vendored in the
llama-cpp-python 0.3.36 sdist, the same llama.cpp our backend runs), built for this CPU
outside the repository (commands in `llama-speculative.md`) and run as a subprocess per
prompt with `--spec-draft-n-max N`, greedy, the same GGUF pair, threads, context and batch
sizes. Its seconds are the times it reports for the prompt (target and draft prefill) and
for decoding, so model loading is excluded as it is for the in-process methods; its token
count is its `n_predict`, which can pass the 128-token budget by up to N tokens. τ for it
is n_predict / (n_predict − n_accept) (one target forward per accepted block). "Identical"
for it means its text starts with plain's text.

"""

DESCRIPTIONS = {
    "plain": "verispec loop on llama-cpp-python, k = 0 (the baseline)",
    "verispec": "draft model, adaptive k (llama-cpp-python, same process)",
    "verispec-auto": "model + prompt lookup + plain chosen per round, adaptive k",
}


def report(out: Path) -> str:
    """Turn the rows into `verispec bench` rows and write table.md, summary.json, speedup.png."""
    rows = load_results(out)   # rows written before the rename carry α̂ as acceptance_rate
    for r in rows:
        r.setdefault("error", None)
        if r["method"].startswith("llama-speculative"):
            r["drafted"], r["accepted"] = r.get("n_drafted"), r.get("n_accept")
            if r.get("n_accept") is not None:
                r["target_forwards"] = max(1, r["new_tokens"] - int(r["n_accept"]))
        elif r.get("tau"):
            r["target_forwards"] = round(r["new_tokens"] / r["tau"])
            r["drafted"] = sum(int(key.rsplit(":", 1)[1]) * n for key, n in (r.get("k_hist") or {}).items())
            r["accepted"] = round((r.get("draft_acceptance_rate") or 0.0) * r["drafted"])
    (out / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = json.loads((out / "meta.json").read_text())
    methods = list(dict.fromkeys(r["method"] for r in rows))
    meta["methods"] = methods
    meta["method_descriptions"] = {
        m: DESCRIPTIONS[m] if m in DESCRIPTIONS
        else f"llama.cpp `llama-speculative --spec-draft-n-max {m.rsplit('-d', 1)[1]}`" for m in methods}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    markdown = write_report(out)
    title, rest = markdown.split("\n", 1)
    markdown = title + "\n\n" + PREAMBLE + rest.lstrip("\n")
    (out / TABLE).write_text(markdown)
    return markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True, help="path of the built llama-speculative")
    ap.add_argument("--out", default="benchmarks/llamacpp/llama-speculative")
    ap.add_argument("--draft-max", default="2,4,8")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--categories", default=CATEGORIES)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", action="store_true", help="only rebuild the table from --out")
    args = ap.parse_args()
    if args.report:
        print(report(Path(args.out)))
        return

    binary = os.path.expanduser(args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"--binary {binary} is not an executable; build it first (see the .md beside this script)")
    draft_max = [int(x) for x in args.draft_max.split(",")]
    target_gguf, draft_gguf = registry.gguf_path("qwen2.5-coder-1.5b"), registry.gguf_path("qwen2.5-coder-0.5b")
    questions = load_prompts(dataset_path(), args.categories.split(","), args.per_category)

    target = SpeculativeDecoder("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", drafter="model",
                                backend="llamacpp")
    decoders = {name: decoder_for(name, target.target, target.draft) for name in DESCRIPTIONS}
    llama = target.target.llama
    n_ctx = target.target.context_length

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = collect_meta(backend="llamacpp", target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
                        max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
                        command="python " + " ".join(sys.argv), threads=args.threads,
                        llama_speculative=binary, draft_max=draft_max, n_ctx=n_ctx)
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    results = (out / "results.jsonl").open("w", encoding="utf-8")

    # warm-up: our decoders (cost-curve calibration) and the page cache for the binary
    warm = min((decoders["plain"].encode(q.text) for q in questions), key=len)
    for name, dec in decoders.items():
        run_one(dec, warm, name, max_new_tokens=8)
    for q in questions:
        ids = decoders["plain"].encode(q.text)
        text = llama.detokenize(ids, special=True).decode("utf-8")
        again = llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        if list(again) != ids:
            raise SystemExit(f"q{q.id}: prompt text does not re-tokenize to the same ids")
        plain_text = None
        for name in (*decoders, *(f"llama-speculative-d{d}" for d in draft_max)):
            row = {"question_id": q.id, "category": q.category, "groups": list(q.groups),
                   "method": name, "prompt_tokens": len(ids), "loadavg": loadavg()}
            if name in decoders:
                r = run_one(decoders[name], ids, name, max_new_tokens=args.max_new_tokens)
                row.update({k: r[k] for k in ("new_tokens", "wall_seconds", "tokens_per_second",
                                              "prefill_seconds", "draft_acceptance_rate", "tau", "text")})
                row["k_hist"] = r["k_hist"]
            else:
                d = int(name.rsplit("d", 1)[1])
                t0 = time.perf_counter()
                row.update(run_llama_speculative(binary, target_gguf, draft_gguf, text, d,
                                                 args.max_new_tokens, args.threads, n_ctx))
                row["process_seconds"] = time.perf_counter() - t0
            if name == "plain":
                plain_text = _norm(row["text"])
            else:
                row["identical_to_plain"] = _norm(row["text"]).startswith(plain_text)
            results.write(json.dumps(row) + "\n")
            results.flush()
            print(f"q{q.id} {q.category:15s} {name:24s} {row['new_tokens']:4d} tok "
                  f"{row['tokens_per_second']:6.2f} tok/s", flush=True)
    results.close()
    print(report(out))


if __name__ == "__main__":
    main()
