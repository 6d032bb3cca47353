"""`verispec analyze`: α per category and position, the cost curve, predicted speedup vs k."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from ..drafters import DRAFTERS
from .common import (BACKEND, BAD_WORD, DRAFT, FREQUENCY_PENALTY, LOGIT_BIAS, MIN_NEW_TOKENS, MIN_P,
                     PRESENCE_PENALTY, REPETITION_PENALTY, TARGET, bad_words_ids, build_decoder,
                     controls_from_options, err, fail, sampling_or_fail)
from .plan import hardware_or_fail, print_plan, project_or_fail


def analyze(
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    backend: Optional[str] = BACKEND,
    drafter: str = typer.Option("model", "--drafter", metavar="NAME", help="the drafter whose α is measured: "
                                + "; ".join(f"{n}: {k.help}" for n, k in DRAFTERS.items())),
    prompts: Optional[str] = typer.Option(
        None, "--prompts", "--dataset", help="Spec-Bench JSON lines (question_id, category, turns) or plain text, one "
        "prompt a line (default: $VERISPEC_SPEC_BENCH, else ../shared/data/spec_bench/question.jsonl)"),
    per_category: int = typer.Option(3, "--per-category", help="prompts per category, as `bench` picks "
                                     "them (multi-turn: round-robin over MT-Bench's categories; 0 = all)"),
    raw_categories: bool = typer.Option(False, "--raw-categories",
                                        help="keep MT-Bench categories apart (default: one 'multi-turn' group)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="trajectory length per prompt"),
    k_max: int = typer.Option(6, "--k-max", help="K: drafts per evaluation point; k = 0..K predicted"),
    stride: Optional[int] = typer.Option(None, "--stride",
                                         help="evaluate α every N positions (default: about 32 points a prompt)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    top_p: float = typer.Option(1.0, "--top-p", help="in (0, 1]; 1 = off"),
    min_p: float = MIN_P,
    repetition_penalty: float = REPETITION_PENALTY,
    presence_penalty: float = PRESENCE_PENALTY,
    frequency_penalty: float = FREQUENCY_PENALTY,
    logit_bias: Optional[list[str]] = LOGIT_BIAS,
    bad_word: Optional[list[str]] = BAD_WORD,
    min_new_tokens: int = MIN_NEW_TOKENS,
    seed: int = typer.Option(0, "--seed"),
    repeats: int = typer.Option(5, "--repeats", help="timed repeats per cost-curve point (median)"),
    prefix_tokens: int = typer.Option(200, "--prefix-tokens", help="context length the cost curve is timed at"),
    measure: bool = typer.Option(False, "--measure",
                                 help="also run fixed-k decodes (one prompt per category) and plot measured speedups"),
    out: str = typer.Option("verispec-analysis", "--out", help="directory for analysis.json and the plots"),
    as_json: bool = typer.Option(False, "--json", help="print analysis.json to stdout instead of tables"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="also project the measured α onto this hardware "
                                           "(as for `verispec plan`: a catalogue name or spec); writes plan.json"),
) -> None:
    """Measure α (per category, per draft position) and the cost curve; predict the speedup vs k."""
    from .. import analyze as an
    from ..prompts import dataset_path, load_prompts
    from ..report.analysis import closing_notes, render_tables

    if drafter not in DRAFTERS:
        fail(f"--drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
    for name, value, low in (("--k-max", k_max, 1), ("--max-new-tokens", max_new_tokens, 1),
                             ("--per-category", per_category, 0), ("--repeats", repeats, 1),
                             ("--prefix-tokens", prefix_tokens, 1)):
        if value < low:
            fail(f"{name} must be >= {low}, got {value}")
    if stride is not None and stride < 1:
        fail(f"--stride must be >= 1, got {stride}")
    controls = controls_from_options(min_p, repetition_penalty, presence_penalty, frequency_penalty,
                                     logit_bias, min_new_tokens)
    sampling_or_fail(temperature, top_k, top_p, **controls)
    hw = hardware_or_fail(hardware) if hardware else None   # a bad --hardware fails before the long run
    try:
        prompt_list = load_prompts(prompts, per_category=per_category, raw_categories=raw_categories)
    except (ValueError, OSError) as e:
        fail(str(e))
    decoder, backend = build_decoder(target, draft, backend, drafter)
    # the controls on the real target: its EOS ids (min_new_tokens) and tokenized bad words
    sampling = sampling_or_fail(temperature, top_k, top_p, **controls,
                                bad_words_ids=bad_words_ids(decoder.tokenizer, bad_word),
                                eos_token_ids=decoder.target.eos_token_ids)
    try:
        sampling.check_vocab(decoder.target.vocab_size)
    except ValueError as e:
        fail(str(e))
    config = an.AnalyzeConfig(k_max=k_max, max_new_tokens=max_new_tokens, stride=stride, sampling=sampling,
                              seed=seed, prefix_tokens=prefix_tokens, repeats=repeats, measure=measure)
    try:
        with err.status("analysing") as status:
            analysis = an.run_analysis(decoder.target, prompt_list, decoder.encode, config,
                                       drafter_kind=drafter, draft=decoder.draft,
                                       progress=lambda msg: status.update(msg))
        analysis["backend"] = backend
        analysis["prompts_file"] = str(dataset_path(prompts))
        paths = an.write_outputs(analysis, out)
    except (ValueError, OSError) as e:
        fail(str(e))
    projection = project_or_fail(analysis, hw, out) if hw else None
    if as_json:
        print(json.dumps({**analysis, "projection": projection.as_dict()} if projection else analysis, default=float))
        return
    console = Console()
    for table in render_tables(analysis):
        console.print(table)
    for line in closing_notes(analysis):
        console.print(f"• {line}")
    if projection:
        print_plan(console, projection)
    err.print(f"wrote {paths['json']}, {paths['alpha']}, {paths['speedup']}" + (" and plan.json" if projection else ""))

