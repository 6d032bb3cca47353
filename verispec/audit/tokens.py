"""The token-level endpoint audit: draw → score → statistics → verdict (one run).

`run_token_audit` draws N completions of m tokens for each prompt of a set from the
audited endpoint (`verispec.audit.endpoint.draw_samples`, seeds disjoint across
prompts and arms, resumable through ``out``), scores each completion once with the
local reference by teacher forcing (`verispec.audit.scoring`), pools the per-token
statistics (`verispec.audit.tokenstats`), and reaches a verdict
(`verispec.audit.verdict`) together with the stateful probes (`verispec.audit.probes`).

Which comparison decides:

* without a reference endpoint: the token statistics against the local exact p
  (right when the server runs the reference's very weights and kernels, e.g.
  ``verispec serve``; elsewhere numerics alone can make them reject);
* with ``reference`` (the same server, speculation off): the completion-level
  spec-on vs spec-off comparison (`verispec.audit.twosample`) decides, and the local
  comparison is reported beside it (``local_decides=True`` puts both in the family).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..models.base import CausalLM
from ..sampling import SamplingConfig
from .endpoint import Endpoint, EndpointSettings, draw_samples
from .probes import ProbeContext, ProbeResult, attribute_to_spec_off, run_probes
from .scoring import NEAR_TIE_MARGIN, TokenScores, score_completion, stack
from .tokenstats import Effect, per_position, token_effects
from .twosample import paired_effects, two_sample_effects
from .verdict import decide, equivalence_interval, greedy_divergences, greedy_pair_divergences, impossible_tokens

__all__ = ["TokenAudit", "controls_of", "run_token_audit", "score_samples"]

#: the reference arm's seeds start here: disjoint from the audited arm's
REFERENCE_SEEDS = 1_000_000_000


@dataclass
class TokenAudit:
    """The result (``verispec.audit.render`` prints it; ``to_dict`` for --json)."""

    endpoint: str
    reference: str
    prompts: int
    n: int
    m: int
    tokens: int
    sampling: dict
    significance: float
    tolerance: float
    decisive: list[Effect]
    beside: list[Effect]
    positions: list[dict]
    impossible: int
    near_ties: int
    greedy: list[dict]
    probes: list[ProbeResult]
    verdict: str
    reasons: list[str]
    tokens_needed: int | None
    error_rate: str
    pit: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["decisive"] = [e.to_dict() for e in self.decisive]
        d["beside"] = [e.to_dict() for e in self.beside]
        d["probes"] = [p.to_dict() for p in self.probes]
        return d


def controls_of(sampling: SamplingConfig) -> tuple:
    """The request fields of `sampling`'s controls, as `EndpointSettings.controls` pairs."""
    out = []
    for name, off in (("min_p", 0.0), ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                      ("frequency_penalty", 0.0)):
        if getattr(sampling, name) != off:
            out.append((name, getattr(sampling, name)))
    if sampling.logit_bias:
        out.append(("logit_bias", tuple(sampling.logit_bias)))
    return tuple(out)


def _draw(ep: Endpoint, prompts: Sequence[Sequence[int]], n: int, m: int, sampling: SamplingConfig,
          out: str | None, seed0: int, concurrency: int, progress: bool):
    """{prompt index: [Sample]} (one resumable file per prompt: OUT.pJ.jsonl)."""
    drawn = {}
    for j, prompt in enumerate(prompts):
        settings = EndpointSettings(ep.url, ep.model, tuple(int(t) for t in prompt), m, sampling.temperature,
                                    sampling.top_k, sampling.top_p, controls_of(sampling))
        path = None if out is None else (out.removesuffix(".jsonl")) + f".p{j}.jsonl"
        drawn[j] = draw_samples(ep, settings, n, out=path, seed_offset=seed0 + j * n, concurrency=concurrency,
                                progress=progress, desc=f"prompt {j + 1}/{len(prompts)}")
    return drawn


