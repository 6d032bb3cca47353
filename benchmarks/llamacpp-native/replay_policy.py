"""Replay the adaptive policy on a bench run's plain outputs, on a simulated clock.

Under greedy decoding a verification accepts a draft exactly as far as it equals the
plain output, so the whole decode loop (`verispec.decoding.decode`, the real drafters,
the real `AdaptivePolicy`) can be run again offline on a *replay target*: a fake
`CausalLM` whose next-token logits are the point mass on the recorded plain output
while the context follows it (and on an id the output never uses when it does not).
Its forwards cost no compute: each advances a simulated clock by the seconds the
measured cost curve gives (T_t(n) at that context length, `--curve`, made by
`measure_curve.py`), and everything else (drafters, policy, the loop) is timed for
real. A stand-in draft model (for `auto`'s model drafter) proposes the plain output's
next token with probability `--draft-alpha` per position (a seeded coin per position)
at the measured T_d; its catch-up costs the curve's draft prefill seconds per token.

With `--noise`, every forward's seconds carry a random jitter the policy sees (its
clock and its cost estimates), while each method is scored on the noiseless cost of the
decisions it took: the table then says how much the policy's choices lose to a noisy
machine, with the same plain baseline in every run.

What it is for: comparing policy decisions (which drafter, which k, how often) across
methods and policy settings in seconds instead of a 25-minute benchmark, on the very
prompts and outputs of a committed table. What it is not: a speed measurement. The
figures are only as good as the cost curve; a policy change found here is kept only
if the real benchmark (`benchmarks/llamacpp/native_bench.py`) confirms it.

    PYTHONPATH=. .venv/bin/python benchmarks/llamacpp-native/replay_policy.py \
        --results benchmarks/llamacpp-native/bench-2/results.jsonl \
        --curve benchmarks/llamacpp-native/curve.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import random
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoTokenizer

from verispec import registry
from verispec.decoding import decode
from verispec.drafters import LookupDrafter, ModelDrafter, SuffixDrafter
from verispec.encoding import encode
from verispec.models.base import CausalLM
from verispec.policy import AdaptivePolicy, make_policy
from verispec.prompts import dataset_path, load_prompts
from verispec.sampling import SamplingConfig, SeededRandomness


class SimClock:
    """Seconds: real time, minus the real time spent in replay forwards, plus their
    simulated seconds."""

    def __init__(self) -> None:
        self.simulated = 0.0          # the forwards' seconds, jitter included (what the policy sees)
        self.expected = 0.0           # the same without the jitter (what the decisions cost)
        self.real_in_forwards = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.real_in_forwards + self.simulated

    def noiseless(self) -> float:
        """The clock as if no forward had jitter: how a method's decisions are scored."""
        return time.perf_counter() - self.real_in_forwards + self.expected


class Curve:
    """T(n, context) from a measured curve: seconds of an n-token decode forward after
    `context` tokens, linear in context between the measured prefixes; a prefill (keep 1,
    more than 7 tokens) costs `prefill` seconds per token. `noise`: each forward's seconds
    times exp(N(0, noise)) (a shared machine's jitter), seeded by `seed`."""

    def __init__(self, by_prefix: dict[int, list[float]], prefill: float, noise: float = 0.0,
                 seed: int = 0) -> None:
        self.points = sorted((int(c), list(t)) for c, t in by_prefix.items())
        self.prefill, self.noise, self.rng = prefill, noise, random.Random(seed)

    def __call__(self, n: int, context: int, keep: int) -> float:
        seconds = self.last_mean = self.mean(n, context, keep)
        return seconds * math.exp(self.rng.gauss(0.0, self.noise)) if self.noise else seconds

    def mean(self, n: int, context: int, keep: int) -> float:
        if keep <= 1 and n > 7:
            return n * self.prefill
        (c0, t0), (c1, t1) = self.points[0], self.points[-1]
        w = min(1.0, max(0.0, (context - c0) / max(1, c1 - c0)))
        width = min(n, len(t0))
        base = (1 - w) * t0[width - 1] + w * t1[width - 1]
        if n > len(t0):    # beyond the measured widths: the last step's slope
            step = (1 - w) * (t0[-1] - t0[-2]) + w * (t1[-1] - t1[-2])
            base += (n - len(t0)) * step
        return base


class ReplayLM(CausalLM):
    """A model whose next token after a prefix of `path` is the path's next token.

    Id vocab_size - 1 (not in the path) is what it predicts off the path. `hit(position)`
    decides whether it predicts the path at all there (the draft stand-in misses some)."""

    def __init__(self, path: list[int], vocab_size: int, cost, clock: SimClock, *, eos: frozenset[int],
                 hit=lambda position: True, name: str = "replay") -> None:
        super().__init__()
        self.path, self.vocab_size, self.cost, self.clock = path, vocab_size, cost, clock
        self.context_length, self.eos_token_ids, self.hit, self.name = 1 << 20, eos, hit, name

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        context = self.tokens + tokens
        logits = torch.zeros(keep, self.vocab_size)
        on = 0    # how far the context follows the path
        while on < len(context) and on < len(self.path) and context[on] == self.path[on]:
            on += 1
        for row, position in enumerate(range(len(context) - keep, len(context))):
            follows = position < on and position + 1 < len(self.path) and self.hit(position)
            logits[row, self.path[position + 1] if follows else self.vocab_size - 1] = 1.0
        return logits

    def forward(self, tokens, keep=None):
        start, before = time.perf_counter(), self.forward_seconds
        n = len(tokens)
        logits = super().forward(tokens, keep)
        simulated = self.cost(n, len(self.tokens) - n, logits.shape[0])
        self.forward_seconds = before + simulated
        self.clock.real_in_forwards += time.perf_counter() - start
        self.clock.simulated += simulated
        self.clock.expected += self.cost.last_mean
        return logits

    def _truncate(self, length: int) -> None:
        pass


