"""`tune profile` on the built-in engine: a file naming what it measured, that the simulator
and a sim-mode bench read back."""

import json
import subprocess
import sys

import pytest

from engine_lite.costmodel import StepFeatures
from tuner.cli import main
from tuner.sim.profile import Profile


@pytest.mark.slow
def test_profile_of_the_builtin_engine_is_a_file_the_simulator_reads(tmp_path, capsys):
    out = tmp_path / "tiny.json"
    argv = ["profile", "--num-requests", "80", "--level-seconds", "3", "--out", str(out), "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    profile = Profile.load(out)
    assert printed == profile.to_json()
    assert profile.engine.startswith("engine_lite") and profile.model == "tiny"
    assert profile.steps > 500 and profile.median_rel_error < 0.5
    # The smallest step costs something, and a prefill chunk more, on any machine: the fit is
    # not degenerate. (Which coefficient carries a step's fixed cost, the per-step or the
    # per-request one, is the fit's choice: every step schedules at least one request.)
    cost = profile.model_cost
    one_decode = cost.step_s(StepFeatures(num_reqs=1, decode_context=64, sampled=1))
    chunk = cost.step_s(StepFeatures(num_reqs=1, prefill_chunks=1, prefill_tokens=512,
                                     prefill_attn=512 * 256, sampled=1))  # fmt: skip
    assert 0 < one_decode < chunk
    assert profile.shape.max_model_len == 8192 and profile.shape.num_kv_blocks > 0


def test_a_profile_to_an_impossible_place_is_one_line_before_measuring(tmp_path):
    bad = tmp_path / "missing" / "p.json"
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "profile", "--out", str(bad)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: --out") and "existing folder" in proc.stderr
    # A folder that exists but takes no file (here /proc) fails before anything is measured.
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "profile", "--out", "/proc/p.json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "cannot be written" in proc.stderr
