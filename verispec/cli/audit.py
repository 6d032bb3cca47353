"""`verispec audit`: exact enumeration and statistical audit of losslessness."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from ..drafters import DRAFTERS, ModelDrafter
from .common import (BACKEND, BAD_WORD, DRAFT, FREQUENCY_PENALTY, LOGIT_BIAS, MIN_NEW_TOKENS, MIN_P,
                     PRESENCE_PENALTY, REPETITION_PENALTY, TARGET, bad_words_ids, build_decoder,
                     controls_from_options, err, fail, sampling_or_fail)

_DEFAULT_SIGNIFICANCE = 0.01


def _significance(significance: Optional[float], alpha_alias: Optional[float]) -> float:
    """--significance, or its deprecated spelling --alpha (which `plan` uses for α, the
    acceptance rate), or the default; a clear error for a bad or conflicting value."""
    flag = "--significance"
    if alpha_alias is not None:
        err.print("[yellow]warning:[/] --alpha is deprecated here, use --significance "
                  "(α names the acceptance rate elsewhere)")
        if significance is not None and significance != alpha_alias:
            fail(f"--significance {significance} and --alpha {alpha_alias} disagree; "
                 "give --significance only")
        significance, flag = alpha_alias, "--alpha"
    if significance is None:
        return _DEFAULT_SIGNIFICANCE
    if not 0 < significance < 1:
        fail(f"{flag} is a significance level and must be in (0, 1), e.g. 0.01; got {significance}")
    return significance


def _rule_names(rules: str, known: tuple[str, ...]) -> list[str]:
    """The --rules list: known names, duplicates dropped, order kept."""
    wanted = list(dict.fromkeys(r.strip() for r in rules.split(",") if r.strip()))
    if not wanted:
        fail(f"--rules is empty: name one or more of {', '.join(known)}")
    unknown = [r for r in wanted if r not in known]
    if unknown:
        fail(f"--rules: unknown {unknown}; choose from {', '.join(known)}")
    return wanted


def audit(
    prompt: str = typer.Option("Repeat after me: red, green, blue, red, green, blue, red, green",
                               "--prompt", help="fixed prompt the samples continue"),
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", min=1,
                                               help="keep only the draft's first N layers ('--draft self')"),
    backend: Optional[str] = BACKEND,
    drafter: str = typer.Option("model", "--drafter", metavar="NAME", help="the drafter audited: "
                                + "; ".join(f"{n}: {k.help}" for n, k in DRAFTERS.items())),
    k: int = typer.Option(3, "--k", min=1, help="draft length"),
    n_samples: Optional[int] = typer.Option(
        None, "--n-samples", min=1, help="samples per implementation (N) [default: 2000; --endpoint: "
                                         "completions per prompt, default 50]"),
    m: Optional[int] = typer.Option(None, "--m", min=1, help="new tokens per sample [default: 3, at most 8 "
                                    "per position; --endpoint: up to a few hundred, default 64]"),
    significance: Optional[float] = typer.Option(
        None, "--significance",
        help=f"family-wise significance level of the tests, Bonferroni-corrected over the m + 1 "
             f"tests [default: {_DEFAULT_SIGNIFICANCE}]"),
    alpha_alias: Optional[float] = typer.Option(None, "--alpha", hidden=True,
                                                help="deprecated spelling of --significance"),
    temperature: float = typer.Option(1.0, "--temperature", help="> 0: an audit needs sampling"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    min_p: float = MIN_P,
    repetition_penalty: float = REPETITION_PENALTY,
    presence_penalty: float = PRESENCE_PENALTY,
    frequency_penalty: float = FREQUENCY_PENALTY,
    logit_bias: Optional[list[str]] = LOGIT_BIAS,
    bad_word: Optional[list[str]] = BAD_WORD,
    min_new_tokens: int = MIN_NEW_TOKENS,
    rule: str = typer.Option("standard", "--rule",
                             help="the acceptance rule verispec runs (audited as 'verispec'): "
                                  "standard (min(1, p/q)) or gumbel (coupled)"),
    rules: str = typer.Option("verispec,naive-agree,naive-always-accept", "--rules",
                              help="implementations to audit, comma-separated: verispec (the --rule "
                                   "verispec runs), standard, gumbel, naive-agree, "
                                   "naive-always-accept, hf-assisted (statistical audit only)"),
    exact: bool = typer.Option(False, "--exact", help="only the exact enumeration on toy models (seconds, no model)"),
    as_json: bool = typer.Option(False, "--json"),
    endpoint: Optional[str] = typer.Option(
        None, "--endpoint", help="audit a running OpenAI-compatible server instead, e.g. "
                                 "http://127.0.0.1:8000/v1 (vLLM, SGLang, llama-server, verispec serve)"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="--endpoint: the server's API key"),
    model: Optional[str] = typer.Option(None, "--model", help="--endpoint: the served model name "
                                                              "(default: the only one it lists)"),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="--endpoint: the prompt as "
                                                                        "token ids, e.g. 9707,11,1879"),
    out: Optional[str] = typer.Option(None, "--out", help="--endpoint: JSONL of the raw samples; a "
                                                          "rerun reuses them and adds up to --n-samples"),
    reference_endpoint: Optional[str] = typer.Option(
        None, "--reference-endpoint", help="--endpoint: compare with this server's samples "
                                           "(two-sample) instead of the exact p of --target"),
    tolerance: Optional[float] = typer.Option(
        None, "--tolerance", help="--endpoint: the tolerance on the top-1 excess (observed rate of the "
                                  "reference's most probable token minus its expected rate; with "
                                  "--reference-endpoint the spec-on minus spec-off difference): pass "
                                  "when two one-sided tests at --significance put it inside ±tolerance "
                                  "(its 1 − 2·significance interval lies inside) [default: 0.02]"),
    position_tolerance: float = typer.Option(
        0.05, "--position-tolerance", help="--endpoint --per-position: a pass needs every position "
                                           "to detect this TV (mass moved top->2nd) with 80% power"),
    per_position: bool = typer.Option(False, "--per-position", help="--endpoint: the older per-position "
                                      "χ² audit (m <= 8, one observation per request and position)"),
    prompts_file: Optional[str] = typer.Option(None, "--prompts", help="--endpoint: a prompt set "
                                               "(Spec-Bench question.jsonl or one prompt per line)"),
    per_category: int = typer.Option(2, "--per-category", min=0, help="--endpoint --prompts: rows per "
                                     "category (0 = all)"),
    probes: str = typer.Option("none", "--probes", help="--endpoint: stateful probes, comma-separated "
                               "or 'all': cold-warm, shared-prefix, concurrency, context-limit, stream, "
                               "controls, logprobs"),
    report_dir: Optional[str] = typer.Option(None, "--report", help="--endpoint: write report.md, "
                                             "audit.json, pit.png and positions.png into this folder"),
    paired: bool = typer.Option(False, "--paired", help="--endpoint --reference-endpoint: request the "
                                "same seeds from both servers and compare completion by completion (valid "
                                "whatever the seeds do; far fewer tokens when speculation keeps the seeded "
                                "draw); default: disjoint seeds, permutation test"),
    local_decides: bool = typer.Option(False, "--local-decides", help="--endpoint --reference-endpoint: "
                                       "the local exact comparison decides too (only when the server "
                                       "runs the reference's very weights and kernels)"),
    context_length: Optional[int] = typer.Option(None, "--context-length", min=2, help="--endpoint: the "
                                                 "server's context length for the context-limit probe"),
    replay: bool = typer.Option(False, "--replay", help="--endpoint on verispec serve (k auto, coupled "
                                "rule): replay up to 50 completions locally with their seeds; each token "
                                "must equal the replay unless it is a near-tie"),
    numerics_margin: float = typer.Option(0.5, "--numerics-margin", min=0.0, help="--endpoint: logits/T "
                                          "within this of the argmax or of a top-k/top-p cut-off are "
                                          "near-ties (numerics, counted, not a FAIL); 0.5 fits verispec's own llama.cpp "
                                          "backend; a server with other kernels moves logits further (llama-server: "
                                          "1.1 against verispec's reference, 0.7 against --reference-kernels "
                                          "llama-server; benchmarks/audit/llama_server_logit_floor.py)"),
    concurrency: int = typer.Option(4, "--concurrency", help="--endpoint: requests in flight"),
    seed_check: bool = typer.Option(True, "--seed-check/--no-seed-check",
                                    help="--endpoint: check that seeds reproduce and vary samples"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                          help="--endpoint --target on llama.cpp: CPU threads of the "
                                               "local target (default: all cores)"),
    reference_kernels: str = typer.Option("verispec", "--reference-kernels",
                                          help="--endpoint --target on llama.cpp: how the local reference "
                                               "computes: 'verispec' (batch-invariant, flash attention "
                                               "off) or 'llama-server' (flash attention on, one token per "
                                               "forward: llama-server's own logits, bit for bit)"),
) -> None:
    """Prove and test losslessness: exact enumeration, a statistical audit of real runs, or
    (--endpoint) an audit of a running server against the exact p or a reference server."""
    if endpoint is not None:
        from .audit_endpoint import run_endpoint_audit

        if exact:
            fail("--exact enumerates toy models in-process; drop it to audit --endpoint")
        if per_position:
            if tolerance is not None:
                fail("--tolerance is the top-1-excess tolerance of the token-level audit; the "
                     "--per-position audit's tolerance is a total variation: use --position-tolerance")
            if m is not None and m > 8:
                fail(f"--per-position tests every position's conditional law: --m must be <= 8, got {m}")
            if paired:
                fail("--paired is a mode of the token-level audit; drop --per-position or --paired")
            run_endpoint_audit(endpoint=endpoint, api_key=api_key, model=model, prompt=prompt,
                               prompt_ids=prompt_ids, n_samples=n_samples or 2000, m=m or 3,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               significance=_significance(significance, alpha_alias),
                               tolerance=position_tolerance, out=out,
                               reference_endpoint=reference_endpoint, target=target, backend=backend,
                               concurrency=concurrency, seed_check=seed_check, as_json=as_json,
                               threads=threads, kernels=reference_kernels)
            return
        from .audit_endpoint import run_token_audit_cli

        controls = controls_from_options(min_p, repetition_penalty, presence_penalty, frequency_penalty,
                                         logit_bias, 0)
        if min_new_tokens or bad_word:
            fail("--min-new-tokens and --bad-word are not sent to servers (no common request field); "
                 "drop them for --endpoint")
        run_token_audit_cli(endpoint=endpoint, api_key=api_key, model=model, prompt=prompt,
                            prompt_ids=prompt_ids, prompts_file=prompts_file, per_category=per_category,
                            n_samples=n_samples or 50, m=m or 64,
                            sampling=sampling_or_fail(temperature, top_k, top_p, **controls),
                            significance=_significance(significance, alpha_alias),
                            tolerance=0.02 if tolerance is None else tolerance, out=out,
                            reference_endpoint=reference_endpoint, target=target, backend=backend,
                            concurrency=concurrency, probes=probes, report_dir=report_dir,
                            local_decides=local_decides, context_length=context_length,
                            margin=numerics_margin, as_json=as_json, seed_check=seed_check,
                            replay=replay, threads=threads, paired=paired, kernels=reference_kernels)
        return
    endpoint_only = {"--api-key": api_key, "--model": model, "--prompt-ids": prompt_ids, "--out": out,
                     "--reference-endpoint": reference_endpoint, "--tolerance": tolerance,
                     "--prompts": prompts_file, "--report": report_dir, "--paired": paired or None}
    given = [name for name, value in endpoint_only.items() if value is not None]
    if given:
        fail(f"{', '.join(given)} only apply with --endpoint URL (auditing a server)")
    from .. import audit as A
    from ..policy import FixedPolicy
    from ..verify import RULES

    n_samples = 2000 if n_samples is None else n_samples
    m = 3 if m is None else m
    if m > 8:
        fail(f"--m must be <= 8 for the in-process audit (it tests every position's law), got {m}")
    if n_samples < 10:
        fail(f"--n-samples must be >= 10 for the in-process audit, got {n_samples}")
    controls = controls_from_options(min_p, repetition_penalty, presence_penalty, frequency_penalty,
                                     logit_bias, min_new_tokens)
    sampling = sampling_or_fail(temperature, top_k, top_p, **controls)
    if min_new_tokens > m:
        fail(f"--min-new-tokens ({min_new_tokens}) must not exceed --m ({m})")
    significance = _significance(significance, alpha_alias)
    if rule not in RULES:
        fail(f"--rule must be one of {', '.join(RULES)}, got {rule!r}")
    verispec_rule = RULES[rule]
    if not exact and not prompt.strip():
        fail("--prompt is empty: give the text the audited samples continue")
    if exact:
        wanted = _rule_names(rules, A.RULE_NAMES + ("hf-assisted",))
        if "hf-assisted" in wanted:
            fail("--rules hf-assisted has no exact enumeration (transformers runs its own loop); "
                 "drop it, or leave out --exact for the statistical audit")
        p, q = A.seed_example()
        reports = A.audit_exact_rules(p, lambda: FixedPolicy(ModelDrafter(q), k), [0], n=3, k=k,
                                      sampling=sampling,
                                      rules={name: A.audited_rule(name, verispec_rule)
                                             for name in wanted})
        if as_json:
            print(json.dumps([r.to_dict() for r in reports], default=str))
        else:
            Console().print(A.exact_table(reports, title="Exact enumeration: seed example "
                                          "p=(.5,.3,.15,.05), q=(.6,.2,.1,.1), 3 tokens"))
        return
    if temperature == 0:
        fail("--temperature must be > 0: greedy output is deterministic, compare it with generate --compare")
    wanted = _rule_names(rules, A.RULE_NAMES + ("hf-assisted",))
    if drafter not in DRAFTERS:
        fail(f"--drafter must be one of {', '.join(DRAFTERS)} for an audit, got {drafter!r}")
    needs_model = DRAFTERS[drafter].needs_model
    decoder, backend = build_decoder(target, draft if needs_model else "none", backend, drafter,
                                     draft_layers)
    if needs_model and decoder.draft is None:
        fail(f"--drafter {drafter} needs a draft model (--draft)")
    ids = decoder.encode(prompt)
    # the controls on the real target: its EOS ids (min_new_tokens) and tokenized bad words
    sampling = sampling_or_fail(temperature, top_k, top_p, **controls,
                                bad_words_ids=bad_words_ids(decoder.tokenizer, bad_word),
                                eos_token_ids=decoder.target.eos_token_ids)
    try:
        sampling.check_vocab(decoder.target.vocab_size)
    except ValueError as e:
        fail(str(e))
    if sampling.has_controls and "hf-assisted" in wanted:
        fail("--rules hf-assisted runs transformers' own loop, which verispec cannot give its "
             "sampling controls; drop the controls or hf-assisted")
    (the_drafter,) = decoder.drafters.values()     # the one `drafter` names
    factory = lambda: FixedPolicy(the_drafter, k)  # noqa: E731
    built = A.rule_samplers(decoder.target, factory, ids, m, sampling, rule=verispec_rule,
                            rules=[name for name in wanted if name != "hf-assisted"])
    samplers = {"target": built["target"]}
    for name in wanted:
        if name != "hf-assisted":
            samplers[name] = built[name]
            continue
        if decoder.draft is None:
            fail("--rules hf-assisted needs a draft model (--drafter model --draft ...)")
        try:
            samplers[name] = A.hf_assisted_sampler(decoder.target, decoder.draft, ids, m,
                                                   temperature, top_k, top_p)
        except (ValueError, TypeError) as e:
            fail(f"--rules hf-assisted: {e}")
    err.print(f"audit: target {decoder.target.name} ({backend}), drafter {drafter}, k={k}, "
              f"verispec's rule {rule}, N={n_samples} samples of m={m} tokens per implementation, "
              f"significance {significance} (Bonferroni over {m + 1} tests), T={temperature}, "
              f"top-k={top_k}, top-p={top_p}"
              + (f", controls {({k: v for k, v in controls.items() if v}) }" if sampling.has_controls
                 or min_p else ""))
    reports = A.audit_rules(samplers, n_samples, m, significance)
    if as_json:
        print(json.dumps({name: r.to_dict() for name, r in reports.items()}, default=str))
        return
    console = Console()
    for name, report in reports.items():
        console.print(report.table())