def methods() -> dict[str, callable]:
    """Method name -> drafters factory (as bench's rows)."""
    return {"verispec-suffix": lambda d: {"suffix": SuffixDrafter()},
            "verispec-lookup": lambda d: {"lookup": LookupDrafter()},
            "verispec-auto": lambda d: {"model": ModelDrafter(d), "suffix": SuffixDrafter()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="a bench results.jsonl with `plain` rows")
    ap.add_argument("--curve", required=True, help="measured curve (measure_curve.py output)")
    ap.add_argument("--categories", default=None, help="comma-separated (default: all in the file)")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--draft-alpha", type=float, default=0.7)
    ap.add_argument("--methods", default="verispec-suffix,verispec-lookup,verispec-auto")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an AdaptivePolicy option (e.g. probe_alpha=0.8), repeatable")
    ap.add_argument("--noise", type=float, default=0.0, help="per-forward jitter, sd of log seconds")
    ap.add_argument("--seed", type=int, default=0, help="seed of the jitter")
    ap.add_argument("--no-goodput", action="store_true", help="policy without the goodput correction")
    ap.add_argument("--verbose", action="store_true", help="per prompt rows")
    args = ap.parse_args()
    curve_data = json.loads(Path(args.curve).read_text())
    target_curve = Curve(curve_data["target"], curve_data["target_prefill"], args.noise, args.seed)
    draft_curve = Curve(curve_data["draft"], curve_data["draft_prefill"], args.noise, args.seed + 1)
    options = {}
    known = set(inspect.signature(AdaptivePolicy).parameters) - {"drafters", "k_max", "clock"}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in known:
            ap.error(f"--set {item!r}: NAME must be an AdaptivePolicy option, one of {sorted(known)}")
        try:
            number = float(value)
        except ValueError:
            ap.error(f"--set {item!r}: VALUE must be a number")
        options[name] = int(number) if number.is_integer() and "." not in value else number

    tok = AutoTokenizer.from_pretrained(registry.resolve(args.target, weights=False).hf_path)
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines()]
    wanted = set(args.categories.split(",")) if args.categories else {r["category"] for r in rows}
    questions = {q.id: q for q in load_prompts(dataset_path(args.dataset), sorted(wanted), 10**6)}
    plain = [r for r in rows if r["method"] == "plain" and r["turn"] == 1 and r["question_id"] in questions]
    chosen = {m: f for m, f in methods().items() if m in args.methods.split(",")}
    eos_ids = sorted(tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))

    clock = SimClock()
    policies, totals = {}, defaultdict(lambda: defaultdict(float))
    for r in plain:
        q = questions[r["question_id"]]
        prompt, out = encode(tok, q.text, len(tok)), list(r["token_ids"])
        vocab = max(len(tok), max(prompt + out) + 2)   # the target's vocabulary: warps cost what they cost
        path = prompt + out
        eos = frozenset(eos_ids)
        coin = random.Random(q.id)
        hits = [coin.random() < args.draft_alpha for _ in path]
        for method, factory in [("plain", None), *chosen.items()]:
            target = ReplayLM(path, vocab, target_curve, clock, eos=eos)
            draft = ReplayLM(path, vocab, draft_curve, clock, eos=eos, hit=hits.__getitem__, name="draft")
            if factory is None:
                policy = make_policy(0, {})
            else:
                if method not in policies:
                    policies[method] = make_policy("auto", factory(draft), k_max=args.k_max,
                                                   clock=None if args.no_goodput else clock,
                                                   **options)
                policy = policies[method]
                for d in policy.drafters.values():   # this prompt's models
                    if isinstance(d, ModelDrafter):
                        d.model = draft
                    d.reset()
                if not policy.calibrated:
                    policy.calibrate(target, prompt, clock=clock)
                    target.reset()   # every method starts from an empty cache (bench does too)
                policy.start(len(out))
            t0 = clock.noiseless()
            res = decode(target, prompt, policy, sampling=SamplingConfig(),
                         max_new_tokens=len(out), rng=SeededRandomness(0))
            seconds = clock.noiseless() - t0
            assert res.tokens == path[len(prompt):], f"{method} q{q.id}: replay left the plain output"
            st = res.stats
            by = {k: (v["rounds"], v["drafted"], v["accepted"]) for k, v in st.as_dict()["by_drafter"].items()}
            key = (q.category, method)
            totals[key]["seconds"] += seconds
            totals[key]["tokens"] += len(out)
            totals[key]["forwards"] += st.target_forwards
            if args.verbose:
                print(f"{q.category[:12]:12s} q{q.id:<6d} {method:16s} {seconds:7.2f}s  "
                      f"fwd {st.target_forwards:4d}  {by}")
    cats = sorted({c for c, _ in totals}) + ["overall"]
    names = ["plain", *chosen]
    for key in list(totals):
        for field in ("seconds", "tokens", "forwards"):
            totals[("overall", key[1])][field] += totals[key][field] if key[0] != "overall" else 0
    print("method".ljust(18) + "".join(c[:11].rjust(12) for c in cats))
    for m in names:
        cells = []
        for c in cats:
            t, p = totals[(c, m)], totals[(c, "plain")]
            cells.append(f"{p['seconds'] / t['seconds']:.2f} ({t['tokens'] / t['forwards']:.2f})")
        print(m.ljust(18) + "".join(x.rjust(12) for x in cells))


if __name__ == "__main__":
    main()
