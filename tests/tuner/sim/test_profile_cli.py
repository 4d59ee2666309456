"""`tune profile` on the built-in engine: a file naming what it measured, that the simulator
and a sim-mode bench read back."""

import json
import subprocess
import sys

import pytest

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
    coef = profile.model_cost.to_json()["coefficients"]
    # A prefill token and a step cost something on any machine; the fit is not degenerate.
    assert coef["step"] > 0 and coef["prefill_tokens"] + coef["prefill_attn"] > 0
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
