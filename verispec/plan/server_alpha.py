"""α from a live server: per-position acceptance read from its Prometheus ``/metrics``.

vLLM (v1 engine, ``vllm/v1/spec_decode/metrics.py``) and ``verispec serve``
(:mod:`verispec.serve.metrics`) export the same counters, ``vllm:`` or ``verispec:``
prefixed, each with or without a ``model_name`` label (vLLM adds ``engine`` too):

* ``spec_decode_num_drafts_total`` - verification rounds that carried drafts, D;
* ``spec_decode_num_draft_tokens_total`` - draft tokens proposed;
* ``spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` (0-based) - A_i, the
  rounds whose draft at position i was accepted, so whose drafts 0..i all were
  (acceptance stops at the first rejection).

The acceptance rate at draft position i + 1 given the i before it were accepted (the
α_{i+1} of :func:`verispec.theory.expected_tokens_positional`) is therefore

    α_1 = A_0 / D,    α_{i+1} = A_i / A_{i-1}                  (i >= 1)

a binomial proportion: successes A_i out of A_{i-1} trials. Its interval is the
Jeffreys interval, the Beta(A_i + ½, A_{i-1} − A_i + ½) quantiles (Brown, Cai, DasGupta
2001, "Interval Estimation for a Binomial Proportion", Stat. Sci. 16(2)). The trials are
exact for vLLM's fixed ``num_speculative_tokens``; a server whose drafts are sometimes
shorter (verispec's adaptive k) stops some rounds before position i, so α_{i+1} is
underestimated there (a conservative error: it can only make speculation look worse).

Positions beyond the server's k (K, the number of ``position`` labels) were never
measured. They are extrapolated by a weighted least-squares line through logit(α_i)
over the measured positions (weights: the trials), whose standard error at position j
widens the interval; with fewer than three measured positions the slope is not
estimable and α_K is carried forward with its logit standard error grown by
√(1 + (j − K)). Either way the α is the server's drafter's: another draft model has
another α.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import beta, norm

__all__ = ["PositionAlpha", "ServerAcceptance", "fetch_metrics", "llama_server_flags", "read_acceptance",
           "vllm_speculative_config"]

_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens_per_pos")
_PREFIXES = ("vllm", "verispec")


@dataclass(frozen=True)
class PositionAlpha:
    """α at one draft position (1-based), with its interval.

    Attributes:
        position: 1-based draft position.
        alpha: central estimate (the proportion when measured; the fitted line beyond K).
        low, high: the interval at ``level``.
        trials, accepted: the counts (0, 0 when extrapolated).
        measured: False for positions beyond the server's k.
        logit_se: standard error of logit(α) (normal approximation; for sampling draws).
    """

    position: int
    alpha: float
    low: float
    high: float
    trials: int
    accepted: int
    measured: bool
    logit_se: float


@dataclass
class ServerAcceptance:
    """What a server's counters say about acceptance.

    Attributes:
        prefix: "vllm" or "verispec".
        model_name: the ``model_name`` label read (None when the server has none).
        drafts, draft_tokens: D and the draft tokens proposed.
        accepted_per_position: A_0..A_{K-1}.
        level: the interval level (e.g. 0.8).
        positions: α_1..α_K (measured) then extrapolated ones up to what was asked.
        tau: mean tokens per verification round, bonus included: 1 + Σ A_i / D.
        notes: how the numbers were obtained.
    """

    prefix: str
    model_name: str | None
    drafts: int
    draft_tokens: int
    accepted_per_position: list[int]
    level: float
    positions: list[PositionAlpha] = field(default_factory=list)
    tau: float = 1.0
    notes: list[str] = field(default_factory=list)

    @property
    def k_server(self) -> int:
        """K: the draft length the server ran (the number of positions it counts)."""
        return len(self.accepted_per_position)

    def alphas(self, k_max: int) -> list[float]:
        """Central α_1..α_{k_max} (extrapolating beyond K)."""
        return [p.alpha for p in self.extended(k_max)]

    def extended(self, k_max: int) -> list[PositionAlpha]:
        """α_1..α_{k_max}: the measured positions, then the extrapolation (see the module doc)."""
        return self.positions[:k_max] + _extrapolate(self.positions[:self.k_server], k_max, self.level)

    def draw(self, k_max: int, draws: int, seed: int = 0) -> np.ndarray:
        """Samples of α_1..α_{k_max}, shape (draws, k_max): Beta (Jeffreys) posteriors for
        measured positions, the extrapolation's normal in logit space beyond K."""
        rng = np.random.default_rng(seed)
        out = np.empty((draws, k_max))
        for j, p in enumerate(self.extended(k_max)):
            if p.measured:
                out[:, j] = rng.beta(p.accepted + 0.5, p.trials - p.accepted + 0.5, size=draws)
            else:
                out[:, j] = _expit(_logit(p.alpha) + p.logit_se * rng.standard_normal(draws))
        return out

    def as_dict(self, k_max: int | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["k_server"] = self.k_server
        if k_max is not None:
            out["positions"] = [asdict(p) for p in self.extended(k_max)]
        return out


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _expit(x):
    return 1.0 / (1.0 + np.exp(-x))


def _jeffreys(accepted: int, trials: int, level: float) -> tuple[float, float]:
    a, b = accepted + 0.5, trials - accepted + 0.5
    tail = (1.0 - level) / 2.0
    return float(beta.ppf(tail, a, b)), float(beta.ppf(1.0 - tail, a, b))


def _extrapolate(measured: list[PositionAlpha], k_max: int, level: float) -> list[PositionAlpha]:
    K = len(measured)
    if k_max <= K or K == 0:
        return []
    z = float(norm.ppf(0.5 + level / 2.0))
    usable = [p for p in measured if p.trials > 0]
    out = []
    if len(usable) >= 3:
        x = np.array([p.position for p in usable], dtype=float)
        y = np.array([_logit(p.alpha) for p in usable])
        w = np.array([1.0 / max(p.logit_se, 1e-6) ** 2 for p in usable])
        X = np.stack([np.ones_like(x), x], axis=1)
        cov = np.linalg.inv(X.T @ (w[:, None] * X))
        coef = cov @ (X.T @ (w * y))
        resid = y - X @ coef
        scale = max(1.0, float(np.sum(w * resid**2) / max(len(x) - 2, 1)))   # overdispersion, never shrink
        for j in range(K + 1, k_max + 1):
            xj = np.array([1.0, j])
            mu, se = float(xj @ coef), math.sqrt(float(xj @ cov @ xj) * scale)
            out.append(PositionAlpha(j, float(_expit(mu)), float(_expit(mu - z * se)), float(_expit(mu + z * se)),
                                     0, 0, False, se))
    else:
        last = measured[-1]
        for j in range(K + 1, k_max + 1):
            se = last.logit_se * math.sqrt(1.0 + (j - K))
            mu = _logit(last.alpha)
            out.append(PositionAlpha(j, last.alpha, float(_expit(mu - z * se)), float(_expit(mu + z * se)),
                                     0, 0, False, se))
    return out


def read_acceptance(text: str, model_name: str | None = None, level: float = 0.8) -> ServerAcceptance:
    """Per-position α from a Prometheus text exposition (see the module doc).

    Args:
        text: the body of a ``/metrics`` page.
        model_name: keep only samples with this ``model_name`` label (None: sum over all;
            an error if the page serves several models and none is named).
        level: interval level in (0, 1).

    Returns:
        ServerAcceptance with α_1..α_K measured (K = the server's draft length).

    Raises:
        ValueError: naming ``--metrics-url`` when the page has no speculative-decoding
            counters, no drafts yet, several models and no ``--metrics-model``, or an
            unknown model name.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    found: dict[str, dict[str, list]] = {p: defaultdict(list) for p in _PREFIXES}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise ValueError(f"--metrics-url: not a Prometheus text page ({e})") from e
    for family in families:
        prefix, _, name = family.name.partition(":")
        name = name.removesuffix("_total")
        if prefix in found and name in _COUNTERS:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[prefix][name].append(sample)
    prefix = next((p for p in _PREFIXES if found[p].get("spec_decode_num_drafts")), None)
    if prefix is None:
        raise ValueError("--metrics-url: the page has no vllm:spec_decode_num_drafts_total or "
                         "verispec:spec_decode_num_drafts_total counter: is speculative decoding on "
                         "(vLLM --speculative-config, verispec serve --draft)?")
    series = found[prefix]
    models = sorted({s.labels["model_name"] for ss in series.values() for s in ss if "model_name" in s.labels})
    if model_name is None and len(models) > 1:
        raise ValueError(f"--metrics-url: the server reports {len(models)} models ({', '.join(models)}); "
                         f"choose one with --metrics-model")
    if model_name is not None and model_name not in models:
        raise ValueError(f"--metrics-model: {model_name!r} is not on the page (models: {', '.join(models) or 'none'})")

    def keep(sample) -> bool:
        return model_name is None or sample.labels.get("model_name") == model_name

    drafts = int(round(sum(s.value for s in series["spec_decode_num_drafts"] if keep(s))))
    draft_tokens = int(round(sum(s.value for s in series.get("spec_decode_num_draft_tokens", []) if keep(s))))
    per_pos: dict[int, float] = defaultdict(float)
    for s in series.get("spec_decode_num_accepted_tokens_per_pos", []):
        if keep(s):
            per_pos[int(s.labels["position"])] += s.value
    if drafts <= 0:
        raise ValueError("--metrics-url: the server has verified no drafts yet (spec_decode_num_drafts_total = 0); "
                         "send it some requests first")
    if not per_pos:
        raise ValueError("--metrics-url: no spec_decode_num_accepted_tokens_per_pos_total{position=...} counters")
    K = max(per_pos) + 1
    accepted = [int(round(per_pos.get(i, 0.0))) for i in range(K)]
    positions, trials = [], drafts
    for i, a in enumerate(accepted):
        a = min(a, trials)
        lo, hi = _jeffreys(a, trials, level) if trials else (0.0, 1.0)
        p = a / trials if trials else 0.0
        se = 1.0 / math.sqrt(max((a + 0.5) * (trials - a + 0.5) / (trials + 1.0), 1e-9))
        positions.append(PositionAlpha(i + 1, p, lo, hi, trials, a, True, se))
        trials = a
    tau = 1.0 + sum(accepted) / drafts
    notes = [f"{prefix} counters{' for model ' + model_name if model_name else ''}: {drafts} rounds with drafts, "
             f"{draft_tokens} draft tokens, k = {K} on the server; α_i = A_(i-1)/A_(i-2) (Jeffreys {level:.0%} "
             f"intervals); τ = {tau:.3f}",
             "this α is the server's drafter's against its target: a plan with another draft model needs that pair's α"]
    if prefix == "verispec":
        notes.append("verispec serve drafts adaptively: rounds with shorter drafts count as rejections at the "
                     "positions they never reached, so deep α are lower bounds")
    return ServerAcceptance(prefix=prefix, model_name=model_name, drafts=drafts, draft_tokens=draft_tokens,
                            accepted_per_position=accepted, level=level, positions=positions, tau=tau, notes=notes)


def fetch_metrics(url: str, timeout: float = 10.0) -> str:
    """GET a ``/metrics`` page (httpx).

    Raises:
        ValueError: naming ``--metrics-url`` when the URL is malformed, unreachable or not 200.
    """
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--metrics-url must be an http(s) URL such as http://host:8000/metrics, got {url!r}")
    try:
        response = httpx.get(url, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as e:
        raise ValueError(f"--metrics-url: cannot read {url}: {e}") from e
    if response.status_code != 200:
        raise ValueError(f"--metrics-url: {url} answered HTTP {response.status_code}")
    return response.text


def vllm_speculative_config(k: int, draft: str | None) -> str:
    """The JSON for vLLM's ``--speculative-config`` at draft length ``k``: a draft model
    (``"model"``), or n-gram prompt lookup when ``draft`` is None."""
    config: dict[str, Any] = {"num_speculative_tokens": int(k)}
    if draft:
        config["model"] = draft
    else:
        config.update(method="ngram", prompt_lookup_max=4, prompt_lookup_min=2)
    return json.dumps(config)


def llama_server_flags(k: int, draft: str | None) -> str:
    """llama-server flags for a fixed draft length ``k`` (``--draft-p-min 0`` so drafts
    are not cut short, as the plan assumes); prompt lookup has no llama-server flag."""
    if not draft:
        return ""
    return f"--model-draft {draft} --draft-max {int(k)} --draft-min 0 --draft-p-min 0.0"
