"""Clients hanging up at random over many long streams never fail anyone else's stream.

A bounded run of `benchmarks/abort_stress.py` (the 3 x 60 s check is that script's default):
a real `engine-lite serve` process with its thread switch interval cut to 20 us, 64
concurrent long streams to 127.0.0.1, most clients hanging up mid-stream.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "abort_stress.py"


def _load_stress():
    spec = importlib.util.spec_from_file_location("abort_stress", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_random_hang_ups_fail_no_stream_and_leave_no_kv_behind():
    stress = _load_stress()
    args = argparse.Namespace(
        duration=8.0, streams=64, switch_interval_us=20.0, hang_up_frac=0.8, seed=1
    )
    res = stress.run_stress(args)
    assert res.hung_up > 20 and res.completed > 0, res  # the run did exercise both paths
    assert res.failed == 0, res.failures
    assert res.kv_cache_usage_after == 0.0
    assert res.healthy_after
