"""Benchmarking any OpenAI-compatible server: one timed request per prompt, τ from its metrics.

`ServerMethod.generate` sends one non-streaming completion and returns the same row fields as
`run_one` (new_tokens, wall_seconds, tokens_per_second, tau, α̂, text, ...), so a server's
rows sit in the same tables as verispec's own methods (`run_bench(endpoints=...)`,
`verispec bench --endpoint URL --reference-endpoint URL`).

The prompt is sent as token ids to ``/v1/completions`` when the bench has encoded it (then
the server sees exactly the tokens verispec decodes; llama-server, vLLM and verispec serve
accept a list of ids), or as one user message to ``/v1/chat/completions`` (the server's
own chat template) when only text is known. Greedy requests set temperature 0.

Speculation counts come from what the server exposes, first found wins:

* the response's ``timings`` (llama-server: ``draft_n``, ``draft_n_accepted``);
* ``/metrics`` counters read before and after the request: vLLM's
  ``vllm:spec_decode_num_draft_tokens_total`` / ``..._num_accepted_tokens_total`` and
  verispec serve's ``verispec:`` counters of the same names (docs/metrics.md).

With `accepted` drafts over `new_tokens` tokens, each verification forward commits its
accepted drafts plus one token, so target_forwards = new_tokens − accepted and
τ = new_tokens / target_forwards (the definition `Stats.tau` uses). Without counts τ is None.
Concurrent traffic on the server would pollute the metric deltas: benchmark an idle server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ServerMethod", "ServerError", "scrape_metrics", "spec_counts"]

#: counter families read from /metrics, per exposition prefix (vLLM, verispec serve)
_PREFIXES = ("vllm:", "verispec:")
_DRAFTED = "spec_decode_num_draft_tokens"
_ACCEPTED = "spec_decode_num_accepted_tokens"


class ServerError(RuntimeError):
    """A server that could not be reached or answered with an error; the message names the URL."""


def scrape_metrics(text: str) -> dict[str, float]:
    """Sum every sample of a Prometheus text exposition by sample name (labels dropped).

    Args:
        text: the body of ``GET /metrics``.

    Returns:
        {sample name (e.g. "vllm:spec_decode_num_draft_tokens_total"): summed value}.
        Unparseable text gives {}.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError):
        return {}
    return out


def spec_counts(before: dict[str, float], after: dict[str, float]) -> tuple[int, int] | None:
    """(drafted, accepted) between two scrapes, from vLLM's or verispec serve's counters.

    Returns None when neither exposition carries the draft counters.
    """
    for prefix in _PREFIXES:
        d, a = f"{prefix}{_DRAFTED}_total", f"{prefix}{_ACCEPTED}_total"
        if d in after and a in after:
            return (int(round(after[d] - before.get(d, 0.0))),
                    int(round(after[a] - before.get(a, 0.0))))
    return None


@dataclass
class ServerMethod:
    """An OpenAI-compatible server measured as one bench method.

    Args:
        url: the server's base URL (``http://127.0.0.1:8080``; a trailing ``/v1`` is dropped).
        model: the ``model`` field of requests; None: the first id of ``GET /v1/models``.
        api_key: sent as a bearer token when given.
        extra: more request fields (e.g. ``{"cache_prompt": False}`` for llama-server, so
            a repeated prompt is prefilled again like every other measurement).
        timeout: seconds per request.
        description: one line for the report.
    """

    url: str
    model: str | None = None
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
    description: str = ""

    def __post_init__(self) -> None:
        url = self.url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL must start with http:// or https://, got {self.url!r}")
        self.url = url[:-3] if url.endswith("/v1") else url
        self._client = None

    def _http(self):
        if self._client is None:
            import httpx

            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.Client(base_url=self.url, timeout=self.timeout, headers=headers)
        return self._client

    def close(self) -> None:
        """Close the HTTP connection pool (a later request opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _get(self, path: str):
        import httpx

        try:
            return self._http().get(path)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}{path}: {type(e).__name__}: {e}") from e

    def model_name(self) -> str:
        """`model`, or the first model the server lists (cached).

        Raises:
            ServerError: when the server is unreachable or lists no model.
        """
        if self.model is None:
            r = self._get("/v1/models")
            data = r.json().get("data") if r.status_code == 200 else None
            if not data:
                raise ServerError(f"{self.url}/v1/models listed no model (HTTP {r.status_code}); "
                                    "give the model name (--endpoint-model)")
            self.model = str(data[0]["id"])
        return self.model

    def metrics(self) -> dict[str, float]:
        """The server's /metrics summed by sample name; {} when it has none."""
        try:
            r = self._get("/metrics")
        except ServerError:
            return {}
        return scrape_metrics(r.text) if r.status_code == 200 else {}

    def generate(self, prompt: list[int] | str, *, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        """One timed, non-streaming completion.

        Args:
            prompt: token ids (sent to /v1/completions) or a user message (sent to
                /v1/chat/completions).
            max_new_tokens: ``max_tokens``, >= 1.
            temperature: 0 = greedy.
            seed: the request's ``seed``.

        Returns:
            Row fields: new_tokens (``usage.completion_tokens``), wall_seconds (the
            request's round trip, prefill included), tokens_per_second, text,
            finish_reason, drafted/accepted/target_forwards/tau/draft_acceptance_rate
            (None when the server exposes no counts), spec_source ("timings",
            "metrics" or None), server_timings (llama-server's, when given).

        Raises:
            ServerError: unreachable server, an HTTP error status (its body quoted), or
                a response without ``usage.completion_tokens``.
        """
        import httpx

        chat = isinstance(prompt, str)
        body: dict[str, Any] = {"model": self.model_name(), "max_tokens": max_new_tokens,
                                "temperature": temperature, "seed": seed, "stream": False}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = [int(t) for t in prompt]
        body.update(self.extra)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        before = self.metrics()
        start = time.perf_counter()
        try:
            r = self._http().post(path, json=body)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}{path}: {type(e).__name__}: {e}") from e
        wall = time.perf_counter() - start
        if r.status_code != 200:
            raise ServerError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        try:
            n = int(data["usage"]["completion_tokens"])
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ServerError(f"{self.url}{path}: response without usage.completion_tokens "
                                f"or choices: {str(data)[:300]}") from e
        text = choice["message"]["content"] if chat else choice.get("text", "")
        counts, source = None, None
        timings = data.get("timings") if isinstance(data.get("timings"), dict) else None
        if timings and "draft_n" in timings:
            counts, source = (int(timings["draft_n"]), int(timings.get("draft_n_accepted", 0))), "timings"
        else:
            counts = spec_counts(before, self.metrics()) if before else None
            source = "metrics" if counts is not None else None
        if counts is None and timings is not None:
            counts, source = (0, 0), "timings"     # llama-server without speculation: no drafts
        drafted, accepted = counts if counts is not None else (None, None)
        forwards = n - accepted if accepted is not None and n > accepted else None
        return {
            "new_tokens": n, "wall_seconds": wall,
            "tokens_per_second": n / wall if wall > 0 else None,
            "text": text or "", "finish_reason": choice.get("finish_reason"),
            "drafted": drafted, "accepted": accepted, "target_forwards": forwards,
            "tau": n / forwards if forwards else None,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "spec_source": source, "server_timings": timings,
        }
