"""Recorded rounds of the adaptive policy, and their replay: proof that a refactor changes no decision.

The policy's inputs are what it reads of its drafters each round (`available`, and the
optional `confidences`, `catchup_tokens`, `calibrate`), the `RoundRecord`s it observes, the
timed forwards of `calibrate` and the `start(max_new_tokens)` calls. Its outputs are its
decisions: `choose` -> (drafter, k), `verify_width(n)`, `calibrate`'s curve, and the
predicted speedups behind them (`predict`, exact floats). No wall clock is read: the
timings are scripted, `calibrate`'s forwards run on a fake target whose clock advances by
a scripted duration per forward.

`record()` drives the policy through scripted scenarios (fake drafters whose α, evidence
and costs follow deterministic pseudo-random phases; plain rounds, probes, evidence
drafters, catch-up, calibration, budget exhaustion, several generations) and stores every
input with the decisions taken; `replay()` feeds the same inputs to a policy and returns
its decisions, to compare with the stored ones (`tests/test_policy_replay.py`).

Regenerate (only on purpose, when a decision is meant to change):
    PYTHONPATH=. python tests/policy_replay.py tests/data/policy_schedule.json
"""

from __future__ import annotations

import json
import random
import sys

import torch

from verispec.decoding import RoundRecord
from verispec.drafters.base import Confidence

# -- fake drafters: each returns, for the current round, what the script offers -------------


class ScriptedDrafter:
    """A drafter whose answers this round are `self.offer` (set by the replay)."""

    point_mass = False
    forwards = 0
    seconds = 0.0
    catchup_seconds = 0.0

    def __init__(self, name: str, alpha_prior: float, calibration=None) -> None:
        self.name, self.alpha_prior = name, alpha_prior
        self.offer: dict = {}
        self.calibration = list(calibration or [])   # what successive `calibrate` calls return

    def available(self, context):
        return self.offer["available"]


class _Confidences:
    def confidences(self, context):
        return [Confidence(f, m, s) for f, m, s in self.offer["confidences"]]


class _Catchup:
    def catchup_tokens(self, context):
        return self.offer["catchup"]


class _Calibrate:
    def calibrate(self, context):
        timed = self.calibration.pop(0)
        return None if timed is None else tuple(timed)


def make_drafter(spec: dict) -> ScriptedDrafter:
    """A fake drafter with the optional parts `spec` names (a class per combination, so
    the parts are methods, as in a real drafter)."""
    parts = [cls for flag, cls in (("confidences", _Confidences), ("catchup", _Catchup),
                                   ("calibrate", _Calibrate)) if spec.get(flag)]
    cls = type("Scripted_" + spec["name"], (*parts, ScriptedDrafter), {})
    return cls(spec["name"], spec["alpha_prior"], spec.get("calibration"))


class FakeTarget:
    """What `calibrate` reads of a target; each forward advances `now` by the next scripted
    duration (seconds)."""

    name = "fake-target"

    def __init__(self, context_length: int, durations) -> None:
        """`durations`: the seconds of successive forwards, or (recording) a function of
        the forward's token count whose values are logged in `self.durations`."""
        self.context_length = context_length
        self.script = durations if callable(durations) else None
        self.durations = [] if callable(durations) else list(durations)
        self.tokens: list[int] = []
        self.now = 0.0
        self.used = 0

    def clock(self) -> float:
        return self.now

    def rollback_to(self, seq):
        n = 0
        while n < min(len(self.tokens), len(seq) - 1) and self.tokens[n] == seq[n]:
            n += 1
        self.tokens = self.tokens[:n]

    def forward(self, tokens, keep=1):
        self.tokens += list(tokens)
        if self.script is not None:
            self.durations.append(self.script(len(tokens)))
        self.now += self.durations[self.used]
        self.used += 1

    def truncate(self, n):
        self.tokens = self.tokens[:n]


