"""Resuming a run that was stopped mid-trial, on the simulated target and clock: a cut trial's
config is measured again, going on from the levels it finished, and a cut never reads as a
measured zero."""

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from tuner.cli import main
from tuner.run import run_tune
from tuner.settings import TuneSettings

ROOT = Path(__file__).resolve().parents[2]


def run_settings(run_dir, **changes) -> TuneSettings:
    # A known start rate (no calibration level), short levels, one config confirmed.
    base = {"slo": "tpot_p99=30ms", "num_requests": 40, "level_s": 1.0, "trials": 8,
            "time_budget_s": 600.0, "top_k": 1, "start_rps": 4.0, "run_dir": str(run_dir),
            "storage": str(run_dir / "study.journal")}  # fmt: skip
    return TuneSettings(**{**base, **changes})


async def test_a_default_cut_by_ctrl_c_goes_on_from_its_last_level_to_the_same_capacity(
    tmp_path, fake_clock, faulty_target
):
    fresh = await run_tune(run_settings(tmp_path / "fresh"), quiet=True, clock=fake_clock,
                           target=faulty_target())  # fmt: skip

    # Ctrl-C (a cancellation inside asyncio) during the default's second level.
    with pytest.raises(asyncio.CancelledError):
        await run_tune(run_settings(tmp_path / "cut"), quiet=True, clock=fake_clock,
                       target=faulty_target(at_level=2))  # fmt: skip
    # A resume with a short budget: the references still run, the default first.
    resumed = await run_tune(run_settings(tmp_path / "cut", time_budget_s=150.0), quiet=True,
                             clock=fake_clock, target=faulty_target())  # fmt: skip

    default = resumed["default"]
    assert default["capacity_rps"] == fresh["default"]["capacity_rps"] > 0
    # The level finished before the interrupt is not measured again: the search goes on.
    again = next(t for t in resumed["trials"] if t["trial"] == default["trial"])
    assert again["continues"] == 0 and again["carried_levels"] == 1
    assert again["levels"] + 1 == fresh["trials"][0]["levels"]
    assert resumed["ratio_vs_default"] is not None
    # The summary quotes the default's figure (here no other config beat it: only the
    # references fit in the short budget).
    assert "vLLM default" in resumed["summary"]
    assert f"{default['capacity_rps']:.2f} req/s" in resumed["summary"]


async def test_an_interrupted_run_has_its_trials_table_up_to_the_interrupted_level(
    tmp_path, fake_clock, faulty_target
):
    target = faulty_target(at_level=7)  # the default takes the first few levels; then the next
    with pytest.raises(asyncio.CancelledError):
        await run_tune(run_settings(tmp_path), quiet=True, clock=fake_clock, target=target)
    table = pd.read_csv(tmp_path / "trials.csv")
    assert len(table) == 6  # every level measured before the interrupt
    assert table["state"].iloc[0] == "complete" and table["state"].iloc[-1] == "fail"


@pytest.mark.slow
def test_ctrl_c_in_the_default_trial_then_a_short_resume_still_measures_the_default(
    tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = ["--slo", "tpot_p99=30ms", "--trials", "4", "--param",
            "max_num_batched_tokens=2048..8192", "--run-dir", str(run_dir), "--num-requests", "8",
            "--start-rate", "4", "--max-levels", "3", "--rate-tolerance", "0.5"]  # fmt: skip

    # SIGINT at its default, as from a terminal: a suite started in the background by a script
    # inherits it ignored, and tune would keep that and run to its end.
    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    tune = subprocess.Popen([sys.executable, "-m", "tuner.cli", *args], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)  # fmt: skip
    try:
        for line in tune.stderr:  # the default is the first trial; stop it after one level
            if "level at" in line:
                tune.send_signal(signal.SIGINT)
                break
        assert tune.wait(timeout=120) == 130
    finally:
        tune.kill()

    # Far too short for the queue (rule of thumb, sweep, the default again): the default,
    # which the report compares everything with, goes first and goes on from its first level.
    assert main(["--resume", str(run_dir), "--time-budget", "20s", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["default"]["capacity_rps"] > 0 and rec["ratio_vs_default"] is not None
    study = optuna.load_study(study_name="tune-mixed", storage=f"sqlite:///{run_dir}/study.db")
    defaults = [t for t in study.trials if t.user_attrs.get("role") == "default"]
    assert [t.state for t in defaults] == [TrialState.FAIL, TrialState.COMPLETE]
    cut, again = defaults[0].user_attrs["level_000"], defaults[-1].user_attrs
    assert again["continues_trial"] == defaults[0].number
    assert again["carried_levels"] == [[cut["rate_rps"], cut["passed"]]]
    # The rate it measured is not measured again: the search steps on from it.
    assert again["level_000"]["rate_rps"] != cut["rate_rps"]
