"""Sampling an OpenAI-compatible server: N completions of m tokens, as token ids.

The endpoint audit (`verispec.audit.reference`) compares what a *remote* server
samples with a reference. This module only draws the samples, over HTTP (httpx):

* `Endpoint` talks to one server: ``GET /v1/models`` (is it up, is the model
  served), ``POST /v1/completions`` (prompt as text or token ids, ``max_tokens=m``,
  ``temperature``, ``top_k``, ``top_p``, ``min_p=0``, a distinct ``seed`` per sample)
  and ``POST /tokenize``. Token ids come, in this order of preference, from
  - ``choices[0].token_ids`` (vLLM's and verispec's ``return_token_ids``);
  - ``tokens`` / ``__verbose.tokens`` (llama.cpp's ``llama-server``);
  - llama-server's native ``POST /completion`` with ``"return_tokens": true``, when
    its ``/v1/completions`` gives text only (the same slots and samplers serve both);
  - the text, re-tokenised by the server's ``/tokenize`` (reported as
    ``source="retokenised"``: a text can tokenise differently from how it was sampled,
    so such an audit is weaker; say so in any report).
  Optional extension fields a strict server refuses with a 400 naming them
  (``return_token_ids``, ``min_p``, ``repetition_penalty``) are dropped and the request retried.
* Retries with exponential back-off (``backoff * 2**attempt``, capped, or the
  server's ``Retry-After``) on 429, 5xx, timeouts and dropped connections.
* `draw_samples` keeps every raw sample as one JSON line in ``out`` (resumable: a
  rerun reads the file, checks it holds the same audit, and adds samples up to N).

Errors a user can act on are `EndpointError` with the fix in the message: an
unreachable URL, a model the server does not list, a server that returns more
tokens than ``max_tokens`` (it ignores the budget, so its samples are not the
first m tokens), a response with neither token ids nor text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["EndpointError", "EndpointSettings", "Sample", "Endpoint", "draw_samples", "seed_check"]

#: request fields that are extensions some servers refuse; dropped on a 400 naming them
_OPTIONAL_FIELDS = ("return_token_ids", "min_p", "repetition_penalty")
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class EndpointError(RuntimeError):
    """The server cannot be audited as asked; the message names the cause and the fix."""


@dataclass(frozen=True)
class EndpointSettings:
    """What every sample of one audit is drawn with (checked again on resume).

    Attributes:
        url: the server's base URL, e.g. ``http://host:8000/v1`` (``/v1`` optional).
        model: the served model name (`/v1/models`).
        prompt: text, or a list of token ids.
        m: new tokens per sample (``max_tokens``), >= 1.
        temperature: >= 0 (0: greedy); top_k: 0 = off; top_p: in (0, 1].
        controls: (name, value) pairs sent as request fields: ``min_p``,
            ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
            ``logit_bias`` (a tuple of (id, bias) pairs).
    """

    url: str
    model: str
    prompt: str | tuple[int, ...]
    m: int
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    controls: tuple = ()

    def key(self) -> dict:
        """The JSON-ready identity of the audit (stored with every sample; ``controls``
        only when some are set, so files of earlier audits still resume)."""
        d = asdict(self)
        d["prompt"] = self.prompt if isinstance(self.prompt, str) else list(self.prompt)
        if self.controls:
            d["controls"] = {k: (dict(v) if k == "logit_bias" else v) for k, v in self.controls}
        else:
            d.pop("controls")
        return d


@dataclass
class Sample:
    """One completion.

    Attributes:
        token_ids: the generated ids (at most m).
        text: the generated text ("" when the server returned none).
        source: where the ids came from: "token_ids", "llama.cpp tokens", "retokenised".
        finish_reason: the server's ("length", "stop", ...).
        seed: the seed sent (None: none sent).
    """

    token_ids: list[int]
    text: str
    source: str
    finish_reason: str | None
    seed: int | None
    logprobs: list[float] | None = None


def _root(url: str) -> tuple[str, str]:
    """(the /v1 base, the server root) of a user's URL."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise EndpointError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}")
    root = url[:-3] if url.endswith("/v1") else url
    return root + "/v1", root