def make_record(r: dict) -> RoundRecord:
    k = r["k"]
    return RoundRecord(drafter=r["drafter"], k=k, accepted=r["accepted"], committed=r["committed"],
                       alphas=torch.tensor(r["alphas"], dtype=torch.float64),
                       px=torch.zeros(k, dtype=torch.float64), qx=torch.zeros(k, dtype=torch.float64),
                       target_seconds=r["target_seconds"], draft_seconds=r["draft_seconds"],
                       catchup_seconds=r["catchup_seconds"], width=r["width"])


def _calibrate(policy, target: FakeTarget, context, repeats):
    """`policy.calibrate` on the fake target's clock instead of the wall clock."""
    return policy.calibrate(target, context, repeats=repeats, clock=target.clock)


# -- one step of the replay: inputs in, decisions out ------------------------------------------

def decide(policy, drafters: dict, event: dict, k_max: int) -> dict:
    """Offer this round's inputs to the drafters, ask the policy, return its decisions."""
    for name, offer in event["offers"].items():
        drafters[name].offer = offer
    seq = [7] * event["seq_len"]
    drafter, k = policy.choose(seq)
    chosen = None if drafter is None else next(n for n, d in drafters.items() if d is drafter)
    predictions, probes = {}, {}
    for name, offer in event["offers"].items():
        evidence = drafters[name].confidences(seq) if offer.get("confidences") is not None else None
        ks = range(1, min(k_max, offer["available"]) + 1)
        predictions[name] = [policy.predict(name, j, evidence=evidence) for j in ks]
        if not k:   # a plain round: the optimistic prices a probe is judged on
            probes[name] = [policy.predict(name, j, policy.probe_alpha, evidence) for j in ks]
    return {"choice": [chosen, k], "widths": [policy.verify_width(n) for n in range(1, k_max + 2)],
            "predictions": predictions, "probe_predictions": probes}


def replay(scenario: dict, policy_class) -> list:
    """Feed a recorded scenario's inputs to a fresh `policy_class`; its decisions, one
    entry per event, in the stored format."""
    drafters = {spec["name"]: make_drafter(spec) for spec in scenario["drafters"]}
    policy = policy_class(drafters, **scenario["policy"])
    k_max = scenario["policy"].get("k_max", 8)
    out = []
    for event in scenario["events"]:
        op = event["op"]
        if op == "start":
            policy.start(event["max_new_tokens"])
            out.append(None)
        elif op == "calibrate":
            target = FakeTarget(event["context_length"], event["durations"])
            curve = _calibrate(policy, target, [7] * event["context_tokens"], event["repeats"])
            out.append({str(n): t for n, t in curve.items()})
        elif op == "observe":
            policy.observe(make_record(event["record"]))
            out.append(None)
        else:
            decision = decide(policy, drafters, event, k_max)
            r = event["record"]
            decision["verify_width"] = policy.verify_width(r["k"] + 1) if r["k"] else 1
            policy.observe(make_record(r))
            out.append(decision)
    return out


def expected(scenario: dict) -> list:
    """The decisions stored with a scenario's events (same format as `replay`)."""
    return [event.get("expect") for event in scenario["events"]]


# -- the recorder: scripted scenarios driven through the policy --------------------------------

class Script:
    """Deterministic pseudo-random 'machine' for one scenario."""

    def __init__(self, seed: int, curve, context_length: int = 100_000) -> None:
        self.rng = random.Random(seed)
        self.curve, self.context_length = curve, context_length

    def noisy(self, value: float, spread: float = 0.05) -> float:
        return round(value * (1.0 + self.rng.uniform(-spread, spread)), 7)


