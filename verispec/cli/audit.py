"""`verispec audit`: exact enumeration and statistical audit of losslessness."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from .common import BACKEND, DRAFT, TARGET, build_decoder, err, fail, sampling_or_fail


def audit(
    prompt: str = typer.Option("Repeat after me: red, green, blue, red, green, blue, red, green",
                               "--prompt", help="fixed prompt the samples continue"),
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", min=1,
                                               help="keep only the draft's first N layers ('--draft self')"),
    backend: Optional[str] = BACKEND,
    drafter: str = typer.Option("model", "--drafter", help="model or lookup"),
    k: int = typer.Option(3, "--k", min=1, help="draft length"),
    n_samples: int = typer.Option(2000, "--n-samples", min=10, help="samples per implementation (N)"),
    m: int = typer.Option(3, "--m", min=1, max=8, help="new tokens per sample"),
    alpha_level: float = typer.Option(0.01, "--alpha", help="significance level (Bonferroni-corrected)"),
    temperature: float = typer.Option(1.0, "--temperature", help="> 0: an audit needs sampling"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    rules: str = typer.Option("verispec,naive-agree,naive-always-accept", "--rules",
                              help="implementations to audit: verispec, naive-agree, naive-always-accept, hf-assisted"),
    exact: bool = typer.Option(False, "--exact", help="only the exact enumeration on toy models (seconds, no model)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Prove and test losslessness: exact enumeration, and a statistical audit of real runs."""
    from .. import audit as A
    from ..drafters.lookup import LookupDrafter
    from ..drafters.model import ModelDrafter
    from ..policy import FixedPolicy

    sampling = sampling_or_fail(temperature, top_k, top_p)
    if not 0 < alpha_level < 1:
        fail(f"--alpha is a significance level and must be in (0, 1), e.g. 0.01; got {alpha_level}")
    if not exact and not prompt.strip():
        fail("--prompt is empty: give the text the audited samples continue")
    if exact:
        p, q = A.seed_example()
        reports = A.audit_exact_rules(p, lambda: FixedPolicy(ModelDrafter(q), k), [0], n=3, k=k,
                                      sampling=sampling)
        if as_json:
            print(json.dumps([r.to_dict() for r in reports], default=str))
        else:
            Console().print(A.exact_table(reports, title="Exact enumeration: seed example "
                                          "p=(.5,.3,.15,.05), q=(.6,.2,.1,.1), 3 tokens"))
        return
    if temperature == 0:
        fail("--temperature must be > 0: greedy output is deterministic, compare it with generate --compare")
    wanted = [r.strip() for r in rules.split(",") if r.strip()]
    if not wanted:
        fail("--rules is empty: name one or more of verispec, naive-agree, naive-always-accept, hf-assisted")
    unknown = set(wanted) - {"verispec", "naive-agree", "naive-always-accept", "hf-assisted"}
    if unknown:
        fail(f"--rules: unknown {sorted(unknown)}; choose from verispec, naive-agree, "
              "naive-always-accept, hf-assisted")
    if drafter not in ("model", "lookup"):
        fail(f"--drafter must be model or lookup for an audit, got {drafter!r}")
    decoder, backend = build_decoder(target, draft if drafter == "model" else "none", backend, drafter,
                                     draft_layers)
    if drafter == "model" and decoder.draft is None:
        fail("--drafter model needs a draft model (--draft)")
    ids = decoder.encode(prompt)
    the_drafter = ModelDrafter(decoder.draft) if drafter == "model" else LookupDrafter()
    factory = lambda: FixedPolicy(the_drafter, k)  # noqa: E731
    all_samplers = A.rule_samplers(decoder.target, factory, ids, m, sampling)
    samplers = {"target": all_samplers["target"]}
    for name in wanted:
        if name == "hf-assisted":
            if backend != "transformers" or decoder.draft is None:
                fail("--rules hf-assisted needs --backend transformers and a draft model")
            samplers[name] = A.hf_assisted_sampler(decoder.target.model, decoder.draft.model, ids, m,
                                                   temperature, top_k, top_p)
        else:
            samplers[name] = all_samplers[name]
    err.print(f"audit: target {decoder.target.name} ({backend}), drafter {drafter}, k={k}, "
              f"N={n_samples} samples of m={m} tokens per implementation, significance {alpha_level} "
              f"(Bonferroni over {m + 1} tests), T={temperature}, top-k={top_k}, top-p={top_p}")
    reports = A.audit_rules(samplers, n_samples, m, alpha_level)
    if as_json:
        print(json.dumps({name: r.to_dict() for name, r in reports.items()}, default=str))
        return
    console = Console()
    for name, report in reports.items():
        console.print(report.table())

