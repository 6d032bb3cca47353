"""Fit the planner's stack on two models, predict a third: the CPU validation of `verispec plan`.

Reads the curves measured by cpu_cost_curves.py (both backends, all models timed in
interleaved rounds in one run). For each backend:

1. fit a stack (:func:`verispec.plan.fit.fit_stack`, parameters
   :data:`verispec.plan.fit.LOCAL_PARAMS`: per-forward and per-layer overhead, attainable
   fractions of the measured bandwidth and FLOP/s, memory/compute overlap) on
   SmolLM2-135M and Qwen2.5-Coder-0.5B only, against the machine's ceilings measured in
   the same run (best of the before/after micro-benchmarks);
2. predict Qwen2.5-Coder-1.5B's T_t(n)/T_t(1), n = 1..8, and c = T_d / T_t(1) (T_d: the
   0.5B draft's one-token forward, predicted by the same stack), and compare with the
   measured curve;
3. compare k* and S(k*) from the measured and the predicted curves, with the default
   pair's measured per-position α (benchmarks/analysis-llamacpp/analysis.json, overall)
   and with a few i.i.d. α.

The plain roofline (overlap fixed at 1: max(memory, compute)) is fitted and scored the same
way and reported beside it.

Usage:
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan/validate_cpu.py \
        --data benchmarks/plan/cpu_cost_curves.json --out benchmarks/plan
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verispec import registry
from verispec.plan import Hardware, forward_time, load_shape, shape_from_config
from verispec.plan.fit import LOCAL_PARAMS, fit_stack
from verispec.theory import CostCurve

HERE = Path(__file__).resolve().parent
FIT_ON = ("smollm2-135m", "qwen2.5-coder-0.5b")
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
_BASIC = ("per_forward_s", "per_layer_s", "bandwidth_efficiency", "compute_efficiency")
# the stack `--calibrate` fits, and the plain roofline (max(memory, compute): overlap 1)
VARIANTS = {
    "primary": ("fitted stack (LOCAL_PARAMS)", LOCAL_PARAMS),
    "plain_roofline": ("plain roofline (overlap 1)", _BASIC),
}
N_SCORED = 8
ALPHAS = (0.5, 0.7, 0.8, 0.9)


def shape_for(name: str, backend: str):
    if backend == "llamacpp":
        return load_shape(name)                      # the GGUF's exact tensor bytes
    return shape_from_config(registry.hf_dir(name), name=name)   # the converted float32 directory


def score(backend: str, block: dict, hw: Hardware, context: int, alphas: list[float], params) -> dict:
    models = block["models"]
    curves = [(shape_for(m, backend), models[m]["median"]) for m in FIT_ON]
    stack = fit_stack(curves, hw, context=context, name=f"{backend}@local", params=params)
    shape_t, shape_d = shape_for(TARGET, backend), shape_for(DRAFT, backend)
    n_max = len(models[TARGET]["median"])
    pred = [forward_time(shape_t, hw, stack, n, context).total_s for n in range(1, n_max + 1)]
    pred_d = forward_time(shape_d, hw, stack, 1, context).total_s
    meas = models[TARGET]["median"]
    meas_d = models[DRAFT]["median"][0]
    ratios = []
    for n in range(1, N_SCORED + 1):
        m, p = meas[n - 1] / meas[0], pred[n - 1] / pred[0]
        ratios.append({"n": n, "measured": m, "predicted": p, "rel_error": p / m - 1.0})
    k_max = N_SCORED - 1
    per_pos = (alphas + [alphas[-1]] * k_max)[:k_max]
    mc, pc = CostCurve(tuple(meas[:N_SCORED]), meas_d), CostCurve(tuple(pred[:N_SCORED]), pred_d)
    ks = []
    for label, a in [("analysis per-position α", per_pos)] + [(f"α = {x}", x) for x in ALPHAS]:
        km, sm = mc.optimal_k(a, k_max)
        kp, sp = pc.optimal_k(a, k_max)
        ks.append({"alpha": label, "k_star_measured": km, "S_measured": sm, "k_star_predicted": kp, "S_predicted": sp,
                   "S_measured_at_predicted_k": mc.speedup(a, kp)})
    fit_rows = []
    for shape, times in curves:
        p = [forward_time(shape, hw, stack, n, context).total_s for n in range(1, len(times) + 1)]
        fit_rows.append({"model": shape.name, "rms_rel_error": (sum((a / b - 1) ** 2 for a, b in zip(p, times))
                                                                / len(times)) ** 0.5})
    return {"stack": stack.as_dict(), "ratios": ratios, "c_measured": meas_d / meas[0], "c_predicted": pred_d / pred[0],
            "T1_measured_s": meas[0], "T1_predicted_s": pred[0], "k_star": ks, "fit": fit_rows,
            "max_abs_ratio_error": max(abs(r["rel_error"]) for r in ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=[str(HERE / "cpu_cost_curves.json")],
                    help="cpu_cost_curves.py output(s); a backend in a later file replaces an earlier one")
    ap.add_argument("--analysis", default=str(HERE.parent / "analysis-llamacpp" / "analysis.json"))
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    runs = [json.loads(Path(p).read_text()) for p in args.data]
    analysis = json.loads(Path(args.analysis).read_text())
    alphas = [0.0 if a is None else a for a in analysis["overall"]["alphas"]]
    results = {}
    for run in runs:
        for backend, block in run["backends"].items():
            ceilings = block.get("ceilings") or run["ceilings"]
            hw = Hardware("local (measured in the run)", bandwidth=max(c["bandwidth_bytes_s"] for c in ceilings),
                          flops=max(c["flops"] for c in ceilings))
            context = run["prefix_tokens"]
            results[backend] = {
                **{key: score(backend, block, hw, context, alphas, params) for key, (_, params) in VARIANTS.items()},
                "uptime": [block["uptime_before"], block["uptime_after"]], "threads": block.get("threads"),
                "hardware": hw.as_dict(), "command": run["command"], "date": run["date"], "machine": run["machine"],
                "versions": run["versions"], "rounds": run["rounds"],
                "llamacpp_extra_buffer_types": run.get("llamacpp_extra_buffer_types")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu.json").write_text(json.dumps({"source": args.data, "results": results}, indent=1) + "\n")
    report(results, out)
    plot(results, out / "cpu.png")
    print((out / "cpu.md").read_text())


def report(results: dict, out: Path) -> None:
    lines = ["# `verispec plan` on this machine: fit on two models, predict the 1.5B target", "",
             f"Stack fitted on {' and '.join(FIT_ON)} only; {TARGET} is predicted. Fitted and scored by "
             "`benchmarks/plan/validate_cpu.py`. Ratios only: absolute times on this shared VM are not comparable "
             "between runs (other helpers' jobs load its 2 cores; see the load lines).", ""]
    for backend, r in results.items():
        prim, plain = r["primary"], r["plain_roofline"]
        s, hw = prim["stack"], r["hardware"]
        lines += [f"## {backend} ({r['threads']} thread)", "",
                  f"Measured by `{r['command']}` on {r['machine']} ({r['date']}; "
                  f"{', '.join(f'{k} {v}' for k, v in r['versions'].items())}; {r['rounds']} interleaved rounds, "
                  f"median" + ("; llama.cpp extra buffer types off" if backend == "llamacpp"
                               and r["llamacpp_extra_buffer_types"] is False else "") + ").", "",
                  f"Load: `{r['uptime'][0]}` → `{r['uptime'][1]}`", "",
                  f"Ceilings measured around the run (best of before/after): {hw['bandwidth'] / 1e9:.1f} GB/s read, "
                  f"{hw['flops'] / 1e9:.0f} GFLOP/s float32 matmul.", "",
                  f"Fitted stack: per forward {s['per_forward_s'] * 1e3:.2f} ms, per layer {s['per_layer_s'] * 1e3:.3f} ms, "
                  f"bandwidth × {s['bandwidth_efficiency']:.2f}, FLOP/s × {s['compute_efficiency']:.2f}, overlap "
                  f"{s['overlap']:.2f}; in-sample RMS error " + ", ".join(f"{f['model']} {100 * f['rms_rel_error']:.1f} %" for f in prim["fit"]) + ".",
                  "",
                  "| n | measured T_t(n)/T_t(1) | predicted | error | plain roofline (overlap 1) | error |",
                  "|---|---|---|---|---|---|"]
        for a, c in zip(prim["ratios"], plain["ratios"]):
            lines.append(f"| {a['n']} | {a['measured']:.3f} | {a['predicted']:.3f} | {100 * a['rel_error']:+.1f} % | "
                         f"{c['predicted']:.3f} | {100 * c['rel_error']:+.1f} % |")
        worst = f"plain roofline {100 * plain['max_abs_ratio_error']:.1f} %, c {plain['c_predicted']:.3f}"
        lines += ["", f"c = T_d / T_t(1): measured {prim['c_measured']:.3f}, predicted {prim['c_predicted']:.3f} "
                  f"({100 * (prim['c_predicted'] / prim['c_measured'] - 1):+.1f} %). Worst ratio error n ≤ {N_SCORED}: "
                  f"{100 * prim['max_abs_ratio_error']:.1f} % ({worst}).", "",
                  "| α | k* measured curve | S(k*) | k* predicted curve | S predicted | measured S at predicted k* |",
                  "|---|---|---|---|---|---|"]
        for k in prim["k_star"]:
            lines.append(f"| {k['alpha']} | {k['k_star_measured']} | {k['S_measured']:.3f} | {k['k_star_predicted']} | "
                         f"{k['S_predicted']:.3f} | {k['S_measured_at_predicted_k']:.3f} |")
        lines.append("")
    (out / "cpu.md").write_text("\n".join(lines) + "\n")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (backend, r) in zip(axes[0], results.items()):
        ns = [x["n"] for x in r["primary"]["ratios"]]
        ax.plot(ns, [x["measured"] for x in r["primary"]["ratios"]], "ko-", label=f"{TARGET} measured")
        ax.plot(ns, [x["predicted"] for x in r["primary"]["ratios"]], "s--", label="predicted (fit on the other two)")
        ax.plot(ns, [x["predicted"] for x in r["plain_roofline"]["ratios"]], ":", label=VARIANTS["plain_roofline"][0])
        ax.fill_between(ns, [0.75 * x["measured"] for x in r["primary"]["ratios"]],
                        [1.25 * x["measured"] for x in r["primary"]["ratios"]], color="grey", alpha=0.15, label="±25 %")
        ax.set_title(f"{backend}: T_t(n)/T_t(1)", fontsize=10)
        ax.set_xlabel("new tokens per forward, n")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
