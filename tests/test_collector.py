"""The collector settings of serving processes (in a process of their own: they are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

from engine.collector import SERVING_THRESHOLDS

_PROBE = """
import gc, json
from engine.collector import tune_for_serving
before = (gc.get_threshold(), gc.get_freeze_count())
kept = [[i] for i in range(1000)]  # alive at the call: frozen with the rest
tune_for_serving()
print(json.dumps({"before": before, "after": (gc.get_threshold(), gc.get_freeze_count()),
                  "tracked": gc.is_tracked(kept), "young": gc.get_count()[0]}))
"""


def test_tune_for_serving_sets_the_thresholds_and_freezes_what_lives() -> None:
    probe = [sys.executable, "-c", _PROBE]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout)
    (threshold_before, frozen_before), (threshold_after, frozen_after) = seen["before"], seen["after"]
    assert tuple(threshold_before) != SERVING_THRESHOLDS and frozen_before == 0  # CPython's own
    assert tuple(threshold_after) == SERVING_THRESHOLDS
    assert frozen_after >= 1000  # the probe's own lists at least
    assert seen["tracked"] and seen["young"] < 100  # a full collection ran just before the freeze