class Endpoint:
    """One OpenAI-compatible server (see the module doc).

    Args:
        url: base URL (``http://host:port`` or ``http://host:port/v1``).
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer KEY`` when given.
        timeout: seconds per request.
        retries: retries of one request after the first try (429/5xx/timeout/connection).
        backoff, max_backoff: the n-th retry waits ``min(max_backoff, backoff * 2**n)``
            seconds, or the server's ``Retry-After`` when it sends one (capped the same way).
        sleep: the waiting function (tests pass a no-op).

    Raises:
        EndpointError: for a URL that is not http(s).
    """

    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0,
                 retries: int = 6, backoff: float = 0.5, max_backoff: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.v1, self.root = _root(url)
        self.url, self.model = url, model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=timeout)
        self.retries, self.backoff, self.max_backoff, self.sleep = retries, backoff, max_backoff, sleep
        self.dropped: set[str] = set()     # optional fields the server refused
        self.mode: str | None = None       # how token ids are obtained, fixed by the first sample
        self.tokenize_shape: str | None = None
        self.retried = 0                   # retries done (all requests)

    def close(self) -> None:
        self.http.close()

    # -- HTTP with retries ------------------------------------------------------------------
    def _request(self, method: str, url: str, body: dict | None = None) -> httpx.Response:
        """One request, retried on 429/5xx/timeouts/dropped connections; the last
        response (any status) or `EndpointError` when the server never answered."""
        for attempt in range(self.retries + 1):
            try:
                r = self.http.request(method, url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if isinstance(e, httpx.ConnectError) and attempt == 0 and self.mode is None:
                    raise EndpointError(f"cannot reach {url}: {e}. Is the server running, and is "
                                        f"--endpoint right (e.g. http://127.0.0.1:8000/v1)?") from None
                if attempt == self.retries:
                    raise EndpointError(f"{method} {url}: no answer after {self.retries + 1} tries "
                                        f"({type(e).__name__}: {e})") from None
                self._wait(attempt, None)
                continue
            if r.status_code in _RETRY_STATUS and attempt < self.retries:
                self._wait(attempt, r.headers.get("retry-after"))
                continue
            return r
        raise AssertionError("unreachable")

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        self.retried += 1
        delay = self.backoff * 2 ** attempt
        if retry_after is not None:
            try:
                delay = float(retry_after)
            except ValueError:
                pass
        self.sleep(min(self.max_backoff, max(0.0, delay)))

    @staticmethod
    def _message(r: httpx.Response) -> str:
        try:
            body = r.json()
            err = body.get("error", body) if isinstance(body, dict) else body
            return str(err.get("message", err) if isinstance(err, dict) else err)
        except ValueError:
            return r.text[:300]

    def _json(self, r: httpx.Response, what: str) -> Any:
        if r.status_code != 200:
            raise EndpointError(f"{what}: HTTP {r.status_code}: {self._message(r)}")
        try:
            return r.json()
        except ValueError:
            raise EndpointError(f"{what}: the answer is not JSON: {r.text[:200]!r}") from None

    # -- API ----------------------------------------------------------------------------------
    def models(self) -> list[str]:
        """The model names `GET /v1/models` lists.

        Raises:
            EndpointError: unreachable server, a 401 (wrong --api-key), or no model list.
        """
        r = self._request("GET", self.v1 + "/models")
        if r.status_code == 401:
            raise EndpointError(f"{self.v1}/models: 401 unauthorised; pass the server's key with --api-key")
        body = self._json(r, f"GET {self.v1}/models")
        try:
            return [str(d["id"]) for d in body["data"]]
        except (KeyError, TypeError):
            raise EndpointError(f"GET {self.v1}/models did not return an OpenAI model list: "
                                f"{str(body)[:200]}") from None

    def check_model(self) -> list[str]:
        """`models()`, raising `EndpointError` naming --model when it is not listed."""
        names = self.models()
        if self.model not in names:
            raise EndpointError(f"--model {self.model!r} is not served at {self.v1} (it lists "
                                f"{', '.join(names) or 'no model'}); pass one of those names")
        return names

    def tokenize(self, text: str) -> list[int]:
        """The server's own tokenisation of `text` (no special tokens), via ``POST /tokenize``
        in vLLM's shape (``prompt``) or llama.cpp's (``content``)."""
        shapes = {"vllm": {"model": self.model, "prompt": text, "add_special_tokens": False},
                  "llama.cpp": {"content": text, "add_special": False}}
        order = [self.tokenize_shape] if self.tokenize_shape else list(shapes)
        last = ""
        for shape in order:
            r = self._request("POST", self.root + "/tokenize", shapes[shape])
            if r.status_code == 200:
                tokens = r.json().get("tokens")
                if isinstance(tokens, list):
                    self.tokenize_shape = shape
                    return [int(t["id"] if isinstance(t, dict) else t) for t in tokens]
            last = f"HTTP {r.status_code}: {self._message(r)}"
        raise EndpointError(f"the server returned text without token ids and {self.root}/tokenize "
                            f"does not work ({last}); audit a server that returns token ids")

    def _body(self, prompt, m: int, temperature: float, top_k: int, top_p: float,
              seed: int | None, controls: tuple = (), logprobs: int | None = None) -> dict:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                "max_tokens": m, "temperature": temperature, "top_p": top_p,
                                "min_p": 0.0, "repetition_penalty": 1.0, "return_token_ids": True,
                                "stream": False}
        if top_k:
            body["top_k"] = top_k
        if seed is not None:
            body["seed"] = seed
        for name, value in controls:
            body[name] = {str(t): b for t, b in value} if name == "logit_bias" else value
        if logprobs is not None:
            body["logprobs"] = logprobs
        for f in self.dropped:
            body.pop(f, None)
        return body

    def complete(self, prompt: str | Sequence[int], m: int, temperature: float, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, controls: tuple = (),
                 logprobs: int | None = None) -> Sample:
        """One completion of at most m tokens, as a `Sample` (see the module doc for the
        sources of token ids).

        Raises:
            EndpointError: a 4xx the server will not take back (message included), more
                than m tokens (the server ignores ``max_tokens``), neither ids nor text.
        """
        if self.mode == "llama.cpp /completion":    # settled by the first sample: skip /v1
            ids, text, finish = self._llama_native(prompt, m, temperature, top_k, top_p, seed)
            if ids is None:
                raise EndpointError(f"{self.root}/completion stopped returning tokens")
            return self._checked(ids, text, "llama.cpp /completion", finish, seed, m, None)
        while True:
            body = self._body(prompt, m, temperature, top_k, top_p, seed, controls, logprobs)
            r = self._request("POST", self.v1 + "/completions", body)
            if r.status_code == 400:
                msg = self._message(r)
                refused = [f for f in _OPTIONAL_FIELDS if f in body and f in msg]
                if refused:
                    self.dropped.update(refused)
                    continue
            if r.status_code == 404 and self.mode is None:
                raise EndpointError(f"{self.v1}/completions: 404: is --endpoint the server's base "
                                    f"URL (e.g. http://127.0.0.1:8000/v1)?")
            data = self._json(r, f"POST {self.v1}/completions")
            break
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{self.v1}/completions returned no choices: {str(data)[:200]}") from None
        text = choice.get("text")
        finish = choice.get("finish_reason")
        ids = choice.get("token_ids")
        source = "token_ids"
        if ids is None:
            ids = data.get("tokens") or (data.get("__verbose") or {}).get("tokens")
            source = "llama.cpp tokens"
        if ids is None and self.mode in (None, "llama.cpp /completion"):
            ids, text2, finish2 = self._llama_native(prompt, m, temperature, top_k, top_p, seed)
            if ids is not None:
                source, text, finish = "llama.cpp /completion", text2, finish2
        if ids is None:
            if text is None or (text == "" and finish == "length"):
                raise EndpointError(f"{self.v1}/completions returned neither token ids nor text "
                                    f"({str(data)[:200]}); this server cannot be audited")
            ids, source = (self.tokenize(text) if text else []), "retokenised"
        usage = (data.get("usage") or {}).get("completion_tokens")
        sample = self._checked(ids, text, source, finish, seed, m, usage)
        lp = (choice.get("logprobs") or {}) if isinstance(choice.get("logprobs"), dict) else {}
        if isinstance(lp.get("token_logprobs"), list):
            sample.logprobs = [float(x) if x is not None else float("nan") for x in lp["token_logprobs"]][:m]
        return sample

    def _checked(self, ids, text, source: str, finish, seed, m: int, usage) -> Sample:
        """The sample, after checking the server kept to max_tokens = m."""
        ids = [int(t) for t in ids]
        n = len(ids) if source != "retokenised" else (usage if isinstance(usage, int) else len(ids))
        if n > m:
            raise EndpointError(f"asked for max_tokens={m} but the server returned {n} tokens: it "
                                f"ignores max_tokens, so its samples are not the first m tokens; "
                                f"this server cannot be audited as it is")
        self.mode = source
        return Sample(ids[:m], text or "", source, finish, seed)

    def _llama_native(self, prompt, m, temperature, top_k, top_p, seed):
        """llama-server's ``POST /completion`` with ``return_tokens`` (its OpenAI route gives
        text only); (None, None, None) when the server has no such route."""
        body = {"prompt": prompt if isinstance(prompt, str) else list(prompt), "n_predict": m,
                "temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": 0.0,
                "return_tokens": True, "stream": False}
        if seed is not None:
            body["seed"] = seed
        r = self._request("POST", self.root + "/completion", body)
        if r.status_code != 200:
            return None, None, None
        try:
            data = r.json()
        except ValueError:
            return None, None, None
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            return None, None, None
        stop = data.get("stop_type")
        return data["tokens"], data.get("content", ""), "length" if stop == "limit" else stop


