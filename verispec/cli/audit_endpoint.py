"""`verispec audit --endpoint URL`: audit a running OpenAI-compatible server.

Draws N completions of m tokens from the server (`verispec.audit.endpoint`) and
compares them with the target's exact p computed locally (``--target``) or with a
reference server's samples (``--reference-endpoint``), reporting per position the
test, p-value, TV with its interval, the smallest detectable TV and the numerics
floor (`verispec.audit.reference`), plus the cheap seed check.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Optional

from rich.console import Console

from .common import err, fail

_REFERENCE_SEEDS = 1_000_000_000     # the reference server's seeds: disjoint from the endpoint's


#: --reference-kernels: how the local reference computes its logits
REFERENCE_KERNELS = ("verispec", "llama-server")


def load_reference(target: str, backend: str | None, threads: int | None, role: str,
                   kernels: str = "verispec"):
    """Load `--target` (the local reference model) on `backend` (default: this machine's);
    any registry, file or backend error exits with a message naming --target.

    kernels "llama-server": llama.cpp with flash attention on (llama-server's CPU default)
    and one token per forward after the prompt (`LlamaCppModel.stepwise`), which computes
    llama-server's spec-off logits bit for bit (benchmarks/audit/llama_server_match.py:
    628/628 positions); verispec's default reference moves a top-2 gap by up to 1.03 from
    them. Anything else exits naming --reference-kernels."""
    from ..api import load_model   # deferred: torch and the backends load only when asked for
    from .common import default_backend

    if kernels not in REFERENCE_KERNELS:
        fail(f"--reference-kernels must be one of {', '.join(REFERENCE_KERNELS)}; got {kernels!r}")
    backend = backend or default_backend()
    if kernels == "llama-server" and backend != "llamacpp":
        fail(f"--reference-kernels llama-server needs --backend llamacpp (got {backend})")
    options = {"batch_invariant": False, "flash_attn": True} if kernels == "llama-server" else {}
    try:
        with err.status(f"loading {target} ({backend}) {role}"):
            model = load_model(target, backend=backend, n_threads=threads, **options)
    except Exception as e:  # noqa: BLE001 (registry, file and backend errors alike)
        fail(f"--target {target}: {e}")
    if kernels == "llama-server":
        model.stepwise = True
    return model


def parse_prompt_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' or '[1, 2, 3]' -> ids, or a clear error naming --prompt-ids."""
    items = text.replace("[", " ").replace("]", " ").replace(",", " ").split()
    try:
        ids = [int(t) for t in items]
    except ValueError:
        fail(f"--prompt-ids must be token ids separated by commas, e.g. 1,2,3; got {text!r}")
    if not ids or any(i < 0 for i in ids):
        fail(f"--prompt-ids must hold at least one id >= 0; got {text!r}")
    return ids


def run_endpoint_audit(*, endpoint: str, api_key: Optional[str], model: Optional[str], prompt: str,
                       prompt_ids: Optional[str], n_samples: int, m: int, temperature: float,
                       top_k: int, top_p: float, significance: float, tolerance: float,
                       out: Optional[str], reference_endpoint: Optional[str], target: Optional[str],
                       backend: Optional[str], concurrency: int, seed_check: bool, as_json: bool,
                       threads: Optional[int] = None, kernels: str = "verispec") -> None:
    """The `--endpoint` mode of `verispec audit` (its options, already parsed)."""
    from .. import __version__
    from ..audit.endpoint import Endpoint, EndpointError, EndpointSettings, draw_samples
    from ..audit.endpoint import seed_check as check_seeds
    from ..audit.numerics import numerics_floor
    from ..audit.reference import compare_exact, compare_two_sample, target_next_probs
    from ..sampling import SamplingConfig

    if temperature <= 0:
        fail("--temperature must be > 0: an audit compares sampled distributions")
    if reference_endpoint is None and target is None:
        fail("--endpoint needs a reference: --target NAME (the same weights, loaded here: exact p) "
             "or --reference-endpoint URL (e.g. the same server without a draft)")
    if not 0 < tolerance < 1:
        fail(f"--tolerance is a total variation in (0, 1), e.g. 0.05; got {tolerance}")
    if concurrency < 1:
        fail(f"--concurrency must be >= 1, got {concurrency}")
    try:
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as e:
        fail(str(e).replace("top_k", "--top-k").replace("top_p", "--top-p"))
    start = time.perf_counter()
    target_model = None
    if target is not None:
        target_model = load_reference(target, backend, threads, "for the exact reference", kernels)
    ids_note = None
    if prompt_ids is not None:
        the_prompt: str | tuple[int, ...] = tuple(parse_prompt_ids(prompt_ids))
    elif target_model is not None and target_model.tokenizer is not None:
        # the server gets the ids the reference is computed for (no tokenisation mismatch)
        the_prompt = tuple(int(i) for i in target_model.tokenizer.encode(prompt))
        ids_note = f"--prompt tokenised by {target}'s tokenizer and sent as ids"
    else:
        if not prompt.strip():
            fail("--prompt is empty: give the text the audited samples continue (or --prompt-ids)")
        the_prompt = prompt
    ep = Endpoint(endpoint, model or "", api_key=api_key)
    info: dict = {"command": "verispec audit --endpoint", "verispec": __version__,
                  "machine": f"{platform.machine()} {platform.node()}", "python": platform.python_version()}
    try:
        # re-reading a complete --out (another --significance, say) needs no server
        reread = (out is not None and os.path.exists(out) and model is not None and not seed_check
                  and reference_endpoint is None)
        if not reread:
            names = ep.models()
            if model is None:
                if len(names) != 1:
                    fail(f"--model is needed: {endpoint} serves {', '.join(names) or 'no model'}")
                ep.model = model = names[0]
            ep.check_model()
        settings = EndpointSettings(endpoint, model, the_prompt, m, temperature, top_k, top_p)
        err.print(f"audit: {endpoint} model {model}, N = {n_samples} samples of m = {m} tokens, "
                  f"T = {temperature}, top-k = {top_k}, top-p = {top_p}, significance {significance} "
                  f"(Bonferroni over {m + 1} tests)")
        samples = draw_samples(ep, settings, n_samples, out=out, concurrency=concurrency, desc="endpoint")
        seeds = check_seeds(ep, settings) if seed_check else None
        ref_samples = None
        if reference_endpoint is not None:
            ref = Endpoint(reference_endpoint, model, api_key=api_key)
            ref.check_model()
            ref_settings = EndpointSettings(reference_endpoint, model, the_prompt, m, temperature, top_k, top_p)
            ref_out = None if out is None else (out[:-6] if out.endswith(".jsonl") else out) + ".reference.jsonl"
            ref_samples = draw_samples(ref, ref_settings, n_samples, out=ref_out, seed_offset=_REFERENCE_SEEDS,
                                       concurrency=concurrency, desc="reference")
            info["reference_id_source"] = ref.mode
    except EndpointError as e:
        fail(str(e))
    ids = [s.token_ids for s in samples]
    floor = None
    if target_model is not None:
        prompt_list = list(the_prompt) if not isinstance(the_prompt, str) else target_model.tokenizer.encode(prompt)
        full = [tuple(s) for s in ids if len(s) == m]
        if full:
            path = max(set(full), key=full.count)
            floor = numerics_floor(target_model, prompt_list, list(path), sampling)
            info["numerics_path"] = list(path)
    label = f"{endpoint} ({model})"
    if ref_samples is not None:
        report = compare_two_sample(ids, [s.token_ids for s in ref_samples], m, significance=significance,
                                    tolerance=tolerance, floor=floor, endpoint=label,
                                    reference=f"{reference_endpoint} ({model})")
    else:
        prompt_list = list(the_prompt) if not isinstance(the_prompt, str) else target_model.tokenizer.encode(prompt)
        sampling_eos = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        report = compare_exact(ids, m, target_next_probs(target_model, prompt_list, sampling_eos),
                               significance=significance, tolerance=tolerance,
                               stop_ids=sorted(target_model.eos_token_ids), floor=floor,
                               endpoint=label, reference=f"exact p of {target}")
    if target_model is not None:
        info["numerics_kernels"] = (f"{target} ({backend}"
                                    + (", batch-invariant" if getattr(target_model, "batch_invariant", False)
                                       else "") + ") on this machine")
    if ep.mode is None and samples:     # nothing drawn now: every sample came from --out
        ep.mode = samples[0].source
        info["reread"] = f"all {n_samples} samples read from {out}; the server was not contacted"
    info.update(settings=settings.key(), id_source=ep.mode, retries=ep.retried,
                dropped_fields=sorted(ep.dropped), seconds=round(time.perf_counter() - start, 1))
    if ids_note:
        info["prompt_note"] = ids_note
    if ep.mode == "retokenised":
        info["warning"] = ("token ids were not returned: the text was re-tokenised by the server's "
                           "/tokenize, which can differ from the sampled ids")
    if seeds is not None:
        info["seed_check"] = {"reproducible": seeds.reproducible, "varies": seeds.varies, "tries": seeds.tries}
    report.info = info
    if as_json:
        print(json.dumps(report.to_dict(), default=str))
        return
    console = Console()
    console.print(report.table())
    console.print(f"token ids: {ep.mode}" + (f" ({info['warning']})" if "warning" in info else "")
                  + (f"; {ids_note}" if ids_note else "") + f"; retries {ep.retried}")
    if seeds is not None:
        console.print(f"seed check: same seed twice → {'same' if seeds.reproducible else 'DIFFERENT'} "
                      f"tokens; {seeds.tries} other seeds → {'vary' if seeds.varies else 'all the same'}")


def _parse_probes(probes: str) -> list[str]:
    from ..audit.probes import PROBES

    text = probes.strip().lower()
    if text in ("", "none"):
        return []
    if text == "all":
        return list(PROBES)
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in PROBES]
    if unknown:
        fail(f"--probes: unknown {', '.join(unknown)}; choose from all, none, {', '.join(PROBES)}")
    return names


