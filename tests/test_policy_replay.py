"""The adaptive policy takes the decisions it took when its rounds were recorded.

`tests/data/policy_schedule.json` holds scripted rounds (plain rounds, probes, evidence
drafters, catch-up, calibration, budget exhaustion, several generations) with the decisions
the policy took on them: (drafter, k) per round, the verification widths, calibration's
curve and the predicted speedups, as exact floats. Replaying the inputs must give the same
decisions: a refactor of the policy changes no decision unless it means to (then the
recording is regenerated on purpose, see `tests/policy_replay.py`).
"""

import json
from pathlib import Path

import pytest

from policy_replay import expected, replay
from verispec.policy import AdaptivePolicy

RECORDING = json.loads((Path(__file__).parent / "data" / "policy_schedule.json").read_text())


@pytest.mark.parametrize("scenario", RECORDING["scenarios"], ids=lambda s: s["name"])
def test_replayed_rounds_take_the_recorded_decisions(scenario):
    got, want = replay(scenario, AdaptivePolicy), expected(scenario)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{scenario['name']}: event {i} ({scenario['events'][i]['op']}) decided differently"


def test_the_recording_covers_what_the_policy_decides():
    """Plain rounds, drafting with every drafter, probes after plain streaks, padded
    verification, budget exhaustion and calibration all occur in the recording."""
    choices = {}
    for sc in RECORDING["scenarios"]:
        for e in sc["events"]:
            if e["op"] == "round":
                name, k = e["expect"]["choice"]
                choices.setdefault(sc["name"], []).append((name, k))
    every = [c for cs in choices.values() for c in cs]
    assert any(k == 0 for _, k in every) and any(k > 0 for _, k in every)
    drafted = {(sc, n) for sc, cs in choices.items() for n, k in cs if k}
    assert {("gpu_model_and_lookup", "model"), ("gpu_model_and_lookup", "lookup"),
            ("cpu_suffix_evidence", "suffix"), ("nothing_pays_probes_rotate", "a"),
            ("nothing_pays_probes_rotate", "b"), ("nothing_pays_probes_rotate", "c")} <= drafted
    padded = [e for sc in RECORDING["scenarios"] for e in sc["events"]
              if e["op"] == "round" and e["record"]["width"] > e["record"]["k"] + 1 and e["record"]["k"]]
    assert padded
    assert sum(e["op"] == "calibrate" for sc in RECORDING["scenarios"] for e in sc["events"]) >= 3
