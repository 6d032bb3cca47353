"""Fit llama.cpp's per-stack cost model to published cost curves; check it on the other half.

Data: ``benchmarks/plan/consumer.csv``, one row per published measurement with its URL and
the table line it came from (llama-bench tables in llama.cpp pull requests for RTX cards,
Apple silicon and a Ryzen CPU, and two ``llama-speculative`` runs with their baselines).
``split`` says which rows fit the stacks and which check them; the split is by table, so no
validation row shares a table with a fit row.

Fit: for each stack (``llamacpp-cuda``, ``llamacpp-metal``, ``llamacpp-cpu``) the free
parameters of :class:`verispec.plan.roofline.Stack` - the fraction of bandwidth reached, the
fraction of peak FLOP/s of the mat-vec kernels (<= 8 rows: llama.cpp's MMVQ / mul_mv_ext
limit) and of the GEMM kernels above, a fixed cost per forward - minimise the squared log
error of every absolute time in the fit rows (T(1) and T(n)) with scipy's least_squares.
Memory and arithmetic add (overlap 0), as the data's near-linear T(n) says. The scatter
that remains (σ of log T(n)/T(1), σ of log T(1), with a degrees-of-freedom correction) is
stored with the stack: :mod:`verispec.plan.intervals` draws the prediction intervals from it.

Validation: the other rows, predicted with the fitted stacks: T(n)/T(1) for cost rows, and
for the speculative runs S = τ · T(1) / (k · T_d + T(k + 1)) with their measured τ and k.
Reported: median relative error, the share inside the 80 % interval, predictions on the
wrong side of 1.0x (speedups), and the same rows under the planner before this model (the
``compiled`` stack every GPU used).

Usage (pure computation, seconds):
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan/fit_consumer.py
writes verispec/plan/stacks.json, benchmarks/plan/consumer.md and consumer.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from verispec.plan import Stack, forward_time, get_stack, load_shape, parse_hardware
from verispec.plan.intervals import ratio_interval, speedup_interval

HERE = Path(__file__).resolve().parent
STACKS_JSON = HERE.parents[1] / "verispec" / "plan" / "stacks.json"
SMALL_BATCH_ROWS = 8        # llama.cpp: MMVQ_MAX_BATCH_SIZE (CUDA) and mul_mv_ext's ne11 <= 8 (Metal)
LEVEL = 0.8
# (name, low, high, start) of each stack's free parameters
PARAMS = {
    "llamacpp-cuda": [("bandwidth_efficiency", 0.2, 1.0, 0.8), ("small_batch_compute_efficiency", 0.01, 1.5, 0.2),
                      ("compute_efficiency", 0.01, 1.5, 0.3), ("per_forward_s", 0.0, 0.01, 2e-4)],
    "llamacpp-metal": [("bandwidth_efficiency", 0.2, 1.0, 0.7), ("small_batch_compute_efficiency", 0.01, 1.5, 0.2),
                       ("per_forward_s", 0.0, 0.01, 2e-4)],
    "llamacpp-cpu": [("bandwidth_efficiency", 0.2, 1.0, 0.6), ("compute_efficiency", 0.01, 1.5, 0.5)],
}
SOURCES = {
    "llamacpp-cuda": "fit to benchmarks/plan/consumer.csv rows A (llama.cpp PR #15802) and C (PR #17505): RTX 3090",
    "llamacpp-metal": "fit to benchmarks/plan/consumer.csv rows D (llama.cpp PR #10581, M2 Ultra) and F1, F3 "
                      "(PR #10491, M1 Pro); GEMM regime above 8 rows not in the data: its efficiency is the mat-vec one",
    "llamacpp-cpu": "fit to benchmarks/plan/consumer.csv rows G (ik_llama.cpp PR #54, mainline column, Ryzen 9 7950X)",
}


def load(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def stack_from(name: str, params: list[tuple], x) -> Stack:
    base = Stack(name, overlap=0.0, small_batch_rows=SMALL_BATCH_ROWS if name != "llamacpp-cpu" else 0)
    fields = {p[0]: float(v) for p, v in zip(params, x)}
    if "compute_efficiency" not in fields:
        fields["compute_efficiency"] = fields["small_batch_compute_efficiency"]
    return replace(base, **fields)


def points(rows: list[dict]) -> list[tuple]:
    """(shape, hardware, context, n, seconds) for every absolute time in ``rows`` (T(1) once per table)."""
    out, seen = [], set()
    for r in rows:
        shape = load_shape(r["target"], dtype=r["target_dtype"])
        hw = parse_hardware(r["hardware"])
        ctx = int(r["context"])
        table = r["id"].split("-")[0]
        if r["t1_ms"] and table not in seen:
            seen.add(table)
            out.append((shape, hw, ctx, 1, float(r["t1_ms"]) / 1e3))
        out.append((shape, hw, ctx, int(r["n"]), float(r["tn_ms"]) / 1e3))
    return out


def predict_ratio(stack: Stack, r: dict) -> float:
    shape, hw, ctx = load_shape(r["target"], dtype=r["target_dtype"]), parse_hardware(r["hardware"]), int(r["context"])
    n = int(r["n"])
    return forward_time(shape, hw, stack, n, ctx).total_s / forward_time(shape, hw, stack, 1, ctx).total_s


def fit(name: str, rows: list[dict]) -> tuple[Stack, dict]:
    params = PARAMS[name]
    pts = points(rows)
    logs = np.log([p[4] for p in pts])

    def residuals(x):
        st = stack_from(name, params, x)
        return np.log([forward_time(s, h, st, n, c).total_s for s, h, c, n, _ in pts]) - logs

    res = least_squares(residuals, [p[3] for p in params], bounds=([p[1] for p in params], [p[2] for p in params]),
                        x_scale=[max(p[3], 1e-4) for p in params], method="trf")
    stack = stack_from(name, params, res.x)
    ratio_res = [math.log(predict_ratio(stack, r) / float(r["measured"])) for r in rows if r["measured"]]
    t1_res = [res.fun[i] for i, p in enumerate(pts) if p[3] == 1]
    return stack, {"params": {p[0]: float(v) for p, v in zip(params, res.x)}, "points": len(pts),
                   "rms_log_time": float(np.sqrt(np.mean(res.fun ** 2))), "ratio_residuals": ratio_res,
                   "t1_residuals": [float(v) for v in t1_res]}


def dof_sigma(residuals: list[float], n_params: int) -> float:
    n = len(residuals)
    return math.sqrt(sum(v * v for v in residuals) / max(n - n_params, 1)) if n else 0.0


def speedup_prediction(stack: Stack, r: dict) -> tuple[float, tuple[float, float], float]:
    """(S, 80 % interval, S under the old default 'compiled' stack) of a speculative row."""
    hw = parse_hardware(r["hardware"])
    k, tau = round(float(r["k"])), float(r["tau"])
    out = []
    for st in (stack, get_stack("compiled")):
        t = load_shape(r["target"], dtype=r["target_dtype"])
        d = load_shape(r["draft"], dtype=r["draft_dtype"])
        times = [forward_time(t, hw, st, n, int(r["context"])).total_s for n in range(1, k + 2)]
        td = forward_time(d, hw, st, 1, int(r["context"])).total_s
        out.append((times, td))
    (times, td), (old_times, old_td) = out
    s = tau * times[0] / (k * td + times[k])
    iv = speedup_interval([t / times[0] for t in times], td / times[0], k, tau=tau, tau_k=k,
                          sigma_ratio=stack.sigma_log_ratio, sigma_time=stack.sigma_log_time, level=LEVEL)
    old = tau * old_times[0] / (k * old_td + old_times[k])
    return s, (iv.low[k], iv.high[k]), old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(HERE / "consumer.csv"))
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--stacks", default=str(STACKS_JSON))
    args = ap.parse_args()
    rows = load(Path(args.data))
    fitted, info = {}, {}
    for name in PARAMS:
        fit_rows = [r for r in rows if r["split"] == "fit" and r["stack"] == name]
        fitted[name], info[name] = fit(name, fit_rows)
    t1_all = [v for name in PARAMS for v in info[name]["t1_residuals"]]
    sigma_time = dof_sigma(t1_all, 0)
    ratio_all = [v for name in PARAMS for v in info[name]["ratio_residuals"]]
    for name, st in fitted.items():
        own = info[name]["ratio_residuals"]
        sigma_ratio = dof_sigma(own, len(PARAMS[name])) if len(own) > len(PARAMS[name]) else dof_sigma(ratio_all, 0)
        fitted[name] = replace(st, sigma_log_ratio=round(sigma_ratio, 4), sigma_log_time=round(sigma_time, 4),
                               source=SOURCES[name])
    stacks = {name: {k: v for k, v in st.as_dict().items() if k != "name"} for name, st in fitted.items()}
    Path(args.stacks).write_text(json.dumps({"command": "python benchmarks/plan/fit_consumer.py", "stacks": stacks},
                                            indent=1) + "\n")
    results = validate(rows, fitted)
    write_report(rows, fitted, info, results, Path(args.out))


def validate(rows: list[dict], fitted: dict[str, Stack]) -> list[dict]:
    out = []
    for r in rows:
        st = fitted[r["stack"]]
        if r["kind"] == "cost" and r["measured"]:
            pred = predict_ratio(st, r)
            lo, hi = ratio_interval(pred, st.sigma_log_ratio, LEVEL)
            old = predict_ratio(get_stack("compiled"), r)
        elif r["kind"] == "speedup":
            pred, (lo, hi), old = speedup_prediction(st, r)
        else:
            continue
        meas = float(r["measured"])
        out.append({"id": r["id"], "split": r["split"], "kind": r["kind"], "hardware": r["hardware"],
                    "stack": r["stack"], "model": f"{r['target']} {r['target_dtype']}" +
                    (f" + {r['draft']} {r['draft_dtype']}" if r["draft"] else ""),
                    "n_or_k": r["n"] or r["k"], "measured": meas, "predicted": pred, "low": lo, "high": hi,
                    "inside": lo <= meas <= hi, "rel_error": pred / meas - 1.0, "old_predicted": old,
                    "old_rel_error": old / meas - 1.0,
                    "wrong_side": r["kind"] == "speedup" and (pred > 1.0) != (meas > 1.0),
                    "wrong_side_outside": r["kind"] == "speedup" and (pred > 1.0) != (meas > 1.0)
                    and not lo <= 1.0 <= hi, "source": r["source_url"]})
    return out


def summary(results: list[dict], split: str) -> dict:
    sel = [r for r in results if r["split"] == split]
    errs = [abs(r["rel_error"]) for r in sel]
    old = [abs(r["old_rel_error"]) for r in sel]
    return {"rows": len(sel), "median_abs_rel_error": statistics.median(errs), "worst": max(errs),
            "inside_80": sum(r["inside"] for r in sel) / len(sel), "wrong_side": sum(r["wrong_side"] for r in sel),
            "wrong_side_outside_interval": sum(r["wrong_side_outside"] for r in sel),
            "old_median_abs_rel_error": statistics.median(old), "old_worst": max(old)}


def write_report(rows, fitted, info, results, out: Path) -> None:
    fit_s, val_s = summary(results, "fit"), summary(results, "validation")
    lines = ["# llama.cpp's per-stack cost model: fitted on published curves, checked on others", "",
             f"Command: `{' '.join(['python'] + sys.argv)}` (pure computation). Data: `consumer.csv` "
             f"({len(rows)} rows, each with its URL and the table line it came from; "
             f"{sum(r['split'] == 'fit' for r in rows)} fit, {sum(r['split'] == 'validation' for r in rows)} validation, "
             "split by table).", "",
             "Predicted quantity: T(n)/T(1) for cost-curve rows; for the two speculative runs the speedup "
             "S = τ·T(1)/(k·T_d + T(k+1)) at their measured τ and k. Interval: 80 %, from the stack's fitted scatter "
             "(`verispec/plan/intervals.py`). `old` = the planner before this model (`compiled` stack on every GPU).", "",
             "| set | rows | median abs. error | worst | inside 80 % interval | wrong side of 1.0x (outside interval) | old median | old worst |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s in (("fit", fit_s), ("validation", val_s)):
        lines.append(f"| {name} | {s['rows']} | {100 * s['median_abs_rel_error']:.1f} % | {100 * s['worst']:.1f} % | "
                     f"{100 * s['inside_80']:.0f} % | {s['wrong_side']} ({s['wrong_side_outside_interval']}) | "
                     f"{100 * s['old_median_abs_rel_error']:.1f} % | {100 * s['old_worst']:.1f} % |")
    lines += ["", "Where it misses, and what the data cannot say:",
              "- M1 Pro, 13B Q8_0 (F2, held out) is under-predicted by 32-50 %: one mat-vec efficiency per stack, shared by "
              "the M2 Ultra and the M1 Pro, cannot draw the M1 Pro's steeper curve (its 13B Q4_0 fit rows miss by 18-34 % "
              "too; the 1B rows fit). A per-generation Apple parameter would need more M1/M3/M4 tables than found.",
              "- Bandwidth efficiency and the fixed cost per forward are both constant in n, so these tables barely "
              "separate them; the fit puts bandwidth at its physical bound (1.0) and the rest in the fixed cost.",
              "- Metal above 8 rows (the GEMM kernels) is not in the data: the mat-vec efficiency is used there, which "
              "over-states the cost of long drafts (S2, k = 16, is under-predicted by 17 %).",
              "- The CPU stack rests on two tg/pp pairs of one Ryzen 7950X (different thread counts); no CPU row is held "
              "out, so it is not validated here (this machine's check: cpu.md).",
              "- Only two published speculative runs report τ, k and a baseline together (S1, S2); the sign check of "
              "1.0x rests on them and on the cost-curve rows.",
              "", "## Fitted stacks", "", "| stack | bandwidth × | mat-vec FLOP/s × (n <= 8) | GEMM FLOP/s × | per forward ms "
              "| σ log T(n)/T(1) | σ log T(1) | fit points | RMS log error (in sample) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, st in fitted.items():
        lines.append(f"| {name} | {st.bandwidth_efficiency:.3f} | {st.small_batch_compute_efficiency:.3f} | "
                     f"{st.compute_efficiency:.3f} | {1e3 * st.per_forward_s:.3f} | {st.sigma_log_ratio:.3f} | "
                     f"{st.sigma_log_time:.3f} | {info[name]['points']} | {info[name]['rms_log_time']:.3f} |")
    lines += ["", "## Every row", "", "| id | set | hardware | stack | model | n or k | measured | predicted | 80 % interval "
              "| error | inside | old | old error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| [{r['id']}]({r['source']}) | {r['split']} | {r['hardware']} | {r['stack']} | {r['model']} | "
                     f"{r['n_or_k']} | {r['measured']:.3f} | {r['predicted']:.3f} | {r['low']:.3f}-{r['high']:.3f} | "
                     f"{100 * r['rel_error']:+.1f} % | {'yes' if r['inside'] else 'no'} | {r['old_predicted']:.3f} | "
                     f"{100 * r['old_rel_error']:+.1f} % |")
    (out / "consumer.md").write_text("\n".join(lines) + "\n")
    (out / "consumer.json").write_text(json.dumps({"fit": fit_s, "validation": val_s, "rows": results,
                                                   "stacks": {n: s.as_dict() for n, s in fitted.items()}},
                                                  indent=1, default=float) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
