"""Auditing exactness: exact enumeration on toy models, statistical tests on real runs.

Speculative decoding is lossless when the tokens it commits are distributed exactly
as tokens sampled from the target alone (Leviathan et al. 2023, Appendix A.1; Chen
et al. 2023, Theorem 1). Two complementary checks, each on the *shipped*
`verispec.decoding.decode` loop with the acceptance rule passed as its ``rule``
parameter:

1. **Exact enumeration** on float64 toy models: every execution path of the loop
   is replayed and weighed, and the output distribution must equal the target's
   to ~1e-15 in total variation. A broken rule is caught as a biased distribution,
   or earlier, as an acceptance pattern its probability cannot produce.
2. **Statistical audit** of real runs: N seeded samples from the target alone and
   from each implementation, homogeneity tests per position and on the joint
   prefix, a TV estimate with a bootstrap interval, and a verdict.

Rooms, one idea each (read them top to bottom):

| module | what it holds |
|---|---|
| `rules` | the rules audited: `as_rule`, the biased shortcuts (`NAIVE_RULES`), rule names |
| `toys` | float64 toy models: `toy_random_model`, `toy_fixed_model`, `seed_example` |
| `runs` | a fresh policy per run, the policy state paths share, one thread for toys |
| `enumeration` | the replay enumerator (`Enumerator`, `AuditError`) |
| `exact` | `exact_distribution`, `target_distribution`, `audit_exact(_rules)`, `ExactReport` |
| `homogeneity` | two-sample statistics: χ²/G homogeneity test, TV bootstrap |
| `statistical` | `audit_samples`, `statistical_audit`, `audit_rules`, `AuditReport` |
| `samplers` | ``seed -> tokens`` samplers: `decode_sampler`, `rule_samplers`, `hf_assisted_sampler` |
| `endpoint` | a running OpenAI-compatible server's samples as token ids: `Endpoint`, `draw_samples`, `seed_check` |
| `goodness` | χ² goodness of fit to a known p, per position given the prefix (the exact reference) |
| `power` | the smallest TV a χ² test detects with 80 % power (`detectable_tv`, `samples_for`) |
| `numerics` | the numerics floor: TV between p of 1-token forwards and of a verification forward |
| `reference` | the per-position endpoint audit: `compare_exact`, `compare_two_sample`, `EndpointReport` |
| `scoring` | teacher forcing: the reference's p at every generated token; randomized PIT, top-1, log-likelihood |
| `tokenstats` | pooled per-token effects with exact variances, intervals, detectable effects (80 % power) |
| `twosample` | spec-on vs spec-off: completion-level summaries, stratified permutation test |
| `verdict` | pass / FAIL / inconclusive: tolerance, Holm over the family, impossible tokens, greedy divergences |
| `probes` | stateful probes: cold/warm, shared prefix, concurrency, context limit, stream, controls, logprobs |
| `tokens` | the token-level endpoint audit, one run: draw → score → statistics → verdict (`run_token_audit`) |
| `render` | its report: 80-column text, markdown, PIT and per-position PNGs |
| `zoo` | the bug zoo: a toy speculative server over HTTP, exact or with one public bug (`zoo_app`) |

Everything public of the in-process audit is re-exported here: ``from verispec.audit import X``;
the endpoint audit's rooms are imported by name (``verispec.audit.endpoint``, ...).
"""

from .enumeration import AuditError, Distribution
from .exact import (
    ExactReport, audit_exact, audit_exact_rules, exact_distribution, exact_table, marginal,
    target_distribution, total_variation,
)
from .homogeneity import HomogeneityResult
from .rules import (
    NAIVE_RULES, RULE_NAMES, always_accept_verify, as_rule, audited_rule, naive_agree_verify,
)
from .samplers import decode_sampler, hf_assisted_sampler, rule_samplers
from .statistical import AuditReport, Sampler, audit_rules, audit_samples, draw_samples, statistical_audit
from .toys import seed_example, toy_fixed_model, toy_random_model

__all__ = [
    "AuditError", "ExactReport", "AuditReport", "HomogeneityResult",
    "as_rule", "naive_agree_verify", "always_accept_verify", "NAIVE_RULES", "RULE_NAMES",
    "audited_rule",
    "exact_distribution", "target_distribution", "total_variation", "marginal",
    "audit_exact", "audit_exact_rules", "exact_table",
    "statistical_audit", "audit_samples", "audit_rules", "draw_samples",
    "decode_sampler", "rule_samplers", "hf_assisted_sampler",
    "toy_random_model", "toy_fixed_model", "seed_example",
    "Distribution", "Sampler",
]