def score_samples(reference: CausalLM, prompts: Sequence[Sequence[int]], drawn: dict, sampling: SamplingConfig,
                  *, seed: int = 0, margin: float = NEAR_TIE_MARGIN) -> list[TokenScores]:
    """Every non-empty completion scored once (teacher forcing), in prompt then index order."""
    scores = []
    for j, samples in drawn.items():
        for i, s in enumerate(samples):
            if s.token_ids:
                scores.append(score_completion(reference, prompts[j], s.token_ids, sampling, prompt_index=j,
                                               index=i, seed=seed, margin=margin))
    return scores


def run_token_audit(endpoint: Endpoint, reference: CausalLM, prompts: Sequence[Sequence[int]], n: int, m: int,
                    sampling: SamplingConfig, *, significance: float = 0.01, tolerance: float = 0.02,
                    reference_endpoint: Endpoint | None = None, local_decides: bool = False,
                    probes: Sequence[str] = (), out: str | None = None, concurrency: int = 4,
                    margin: float = NEAR_TIE_MARGIN, context_length: int | None = None,
                    detokenize=None, seed: int = 0, progress: bool = False,
                    replay: dict | None = None, paired: bool = False) -> TokenAudit:
    """Audit `endpoint` (module doc).

    Args:
        endpoint: the audited server (model already checked).
        reference: the local reference model (scoring function; exact p when the
            server runs its weights), with the same vocabulary.
        prompts: prompt token ids, one list per prompt (>= 1 prompt).
        n: completions per prompt (per arm); m: max tokens per completion.
        sampling: the request's temperature, top-k/top-p and controls (0 = greedy).
        significance: family-wise level of the whole verdict; tolerance: on the top-1
            excess (probability units; the spec-on − spec-off difference with a
            reference endpoint).
        reference_endpoint: the same server with speculation off (decides when given).
        paired: the reference arm requests the audited arm's very seeds and the arms are
            compared pair by pair (`verispec.audit.twosample.paired_effects`); default:
            disjoint seeds and the stratified permutation test.
        probes: names from `verispec.audit.probes.PROBES`.
        out: JSONL stem for the raw samples (resumable); margin: the numerics floor
            in logits / T (near-ties); context_length, detokenize: for the probes.
        replay: seed-synced replay (`verispec.audit.replay.replay_check`'s ``decoder``,
            ``k``, ``rule``, ``limit``): the server must be verispec's own sampler.

    Returns:
        `TokenAudit`.

    Raises:
        EndpointError: from drawing; ValueError: bad arguments (named), or tokens
            outside the reference's vocabulary (`score_completion`).
    """
    if n < 1 or m < 1:
        raise ValueError(f"n and m must be >= 1, got n={n}, m={m}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    start = time.perf_counter()
    drawn = _draw(endpoint, prompts, n, m, sampling, out, seed, concurrency, progress)
    scores = score_samples(reference, prompts, drawn, sampling, seed=seed, margin=margin)
    tok = stack(scores)
    ref_scores = None
    if reference_endpoint is not None:
        ref_out = None if out is None else (out.removesuffix(".jsonl")) + ".reference"
        ref_drawn = _draw(reference_endpoint, prompts, n, m, sampling, ref_out,
                          seed if paired else seed + REFERENCE_SEEDS, concurrency, progress)
        # paired: the same PIT randomisation V on both arms, so equal completions give equal
        # summaries (V is independent of both arms, so E D = 0 still holds under H0)
        ref_scores = score_samples(reference, prompts, ref_drawn, sampling, seed=seed if paired else seed + 1,
                                   margin=margin)
    sampled = not sampling.greedy
    n_local = 3 if sampled else 0
    n_two = 2 if (ref_scores is not None and sampled) else 0
    family = n_two + (n_local if (ref_scores is None or local_decides) else 0)
    level = significance / max(family, 1)
    local = token_effects(tok, level) if sampled else []
    if not n_two:
        two = []
    elif paired:
        two = paired_effects(scores, ref_scores, level, [(j, i) for j in drawn for i in range(len(drawn[j]))])
    else:
        two = two_sample_effects(scores, ref_scores, level, seed=seed)
    decisive = two + (local if (ref_scores is None or local_decides) else [])
    beside = [] if (ref_scores is None or local_decides) else local
    bad, near, examples = impossible_tokens(tok)
    greedy = greedy_divergences(tok, margin)
    greedy_local = None
    if not sampled and ref_scores is not None and not local_decides:
        # spec-off decides: the servers' greedy outputs against each other; the local argmax
        # comparison (other kernels) is reported beside
        greedy_local, greedy = greedy, greedy_pair_divergences(scores, ref_scores, margin)
    probe_results = []
    if probes:
        ctx = ProbeContext(endpoint, reference, [list(p) for p in prompts], m=min(m, 32), margin=margin,
                           detokenize=detokenize, context_length=context_length, seed=seed)
        probe_results = run_probes(ctx, probes)
        if reference_endpoint is not None:    # does *speculation* change it? (probes module)
            ctx_off = replace(ctx, endpoint=reference_endpoint)   # the same prompts (its nonce)
            probe_results = attribute_to_spec_off(probe_results, ctx_off)
    if replay is not None:
        from .replay import replay_check
        probe_results.append(replay_check(replay["decoder"], prompts, drawn, sampling, k=replay.get("k", 0),
                                          rule=replay.get("rule", "gumbel"), margin=margin,
                                          limit=replay.get("limit")))
    v = decide(decisive, significance, tolerance, impossible=bad, impossible_examples=examples,
               greedy=greedy, probes=probe_results)
    if not sampled and v.verdict == "inconclusive" and tok:     # greedy: every token was checked
        matches = int(tok["top1"].sum()) if tok else 0
        v.verdict = "pass"
        if greedy_local is None:
            v.reasons = [f"greedy: {matches}/{len(tok.get('tokens', []))} tokens are the reference's argmax, "
                         f"{sum(g['kind'] == 'numerics' for g in greedy)} divergences within the numerics floor"]
        else:
            v.reasons = [f"greedy: {len(scores) - len(greedy)}/{len(scores)} completions equal spec-off's, "
                         f"{len(greedy)} diverge within the numerics floor"]
    hist = np.histogram(tok["pit"][tok["pmax"] < 1], bins=20, range=(0, 1))[0].tolist() if tok else []
    info = {"seconds": round(time.perf_counter() - start, 1), "id_source": endpoint.mode,
            "retries": endpoint.retried, "margin": margin,
            "truncated": sum(1 for ss in drawn.values() for s in ss if len(s.token_ids) < m)}
    if greedy_local is not None:
        info["greedy_vs_local_argmax"] = {
            "divergences": len(greedy_local), "beyond_floor": sum(g["kind"] == "bug" for g in greedy_local),
            "note": "beside, not deciding: the local reference runs other kernels than the server"}
    if endpoint.mode == "retokenised":
        info["warning"] = ("the server returned no token ids: its text was re-tokenised, which can differ "
                           "from the sampled ids, so this audit is weaker (a tokenisation mismatch looks "
                           "like a bias)")
    # the tolerance statistic is shown with the interval its pass decision uses (verdict module)
    decisive, beside = ([replace(e, ci=equivalence_interval(e, significance), level=2 * significance)
                         if e.role == "tolerance" else e for e in es] for es in (decisive, beside))
    return TokenAudit(endpoint.url, reference_endpoint.url if reference_endpoint else f"exact p of {reference.name}",
                      len(prompts), n, m, len(tok.get("tokens", [])) if tok else 0,
                      {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                       "controls": [list(c) for c in controls_of(sampling)]},
                      significance, tolerance, decisive, beside, per_position(tok, significance) if sampled else [],
                      bad, near, greedy, probe_results, v.verdict, v.reasons, v.tokens_needed, v.error_rate,
                      hist, info)
