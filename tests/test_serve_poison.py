"""One request must never change another's answer: the poisoning sequence of issue 24
replayed through the server (k="auto", whose policy lives across requests).

On the old server, ordinary requests followed by one with temperature 1e-310 (or top_p
1e-300, or repetition_penalty 1e-300) stored a NaN acceptance estimate in the long-lived
k="auto" policy; every later request then failed with a 400, /health still said ok, and
the α counter of /metrics read NaN forever. Here the extreme requests get their limit
(greedy) or a 400 naming the field, and every later answer equals a fresh server's.
"""

import math

import httpx
from test_serve_toys import metric_totals, toy_decoder

from verispec.serve import BackgroundServer, create_app

ORDINARY = [{"prompt": [1 + i % 7, 2 + i % 5, i % 3], "max_tokens": 8, "temperature": 0} for i in range(12)]
LATER = [{"prompt": [4, 2, 9], "max_tokens": 10, "temperature": 0},
         {"prompt": [3, 3], "max_tokens": 10, "temperature": 0.8, "seed": 5},
         {"prompt": [7], "max_tokens": 10}]
POISON = [({"prompt": [5, 1], "max_tokens": 8, "temperature": 1e-310, "seed": 1}, 200),
          ({"prompt": [5, 1], "max_tokens": 8, "temperature": 1.0, "top_p": 1e-300, "seed": 1}, 200),
          ({"prompt": [5, 1], "max_tokens": 8, "temperature": 1.0, "repetition_penalty": 1e-300}, 400)]


def answers(client, bodies):
    out = []
    for body in bodies:
        r = client.post("/v1/completions", json={"return_token_ids": True, **body, "seed": body.get("seed", 3)})
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["token_ids"])
    return out


def test_extreme_requests_do_not_change_later_answers_or_poison_the_metrics():
    with BackgroundServer(create_app(toy_decoder(), k="auto")) as url, httpx.Client(base_url=url, timeout=60) as c:
        answers(c, ORDINARY)
        greedy = answers(c, [{**POISON[0][0], "temperature": 0}])[0]
        for body, status in POISON:
            r = c.post("/v1/completions", json={"return_token_ids": True, **body})
            assert r.status_code == status, r.text
            if status == 200:
                assert r.json()["choices"][0]["token_ids"] == greedy        # the T -> 0 / top-token limit
            else:
                assert r.json()["error"]["param"] == "repetition_penalty"
        later = answers(c, LATER)
        totals = metric_totals(c.get("/metrics").text)
        assert c.get("/health").status_code == 200
    assert math.isfinite(totals["verispec:spec_decode_alpha_sum_total"])
    assert totals["verispec:spec_decode_num_verified_tokens_total"] > 0
    with BackgroundServer(create_app(toy_decoder(), k="auto")) as url, httpx.Client(base_url=url, timeout=60) as c:
        fresh = answers(c, LATER)
    assert later == fresh