def run_token_audit_cli(*, endpoint: str, api_key: Optional[str], model: Optional[str], prompt: str,
                        prompt_ids: Optional[str], prompts_file: Optional[str], per_category: int,
                        n_samples: int, m: int, sampling, significance: float, tolerance: float,
                        out: Optional[str], reference_endpoint: Optional[str], target: Optional[str],
                        backend: Optional[str], concurrency: int, probes: str, report_dir: Optional[str],
                        local_decides: bool, context_length: Optional[int], margin: float, as_json: bool,
                        seed_check: bool = True, replay: bool = False, threads: Optional[int] = None,
                        paired: bool = False, kernels: str = "verispec") -> None:
    """The token-level `--endpoint` audit (every token counts; `verispec.audit.tokens`)."""
    from .. import __version__
    from ..audit.endpoint import Endpoint, EndpointError
    from ..audit.render import text, write_report
    from ..audit.tokens import run_token_audit
    from ..text import decode_text

    if target is None:
        fail("--endpoint needs --target NAME: the local reference that scores every token (the "
             "server's own weights; with --reference-endpoint it is only a scoring function)")
    if not 0 < tolerance < 1:
        fail(f"--tolerance is on the top-1 excess (a probability difference) and must be in (0, 1), "
             f"e.g. 0.02; got {tolerance}")
    if concurrency < 1:
        fail(f"--concurrency must be >= 1, got {concurrency}")
    names = _parse_probes(probes)
    if paired and reference_endpoint is None:
        fail("--paired compares two servers: give the spec-off one as --reference-endpoint URL")
    reference = load_reference(target, backend, threads, "as the reference", kernels)
    tok = reference.tokenizer
    if prompt_ids is not None:
        prompts = [parse_prompt_ids(prompt_ids)]
    elif prompts_file is not None:
        from ..prompts import PromptError, load_prompts
        try:
            rows = load_prompts(prompts_file, per_category=per_category)
        except (FileNotFoundError, PromptError) as e:
            fail(f"--prompts {prompts_file}: {e}")
        if tok is None:
            fail(f"--prompts needs a tokenizer, and {target} has none; pass --prompt-ids")
        prompts = [list(tok.encode(r.text)) for r in rows]
    else:
        if not prompt.strip():
            fail("--prompt is empty: give the text the audited samples continue (or --prompts FILE)")
        if tok is None:
            fail(f"{target} has no tokenizer; pass the prompt as --prompt-ids")
        prompts = [list(tok.encode(prompt))]
    prompts = [p for p in prompts if p]
    if not prompts:
        fail("every prompt tokenised to nothing; give non-empty prompts")
    vocab = reference.vocab_size
    bad = [t for p in prompts for t in p if not 0 <= t < vocab]
    if bad:
        fail(f"--prompt-ids holds id {bad[0]}, outside the reference's vocabulary 0..{vocab - 1}")
    ep = Endpoint(endpoint, model or "", api_key=api_key)
    ref_ep = None
    try:
        names_served = ep.models()
        if model is None:
            if len(names_served) != 1:
                fail(f"--model is needed: {endpoint} serves {', '.join(names_served) or 'no model'}")
            ep.model = model = names_served[0]
        ep.check_model()
        if reference_endpoint is not None:
            ref_ep = Endpoint(reference_endpoint, model, api_key=api_key)
            ref_ep.check_model()
        err.print(f"audit: {endpoint} ({model}), {len(prompts)} prompt(s) × N = {n_samples} × m = {m}, "
                  f"T = {sampling.temperature}, significance {significance} for the whole verdict, "
                  f"tolerance ±{tolerance} on the top-1 excess"
                  + (f", probes {', '.join(names)}" if names else ""))
        replayer = None
        if replay:
            from ..api import SpeculativeDecoder
            # the coupled rule's output is the plain seeded sample whatever k: no draft needed
            replayer = {"decoder": SpeculativeDecoder(reference, None, drafter="none"), "k": 0, "rule": "gumbel",
                        "limit": 50}    # 50 completions: a clean mismatch is a FAIL, one suffices
        seeds = None
        if seed_check and not sampling.greedy:
            from ..audit.endpoint import EndpointSettings
            from ..audit.endpoint import seed_check as check_seeds
            seeds = check_seeds(ep, EndpointSettings(endpoint, model, tuple(prompts[0]), min(m, 16),
                                                     sampling.temperature, sampling.top_k, sampling.top_p))
        audit = run_token_audit(ep, reference, prompts, n_samples, m, sampling, significance=significance,
                                tolerance=tolerance, reference_endpoint=ref_ep, local_decides=local_decides,
                                probes=names, out=out, concurrency=concurrency, margin=margin,
                                context_length=context_length,
                                detokenize=(lambda ids: decode_text(tok, ids)) if tok is not None else None,
                                progress=not as_json, replay=replayer, paired=paired)
    except EndpointError as e:
        hint = f" (what was collected is kept in {out}.p*.jsonl: rerun the same command to resume)" if out else ""
        fail(f"{e}{hint}")
    except ValueError as e:
        fail(str(e))
    if seeds is not None:
        audit.info["seed_check"] = {"reproducible": seeds.reproducible, "varies": seeds.varies}
        if not seeds.reproducible:
            audit.info["seed_warning"] = ("the server ignores `seed` (one seed gave two different "
                                          "completions): the samples are still independent draws, but "
                                          "a rerun cannot reproduce them")
        if not seeds.varies:
            audit.info["warning"] = ("5 different seeds gave the same completion: the server ignores "
                                     "`seed` and `temperature`, or p is nearly a point mass here")
    audit.info.update(command="verispec audit --endpoint", verispec=__version__,
                      machine=f"{platform.machine()} {platform.node()}", python=platform.python_version(),
                      target=target, backend=backend)
    if report_dir is not None:
        for path in write_report(audit, report_dir):
            err.print(f"wrote {path}")
    if as_json:
        print(json.dumps(audit.to_dict(), default=str))
        return
    print(text(audit))