def _round(policy, drafters, specs, script: Script, events, seq_len, left, r, k_max) -> tuple[int, int]:
    """One recorded round; returns (tokens committed, new seq_len)."""
    offers = {}
    for spec in specs:
        name, behave = spec["name"], spec["behave"]
        offer = {"available": behave["available"](script, seq_len, r)}
        if spec.get("confidences"):
            offer["confidences"] = behave["confidences"](script, r, offer["available"])
        if spec.get("catchup"):
            offer["catchup"] = seq_len - behave["state"]["cached"]
        offers[name] = offer
    event = {"op": "round", "seq_len": seq_len, "offers": offers}
    decision = decide(policy, drafters, event, k_max)
    name, k = decision["choice"]
    room = script.context_length - seq_len
    k = max(0, min(k, left - 1, room - 1)) if name is not None else 0
    proposed = min(k, offers[name]["available"]) if k else 0
    if proposed and script.rng.random() < 0.08:          # the drafter proposes fewer than asked
        proposed = max(0, proposed - script.rng.randint(1, 2))
    draft_seconds = catchup_seconds = 0.0
    if k:
        spec = next(s for s in specs if s["name"] == name)
        behave = spec["behave"]
        draft_seconds = script.noisy(behave["t_draft"] * max(proposed, 0.05))
        if spec.get("catchup") and offers[name]["catchup"] > 0:
            catchup_seconds = script.noisy(behave["t_catchup"] * offers[name]["catchup"])
            behave["state"]["cached"] = seq_len
    if proposed:
        spec = next(s for s in specs if s["name"] == name)
        alphas = [round(spec["behave"]["alpha"](script, r, i, offers[name]), 6) for i in range(proposed)]
        accepted = 0
        while accepted < proposed and script.rng.random() < alphas[accepted]:
            accepted += 1
        vw = policy.verify_width(proposed + 1)
        width = min(max(proposed + 1, vw), room)
        record = {"drafter": name, "k": proposed, "accepted": accepted, "alphas": alphas}
    else:
        vw = 1
        width = 1
        record = {"drafter": "none", "k": 0, "accepted": 0, "alphas": []}
    record["committed"] = min(record["accepted"] + 1, left)
    record.update(target_seconds=script.noisy(script.curve(width)), draft_seconds=draft_seconds,
                  catchup_seconds=catchup_seconds, width=width)
    decision["verify_width"] = vw
    event["record"] = record
    event["expect"] = decision
    policy.observe(make_record(record))
    events.append(event)
    return record["committed"], seq_len + record["committed"]


def run_scenario(name, policy_class, specs, policy_kwargs, script: Script, plan) -> dict:
    """Drive `policy_class` through `plan` (a list of ("calibrate", ...), ("observe", ...),
    ("generation", prompt_tokens, max_new_tokens or None, rounds)) and record it all."""
    drafters = {s["name"]: make_drafter(s) for s in specs}
    policy = policy_class(drafters, **policy_kwargs)
    k_max = policy_kwargs.get("k_max", 8)
    events = []
    calibration: dict[str, list] = {s["name"]: [] for s in specs if s.get("calibrate")}
    for step in plan:
        if step[0] == "calibrate":
            _, context_tokens, repeats = step
            target = FakeTarget(script.context_length, lambda n: script.noisy(script.curve(n), 0.2))
            for s in specs:     # the drafter's own timing, as its `calibrate` would report it
                if s.get("calibrate"):
                    timed = [script.noisy(s["behave"]["t_catchup"]), script.noisy(s["behave"]["t_draft"])]
                    drafters[s["name"]].calibration.append(timed)
                    calibration[s["name"]].append(timed)
            curve = _calibrate(policy, target, [7] * context_tokens, repeats)
            events.append({"op": "calibrate", "context_tokens": context_tokens, "repeats": repeats,
                           "context_length": script.context_length, "durations": target.durations,
                           "expect": {str(n): t for n, t in curve.items()}})
        elif step[0] == "observe":
            record = step[1]
            policy.observe(make_record(record))
            events.append({"op": "observe", "record": record})
        else:
            _, prompt, budget, rounds = step
            policy.start(budget)
            events.append({"op": "start", "max_new_tokens": budget})
            for s in specs:     # a new text: a draft model has read none of it
                if s.get("catchup"):
                    s["behave"]["state"]["cached"] = 0
            seq_len, out = prompt, 0
            limit = budget if budget is not None else 10**9
            for r in range(rounds):
                if out >= limit or seq_len >= script.context_length:
                    break
                committed, seq_len = _round(policy, drafters, specs, script, events, seq_len,
                                            limit - out, r, k_max)
                out += committed
    assert not any(d.calibration for d in drafters.values()), "every scripted calibration was used"
    for s in specs:
        s.pop("behave")
        if s["name"] in calibration:
            s["calibration"] = calibration[s["name"]]
    return {"name": name, "drafters": specs, "policy": policy_kwargs, "events": events}


