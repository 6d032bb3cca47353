"""False-alarm rate of the whole token-level verdict on the exact zoo server (a benchmark, not a test).

Runs the same audit as ``tests/test_audit_zoo.py`` (2 prompts × N = 60 × m = 48 at T = 0.7,
significance 0.01, tolerance 0.05, all probes) R times against the exact zoo server, each
run with its own seeds (disjoint seed ranges), and reports how often the verdict is FAIL
(a false alarm: the server is exact), pass and inconclusive, with a Clopper–Pearson 95 %
interval for the FAIL rate, plus the same for the faulty servers' detection (optional).

    python benchmarks/audit/zoo_false_alarms.py --runs 60 > benchmarks/audit/zoo-false-alarms.txt
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scipy.stats import binomtest  # noqa: E402

from verispec import __version__  # noqa: E402
from verispec.audit.endpoint import Endpoint  # noqa: E402
from verispec.audit.tokens import run_token_audit  # noqa: E402
from verispec.audit.zoo import FAULTS, detokenize, zoo_app, zoo_reference  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.serve import BackgroundServer  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6]]
PROBES = ("cold-warm", "shared-prefix", "concurrency", "context-limit", "stream", "controls", "logprobs")


def run(fault: str, runs: int, n: int, m: int, significance: float, tolerance: float, probes) -> tuple:
    verdicts, tokens, seconds = Counter(), 0, 0.0
    with BackgroundServer(zoo_app(fault)) as url:
        for r in range(runs):
            ep = Endpoint(url + "/v1", "zoo")
            t0 = time.perf_counter()
            a = run_token_audit(ep, zoo_reference(), PROMPTS, n, m, SamplingConfig(temperature=0.7),
                                significance=significance, tolerance=tolerance, probes=probes,
                                detokenize=detokenize, seed=10_000_000 * (r + 1))
            seconds += time.perf_counter() - t0
            ep.close()
            verdicts[a.verdict] += 1
            tokens = a.tokens
            if a.verdict == "FAIL" and fault == "exact":
                print(f"  run {r}: FAIL: {a.reasons}", file=sys.stderr)
    return verdicts, tokens, seconds / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--faulty-runs", type=int, default=0, help="runs per faulty server (0: skip)")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--m", type=int, default=48)
    ap.add_argument("--significance", type=float, default=0.01)
    ap.add_argument("--tolerance", type=float, default=0.05)
    a = ap.parse_args()
    print(f"# zoo false alarms: python benchmarks/audit/zoo_false_alarms.py --runs {a.runs} "
          f"--faulty-runs {a.faulty_runs} --n {a.n} --m {a.m}")
    print(f"# verispec {__version__}, python {platform.python_version()}, {platform.machine()} "
          f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# audit: {len(PROMPTS)} prompts × N = {a.n} × m = {a.m} at T = 0.7, significance "
          f"{a.significance} (whole verdict), tolerance {a.tolerance}, probes {','.join(PROBES)}")
    v, tokens, sec = run("exact", a.runs, a.n, a.m, a.significance, a.tolerance, PROBES)
    fails = v["FAIL"]
    ci = binomtest(fails, a.runs).proportion_ci(0.95, method="exact")
    print(f"exact server: {a.runs} runs: {dict(v)}; tokens per run {tokens}; {sec:.1f} s per run")
    print(f"false-alarm (FAIL) rate {fails}/{a.runs} = {fails / a.runs:.3f}, Clopper-Pearson 95 % "
          f"[{ci.low:.3f}, {ci.high:.3f}] (stated level {a.significance})")
    for fault in sorted(FAULTS) if a.faulty_runs else ():
        v, tokens, sec = run(fault, a.faulty_runs, a.n, a.m, a.significance, a.tolerance, PROBES)
        print(f"{fault:<20} FAIL {v['FAIL']}/{a.faulty_runs}  ({dict(v)}, {sec:.1f} s per run)")


if __name__ == "__main__":
    main()