def _read(out: Path, settings: EndpointSettings) -> list[dict]:
    """The samples already in `out`, checked to belong to this audit."""
    rows = []
    want = settings.key()
    for n, line in enumerate(out.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise EndpointError(f"{out}:{n} is not a JSON line; --out must be a file this audit wrote") from None
        got = row.get("settings", {})
        diff = [k for k in want if got.get(k) != want[k]]
        if diff:
            raise EndpointError(f"{out} holds samples of another audit ({', '.join(diff)} differ: "
                                f"{got.get(diff[0])!r} there, {want[diff[0]]!r} now); pass another --out")
        rows.append(row)
    return rows


def draw_samples(endpoint: Endpoint, settings: EndpointSettings, n: int, *, out: str | Path | None = None,
                 seed_offset: int = 0, seeds: bool = True, concurrency: int = 1, progress: bool = True,
                 desc: str = "sampling") -> list[Sample]:
    """N samples from `endpoint` with `settings`; resumable through `out`.

    Sample i is requested with ``seed = seed_offset + i`` (``seeds=False``: no seed,
    for servers that refuse one), so the set of samples does not depend on the order
    requests finish in. With `out`, the samples already there are reused (after
    checking they were drawn with the same settings), and each new one is appended
    as one JSON line as soon as it arrives, so an interrupted run loses only the
    requests in flight; a rerun draws the missing indices up to n.

    Args:
        concurrency: requests in flight at once (>= 1; a batching server such as
            vLLM samples them in parallel, a batch-1 server queues them). The first
            request is always sent alone (it settles which fields the server takes).

    Returns:
        Samples 0..n-1, in index order.

    Raises:
        EndpointError: see `Endpoint.complete`, or an `out` holding another audit.
        ValueError: naming `n` or `concurrency` when < 1.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed
    from threading import Lock

    from tqdm.auto import tqdm

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
    path = Path(out) if out is not None else None
    have: dict[int, Sample] = {}
    if path is not None and path.exists():
        for r in _read(path, settings):
            have.setdefault(int(r["i"]), Sample(r["token_ids"], r.get("text", ""), r["source"],
                                                r.get("finish_reason"), r.get("seed")))
    todo = [i for i in range(n) if i not in have]
    prompt = settings.prompt if isinstance(settings.prompt, str) else list(settings.prompt)
    lock = Lock()
    fh = path.open("a") if path is not None and todo else None

    def one(i: int) -> tuple[int, Sample]:
        return i, endpoint.complete(prompt, settings.m, settings.temperature, settings.top_k,
                                    settings.top_p, seed_offset + i if seeds else None, settings.controls)

    def keep(i: int, s: Sample, bar) -> None:
        with lock:
            have[i] = s
            if fh is not None:
                fh.write(json.dumps({"i": i, **asdict(s), "settings": settings.key()}) + "\n")
                fh.flush()
            bar.update(1)

    try:
        with tqdm(total=n, initial=n - len(todo), desc=desc, disable=not progress, leave=False) as bar:
            if todo:
                keep(*one(todo[0]), bar)
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = [pool.submit(one, i) for i in todo[1:]]
                try:
                    for fut in as_completed(futures):
                        keep(*fut.result(), bar)
                except BaseException:
                    for f in futures:       # stop at the first error; what arrived is kept
                        f.cancel()
                    raise
    finally:
        if fh is not None:
            fh.close()
    return [have[i] for i in range(n)]


from .seeds import SeedCheck, seed_check  # noqa: E402  (kept importable from here)