def calibration_record(n: int, seconds: float) -> dict:
    """A raw observation of T_t(n), as a test's stand-in for calibration does."""
    return {"drafter": "calibration", "k": n - 1, "accepted": 0, "committed": 1,
            "alphas": [0.0] * (n - 1), "target_seconds": seconds, "draft_seconds": 0.0,
            "catchup_seconds": 0.0, "width": n}


def _phase(r: int, length: int) -> int:
    return (r // length) % 2


def scenarios(policy_class) -> list[dict]:
    """The recorded scenarios (see the module docstring)."""
    out = []

    # 1. a GPU-like flat curve, a draft model (catch-up, calibration) and prompt lookup
    script = Script(1, lambda n: 0.02 * (1 + 0.05 * (n - 1)))
    model = {"name": "model", "alpha_prior": 0.6, "catchup": True, "calibrate": True,
             "behave": {"available": lambda s, L, r: 1 << 20, "t_draft": 0.004, "t_catchup": 0.0005,
                        "alpha": lambda s, r, i, o: max(0.0, min(1.0, 0.8 - 0.04 * i - 0.75 * _phase(r, 40)
                                                               + s.rng.uniform(-0.1, 0.1))),
                        "state": {"cached": 0}}}
    lookup = {"name": "lookup", "alpha_prior": 0.4,
              "behave": {"available": lambda s, L, r: s.rng.choice([0, 2, 5, 8, 12]), "t_draft": 0.0001,
                         "alpha": lambda s, r, i, o: 0.97 if _phase(r, 40) else 0.1}}
    out.append(run_scenario("gpu_model_and_lookup", policy_class, [model, lookup], {"k_max": 6}, script,
                         [("calibrate", 40, 3), ("generation", 40, 120, 400), ("generation", 300, 150, 400),
                          ("generation", 30, None, 60), ("generation", 50, 5, 10)]))

    # 2. a CPU-like non-monotone curve (padding pays), a drafter that reports its evidence
    costs = {1: 1.0, 2: 2.0, 3: 2.9, 4: 1.85, 5: 1.9}
    script = Script(2, lambda n: costs.get(n, 1.0 + 0.3 * n))

    def confidences(s, r, available):
        strong = s.rng.random() < (0.7 if _phase(r, 50) else 0.2)
        return [[1.0, 20 + i, 3] if strong else [round(s.rng.choice([0.3, 0.6, 0.9]), 2), 1 + i, 5]
                for i in range(available)]

    suffix = {"name": "suffix", "alpha_prior": 0.5, "confidences": True,
              "behave": {"available": lambda s, L, r: s.rng.choice([0, 1, 3, 4, 6]), "t_draft": 0.001,
                         "confidences": confidences,
                         "alpha": lambda s, r, i, o: 0.97 if o["confidences"][i][0] == 1.0 else 0.1}}
    out.append(run_scenario("cpu_suffix_evidence", policy_class, [suffix], {"k_max": 4}, script,
                         [("generation", 60, 150, 400), ("generation", 80, 100, 300)]))

    # 3. a poor draft model behind a long prompt: rationed probes, catch-up charged, back-off
    script = Script(3, lambda n: 1.0 + 0.3 * (n - 1))
    poor = {"name": "model", "alpha_prior": 0.6, "catchup": True, "calibrate": True,
            "behave": {"available": lambda s, L, r: 1 << 20, "t_draft": 0.1, "t_catchup": 0.05,
                       "alpha": lambda s, r, i, o: 0.1 if r < 80 else 0.9, "state": {"cached": 0}}}
    out.append(run_scenario("probes_rationed_long_prompt", policy_class, [poor], {"k_max": 4, "explore_fraction": 0.1},
                         script, [("calibrate", 100, 3), ("generation", 100, 300, 160),
                                  ("generation", 20, 64, 40), ("generation", 650, 2000, 40)]))

    # 4. three drafters, a short context (calibration cut), other options, raw observations
    script = Script(4, lambda n: 0.5 + 0.2 * n, context_length=48)
    specs = [
        {"name": "model", "alpha_prior": 0.6, "catchup": True, "calibrate": True,
         "behave": {"available": lambda s, L, r: 1 << 20, "t_draft": 0.08, "t_catchup": 0.01,
                    "alpha": lambda s, r, i, o: 0.6 + 0.3 * _phase(r, 20), "state": {"cached": 0}}},
        {"name": "lookup", "alpha_prior": 0.4,
         "behave": {"available": lambda s, L, r: s.rng.choice([0, 3, 9]), "t_draft": 0.0001,
                    "alpha": lambda s, r, i, o: 0.5}},
        {"name": "suffix", "alpha_prior": 0.5, "confidences": True,
         "behave": {"available": lambda s, L, r: s.rng.choice([0, 2, 4]), "t_draft": 0.001,
                    "confidences": lambda s, r, a: [[0.8, 4 + i, 2] for i in range(a)],
                    "alpha": lambda s, r, i, o: 0.85}},
    ]
    kwargs = {"k_max": 8, "decay": 0.8, "margin": 0.05, "probe_every": 3, "refresh_every": 10,
              "carry": 0.0, "probe_alpha": 0.8, "explore_slope": 0.2, "prior_weight": 2.0,
              "evidence_decay": 0.9, "alpha_prior": 0.55}
    plan = [("observe", calibration_record(1, 0.7)), ("observe", calibration_record(3, 1.1)),
            ("calibrate", 44, 2), ("generation", 40, 7, 20), ("generation", 30, 12, 20),
            ("generation", 10, 30, 30)]
    out.append(run_scenario("three_drafters_short_context", policy_class, specs, kwargs, script, plan))

    # 5. nothing pays: probes rotate over the drafters, each failed probe doubles the interval
    script = Script(5, lambda n: 1.0 + 0.6 * (n - 1))
    specs = [{"name": name, "alpha_prior": 0.6,
              "behave": {"available": lambda s, L, r: 4, "t_draft": 0.2, "alpha": lambda s, r, i, o: 0.05}}
             for name in ("a", "b", "c")]
    plan = [("observe", calibration_record(n, 1.0 + 0.6 * (n - 1))) for n in range(1, 8)]
    plan += [("generation", 10, None, 80)]
    out.append(run_scenario("nothing_pays_probes_rotate", policy_class, specs,
                         {"k_max": 6, "explore_fraction": 1.0, "probe_every": 4}, script, plan))
    return out


def record(policy_class) -> dict:
    """All scenarios, recorded with `policy_class`."""
    return {"about": __doc__.split("\n\n")[0], "scenarios": scenarios(policy_class)}


def dump(data: dict, path: str) -> None:
    """JSON, one event per line (diffs stay readable)."""
    with open(path, "w") as f:
        f.write('{"about": ' + json.dumps(data["about"]) + ',\n "scenarios": [\n')
        for i, sc in enumerate(data["scenarios"]):
            head = {k: v for k, v in sc.items() if k != "events"}
            f.write("  {" + json.dumps(head)[1:-1] + ', "events": [\n')
            f.write(",\n".join("   " + json.dumps(e, separators=(",", ":")) for e in sc["events"]))
            f.write("]}" + (",\n" if i + 1 < len(data["scenarios"]) else "\n"))
        f.write(" ]}\n")


if __name__ == "__main__":
    from verispec.policy import AdaptivePolicy

    dump(record(AdaptivePolicy), sys.argv[1])
