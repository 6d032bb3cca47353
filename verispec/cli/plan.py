"""`verispec plan`: predict the cost curve, best draft length and speedup on any hardware."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..drafters import DRAFTERS
from ..models import BACKENDS
from .common import err, fail

ALPHA_HELP = ("speculative decoding needs the acceptance rate α: the probability that the target accepts a "
              "draft token (Σ min(p, q), 0 < α < 1), which belongs to the model pair and the text. Give one of "
              "--alpha 0.7 (a guess), --tau (mean tokens per round you measured), --alpha-from analysis.json "
              "(measure it here with `verispec analyze --target T --draft D --prompts ...`), or --metrics-url "
              "http://host:8000/metrics (read it from a running vLLM or verispec serve)")


def _fail(message: str, as_json: bool) -> None:
    """Exit 2 with ``message``: on stdout as an OpenAI-shaped JSON error under --json
    (``param`` is the flag the message starts with), else in red on stderr."""
    if as_json:
        flag = message.split(":")[0].split()[0] if message.startswith("--") else None
        print(json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": flag,
                                    "code": None}}))
        raise typer.Exit(2)
    fail(message)


def _print_list_hardware(console: Console) -> None:
    from ..plan.hardware import catalogue

    table = Table(title="hardware catalogue (verispec/plan/hardware.csv)")
    for col in ("name", "kind", "GB/s", "TFLOP/s", "GB", "source"):
        table.add_column(col)
    for hw in catalogue().values():
        table.add_row(hw.name, hw.kind, f"{hw.bandwidth / 1e9:g}", f"{hw.flops / 1e12:g}" if hw.flops else "",
                      f"{hw.memory / 1e9:g}" if hw.memory else "", hw.source[:60])
    console.print(table)


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
    iv = p.interval
    level = f"{iv.level:.0%}" if iv else ""
    sp = Table(title=f"speedup vs draft length (α = {p.alpha:.3f}" + (", per position" if p.alphas else "") + ")")
    for col in ("k", "E(α,k)", "S(k)") + ((f"{level} interval",) if iv else ()) + ("",):
        sp.add_column(col, justify="right")
    for k, (e, s) in enumerate(zip(p.expected_tokens, p.speedups)):
        band = (f"{iv.low[k]:.2f}-{iv.high[k]:.2f}",) if iv else ()
        sp.add_row(str(k), f"{e:.3f}", f"{s:.3f}", *band, "← k*" if k == p.k_star else "")
    console.print(sp)
    be = "never (not even at α = 1)" if p.break_even_alpha is None else f"α > {p.break_even_alpha:.3f}"
    console.print(f"k* = {p.k_star}, S(k*) = {p.speedup_star:.2f}x · speculation pays for {be} · "
                  f"ceiling at α = 1: {p.ceiling_speedup:.2f}x at k = {p.ceiling_k}")
    if iv:
        k = iv.best_k
        console.print(f"[bold]verdict[/]: speculating at k = {k} is [bold]{iv.verdict}[/] (S = {p.speedups[k]:.2f}x, "
                      f"{level} interval {iv.low[k]:.2f}-{iv.high[k]:.2f}x; P(gain) = {iv.gain_probability:.0%}) · "
                      f"k* in {iv.k_star_low}..{iv.k_star_high} ({level})")
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
    target: Optional[str] = typer.Option(None, "--target", help="preset, Hugging Face id or Ollama name (llama-3-70b, "
                                         "meta-llama/Meta-Llama-3.1-8B-Instruct, llama3.1:8b), registered model, "
                                         "config.json / HF directory, or .gguf file"),
    draft: Optional[str] = typer.Option(None, "--draft", help="draft model, same forms as --target"),
    drafter: str = typer.Option("model", "--drafter", help="the drafter planned for: "
                                + ", ".join(DRAFTERS) + " (all but a draft model draft at no cost)"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="catalogue name (m1, m4-max, rtx4090, 7950x, "
                                           "h100, ...; --list-hardware), a spec 'bw=2039GB/s,flops=312T,mem=80GB,n=2', "
                                           "a name with overrides 'h100,n=2', or local"),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="acceptance rate α in (0, 1)"),
    alpha_from: Optional[str] = typer.Option(None, "--alpha-from", help="analysis.json from `verispec analyze` "
                                             "(per-position α; its target/draft are the defaults)"),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="a running vLLM / verispec serve "
                                              "/metrics page: per-position α of its drafter"),
    metrics_model: Optional[str] = typer.Option(None, "--metrics-model", help="model_name label to read from "
                                                "--metrics-url when the server has several"),
    category: str = typer.Option("overall", "--category", help="category of --alpha-from"),
    tau: Optional[float] = typer.Option(None, "--tau", help="mean tokens per target forward (bonus included)"),
    tau_k: Optional[int] = typer.Option(None, "--tau-k", help="draft length --tau was measured at (default --k-max)"),
    context: Optional[int] = typer.Option(None, "--context", help="tokens in the KV cache (default 512)"),
    batch: int = typer.Option(1, "--batch", help="sequences decoded together"),
    k_max: Optional[int] = typer.Option(None, "--k-max", help="largest draft length (default 8)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="weight dtype: bf16, fp16, int4, Q4_K_M, Q4_K_L, "
                                        "IQ4_XS, Q8_0, 4bit (MLX), ... (default: the file's; presets: bf16)"),
    draft_dtype: Optional[str] = typer.Option(None, "--draft-dtype", help="draft dtype (default --dtype)"),
    stack: Optional[str] = typer.Option(None, "--stack", help="software: llamacpp-metal, llamacpp-cuda, llamacpp-cpu, "
                                        "compiled (vLLM, SGLang, TensorRT-LLM, CUDA graphs), eager (HF transformers), "
                                        "eager-cpu, or a stack .json (default: what the hardware usually runs)"),
    level: float = typer.Option(0.8, "--level", help="prediction interval level"),
    calibrate: list[str] = typer.Option([], "--calibrate", help="with --hardware local: registered model(s) whose "
                                        "measured cost curve fits the stack (repeat the flag for several)"),
    calibrate_clock: str = typer.Option("wall", "--calibrate-clock", help="wall, or thread: one llama.cpp thread "
                                        "timed in CPU seconds (steady on a busy shared machine)"),
    backend: str = typer.Option("llamacpp", "--backend", metavar="NAME", help="backend --calibrate times: "
                                + ", ".join(BACKENDS) + " (transformers: models are sized as float32 unless --dtype)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan (or the error) as JSON"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write a PNG: cost curve and S(k)"),
    list_hardware: bool = typer.Option(False, "--list-hardware", help="print the hardware catalogue and exit"),
) -> None:
    """Predict T_t(n), T_d, c, E(α,k), S(k) with intervals, k*, the break-even α and the ceiling on any hardware."""
    from .. import plan as planlib
    from ..plan import server_alpha

    if list_hardware:
        _print_list_hardware(Console())
        return
    if hardware is None:
        _fail("--hardware is required (a catalogue name such as m4-max or rtx4090, a spec like "
              "'bw=2039GB/s,flops=312T', or local; --list-hardware shows the catalogue)", as_json)
    if drafter not in DRAFTERS:
        _fail(f"--drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}", as_json)
    with_model = DRAFTERS[drafter].needs_model
    given = [name for name, x in (("--alpha", alpha), ("--alpha-from", alpha_from), ("--tau", tau),
                                  ("--metrics-url", metrics_url)) if x is not None]
    if not given:
        _fail(f"--alpha: missing. {ALPHA_HELP}", as_json)
    if len(given) > 1:
        _fail(f"give only one of --alpha, --alpha-from, --tau or --metrics-url; got {' and '.join(given)}",
              as_json)
    if tau_k is not None and tau is None:
        _fail("--tau-k needs --tau", as_json)
    if metrics_model is not None and metrics_url is None:
        _fail("--metrics-model needs --metrics-url", as_json)
    if calibrate and hardware.strip().lower() != "local":
        _fail("--calibrate needs --hardware local (it times models on this machine)", as_json)
    if calibrate and stack:
        _fail("give --calibrate or --stack, not both", as_json)
    if backend not in BACKENDS:
        _fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}", as_json)
    if plot and Path(plot).suffix.lower() != ".png":
        _fail(f"--plot must name a .png file, got {plot!r}", as_json)
    if not 0.0 < level < 1.0:
        _fail(f"--level must be in (0, 1), got {level!r}", as_json)
    kwargs = dict(batch=batch, dtype=dtype, draft_dtype=draft_dtype, level=level)
    if context is not None:
        kwargs["context"] = context
    if k_max is not None:
        kwargs["k_max"] = k_max
    served = None
    try:
        hw = planlib.parse_hardware(hardware)
        if calibrate:
            from ..plan.fit import calibrate as fit_local

            if backend == "transformers" and dtype is None:   # the stack was fitted on float32 models
                kwargs["dtype"] = "float32"

            if calibrate_clock == "thread":
                from ..plan.local import local_hardware

                hw = local_hardware("thread")
            with err.status(f"timing {', '.join(calibrate)} on {backend} to fit the stack"):
                stack_obj, measured = fit_local(calibrate, backend, hw, clock=calibrate_clock)
            err.print(f"fitted stack: {stack_obj}")
            for name, times in measured["curves"].items():
                err.print(f"measured {name}: T(n)/T(1) = " + ", ".join(f"{t / times[0]:.3f}" for t in times))
        else:
            stack_obj = stack
        if alpha_from is not None:
            if not with_model:
                draft = None
            result = planlib.project_analysis(alpha_from, hw, category=category, target=target, draft=draft,
                                              stack=stack_obj, **kwargs)
        else:
            if target is None:
                _fail("--target is required (or --alpha-from an analysis.json that names it)", as_json)
            if with_model and draft is None:
                _fail(f"--draft is required with --drafter {drafter} (or pass a model-free --drafter "
                      "such as suffix or lookup)", as_json)
            alpha_kw: dict = dict(alpha=alpha, tau=tau, tau_k=tau_k)
            if metrics_url is not None:
                served = server_alpha.read_acceptance(server_alpha.fetch_metrics(metrics_url), metrics_model, level)
                km = kwargs.get("k_max", 8)
                alpha_kw = dict(alphas=served.alphas(km), alpha_source=f"{metrics_url} ({served.prefix})",
                                alpha_draws=served.draw(km, 4000))
            result = planlib.plan(target, draft if with_model else None, hw, stack=stack_obj,
                                  **alpha_kw, **kwargs)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e), as_json)
    # the deploy strings name the draft as the user wrote it (a Hugging Face id or a path serves as is)
    draft_name = None if result.draft is None else (draft or result.draft.name)
    deploy = {"vllm_speculative_config": server_alpha.vllm_speculative_config(max(result.k_star, 1), draft_name),
              "llama_server_flags": server_alpha.llama_server_flags(max(result.k_star, 1), draft_name)}
    if served is not None:
        result.notes.extend(served.notes)
        if result.k_max > served.k_server:
            result.notes.append(f"α beyond the server's k = {served.k_server} is extrapolated (logit-linear trend "
                                f"or the last position carried forward, with a widening interval)")
    if plot:
        plot_plan(result, plot)
    if as_json:
        out = result.as_dict()
        out["deploy"] = deploy
        if served is not None:
            out["server_acceptance"] = served.as_dict(result.k_max)
        print(json.dumps(out, default=float))
    else:
        console = Console()
        if served is not None:
            _print_served(console, served, result.k_max)
        print_plan(console, result)
        if result.k_star > 0:
            console.print(f"vLLM: --speculative-config '{deploy['vllm_speculative_config']}'")
            if deploy["llama_server_flags"]:
                console.print(f"llama-server: {deploy['llama_server_flags']}")
    if plot:
        err.print(f"wrote {plot}")


def _print_served(console: Console, served, k_max: int) -> None:
    table = Table(title=f"α per position read from the server ({served.prefix}; k = {served.k_server} there)")
    for col in ("position", "α", f"{served.level:.0%} interval", "accepted / trials", ""):
        table.add_column(col, justify="right")
    for p in served.extended(k_max):
        table.add_row(str(p.position), f"{p.alpha:.3f}", f"{p.low:.3f}-{p.high:.3f}",
                      f"{p.accepted} / {p.trials}" if p.measured else "", "" if p.measured else "extrapolated")
    console.print(table)
