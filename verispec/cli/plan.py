"""`verispec plan`: predict the cost curve, best draft length and speedup on any hardware."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..models import BACKENDS
from .common import err, fail


def hardware_or_fail(text: str):
    """A Hardware from a --hardware value, or a clear error naming --hardware."""
    from ..plan import parse_hardware

    try:
        return parse_hardware(text)
    except ValueError as e:
        fail(str(e))


def project_or_fail(analysis: dict, hardware, out_dir: str | None = None, stack: Optional[str] = None):
    """Project an analysis onto `hardware` (see `verispec.plan.project_analysis`); write plan.json."""
    from ..plan import project_analysis

    try:
        result = project_analysis(analysis, hardware, stack=stack)
    except ValueError as e:
        fail(str(e))
    if out_dir is not None:
        Path(out_dir, "plan.json").write_text(json.dumps(result.as_dict(), indent=1, default=float) + "\n")
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def print_plan(console: Console, p) -> None:
    """The plan as rich tables: costs, then speedups, then the verdict."""
    draft = f"{p.draft.name} ({p.draft.dtype}, {p.draft.weight_bytes / 1e9:.2f} GB read/forward)" if p.draft \
        else "prompt lookup (T_d = 0)"
    console.print(f"[bold]target[/] {p.target.name} ({p.target.dtype}, {p.target.weight_bytes / 1e9:.2f} GB "
                  f"read/forward) · [bold]draft[/] {draft}")
    console.print(f"[bold]hardware[/] {p.hardware.label} · [bold]stack[/] {p.stack.name} · context {p.context} · "
                  f"batch {p.batch} · α from {p.alpha_source}")
    costs = Table(title="predicted cost curve (roofline)")
    comm = p.hardware.n_devices > 1
    for col in ("n", "T_t(n) ms", "T_t(n)/T_t(1)", "memory ms", "compute ms") + (("all-reduce ms",) if comm else ()) \
            + ("overhead ms", "bound"):
        costs.add_column(col, justify="right")
    t1 = p.target_times[0]
    rows = [(str(f.n), f, f"{f.total_s / t1:.3f}") for f in p.target_forwards]
    if p.draft_forward is not None:
        rows.append(("T_d", p.draft_forward, f"c = {p.c:.3f}"))
    for label, f, ratio in rows:
        costs.add_row(label, _ms(f.total_s), ratio, _ms(f.memory_s), _ms(f.compute_s),
                      *((_ms(f.comm_s),) if comm else ()), _ms(f.overhead_s), f.bound)
    console.print(costs)
    sp = Table(title=f"speedup vs draft length (α = {p.alpha:.3f}" + (", per position" if p.alphas else "") + ")")
    for col in ("k", "E(α,k)", "S(k)", ""):
        sp.add_column(col, justify="right")
    for k, (e, s) in enumerate(zip(p.expected_tokens, p.speedups)):
        sp.add_row(str(k), f"{e:.3f}", f"{s:.3f}", "← k*" if k == p.k_star else "")
    console.print(sp)
    be = "never (not even at α = 1)" if p.break_even_alpha is None else f"α > {p.break_even_alpha:.3f}"
    console.print(f"k* = {p.k_star}, S(k*) = {p.speedup_star:.2f}x · speculation pays for {be} · "
                  f"ceiling at α = 1: {p.ceiling_speedup:.2f}x at k = {p.ceiling_k}")
    for note in p.notes:
        console.print(f"• {note}")


def plot_plan(p, path: str) -> None:
    """Two panels: predicted T_t(n)/T_t(1) (and c), and S(k) at the plan's α and at α = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..theory import CostCurve

    curve = CostCurve(tuple(p.target_times), p.draft_time)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ns = list(range(1, len(p.target_times) + 1))
    left.plot(ns, [t / p.target_times[0] for t in p.target_times], "o-", label="T_t(n) / T_t(1)")
    left.plot(ns, ns, ":", color="grey", label="n (fully compute-bound)")
    if p.draft is not None:
        left.axhline(p.c, color="C2", ls="--", label=f"c = T_d / T_t(1) = {p.c:.3f}")
    left.set_xlabel("new tokens per forward, n")
    left.set_ylabel("cost relative to one token")
    left.set_title(f"{p.target.name} on {p.hardware.label}", fontsize=10)
    left.legend(fontsize=8)
    ks = list(range(p.k_max + 1))
    right.plot(ks, p.speedups, "o-", label=f"α = {p.alpha:.2f}")
    right.plot(ks, [curve.speedup(1.0, k) for k in ks], "--", label="α = 1 (ceiling)")
    right.axhline(1.0, color="grey", lw=0.8)
    right.plot([p.k_star], [p.speedup_star], "r*", ms=12, label=f"k* = {p.k_star}")
    right.set_xlabel("draft length k")
    right.set_ylabel("predicted speedup S(k)")
    right.set_title(f"draft {p.draft.name if p.draft else 'prompt lookup'} ({p.stack.name})", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plan(
    target: Optional[str] = typer.Option(None, "--target", help="registered name, preset (e.g. llama-3-70b, "
                                         "qwen2.5-7b, t5-xxl), config.json / HF directory, or .gguf file"),
    draft: Optional[str] = typer.Option(None, "--draft", help="draft model, same forms as --target"),
    drafter: str = typer.Option("model", "--drafter", help="model or lookup (prompt lookup: no draft model)"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="catalogue name (h100, a100-80gb, "
                                           "tpu-v4, rtx4090, ...), a spec 'bw=2039GB/s,flops=312T,mem=80GB,n=2', "
                                           "a name with overrides 'h100,n=2', or local"),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="acceptance rate α in (0, 1)"),
    alpha_from: Optional[str] = typer.Option(None, "--alpha-from", help="analysis.json from `verispec analyze` "
                                             "(per-position α; its target/draft are the defaults)"),
    category: str = typer.Option("overall", "--category", help="category of --alpha-from"),
    tau: Optional[float] = typer.Option(None, "--tau", help="mean tokens per target forward (bonus included)"),
    tau_k: Optional[int] = typer.Option(None, "--tau-k", help="draft length --tau was measured at (default --k-max)"),
    context: Optional[int] = typer.Option(None, "--context", help="tokens in the KV cache (default 512)"),
    batch: int = typer.Option(1, "--batch", help="sequences decoded together"),
    k_max: Optional[int] = typer.Option(None, "--k-max", help="largest draft length (default 8)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="weight dtype: bf16, fp16, fp32, int8, int4, q4_k_m, "
                                        "... (default: the file's; presets: bf16)"),
    draft_dtype: Optional[str] = typer.Option(None, "--draft-dtype", help="draft dtype (default --dtype)"),
    stack: Optional[str] = typer.Option(None, "--stack", help="software: compiled (CUDA graphs, XLA, vLLM), eager "
                                        "(HF transformers on a GPU), eager-cpu, or a stack .json (default: compiled; "
                                        "eager-cpu for local)"),
    calibrate: list[str] = typer.Option([], "--calibrate", help="with --hardware local: registered model(s) whose "
                                        "measured cost curve fits the stack (repeat the flag for several)"),
    backend: str = typer.Option("llamacpp", "--backend", metavar="NAME", help="backend --calibrate times: "
                                + ", ".join(BACKENDS) + " (transformers: models are sized as float32 unless --dtype)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write a PNG: cost curve and S(k)"),
) -> None:
    """Predict T_t(n), T_d, c, E(α,k), S(k), k*, the break-even α and the ceiling on any hardware."""
    from .. import plan as planlib

    if hardware is None:
        fail("--hardware is required (a catalogue name, a spec like 'bw=2039GB/s,flops=312T', or local)")
    if drafter not in ("model", "lookup"):
        fail(f"--drafter must be model or lookup, got {drafter!r}")
    if sum(x is not None for x in (alpha, alpha_from, tau)) != 1:
        fail("give exactly one of --alpha, --alpha-from or --tau")
    if tau_k is not None and tau is None:
        fail("--tau-k needs --tau")
    if calibrate and hardware.strip().lower() != "local":
        fail("--calibrate needs --hardware local (it times models on this machine)")
    if calibrate and stack:
        fail("give --calibrate or --stack, not both")
    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if plot and Path(plot).suffix.lower() != ".png":
        fail(f"--plot must name a .png file, got {plot!r}")
    kwargs = dict(batch=batch, dtype=dtype, draft_dtype=draft_dtype)
    if context is not None:
        kwargs["context"] = context
    if k_max is not None:
        kwargs["k_max"] = k_max
    try:
        hw = planlib.parse_hardware(hardware)
        if calibrate:
            from ..plan.fit import calibrate as fit_local

            if backend == "transformers" and dtype is None:   # the stack was fitted on float32 models
                kwargs["dtype"] = "float32"

            with err.status(f"timing {', '.join(calibrate)} on {backend} to fit the stack"):
                stack_obj, _ = fit_local(calibrate, backend, hw)
            err.print(f"fitted stack: {stack_obj}")
        else:
            stack_obj = stack
        if alpha_from is not None:
            if drafter == "lookup":
                draft = None
            result = planlib.project_analysis(alpha_from, hw, category=category, target=target, draft=draft,
                                              stack=stack_obj, **kwargs)
        else:
            if target is None:
                fail("--target is required (or --alpha-from an analysis.json that names it)")
            if drafter == "model" and draft is None:
                fail("--draft is required with --drafter model (or pass --drafter lookup)")
            result = planlib.plan(target, draft if drafter == "model" else None, hw, alpha=alpha, tau=tau,
                                  tau_k=tau_k, stack=stack_obj, **kwargs)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    if plot:
        plot_plan(result, plot)
    if as_json:
        print(json.dumps(result.as_dict(), default=float))
    else:
        print_plan(Console(), result)
    if plot:
        err.print(f"wrote {plot}")
