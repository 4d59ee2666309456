"""Several `tune` workers on one study in a real PostgreSQL: one killed mid-trial (a real
SIGKILL) loses no finished trial, no config is measured twice, and every worker, like
`tune report --storage` from anywhere, prints the same report."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tuner.cli import main
from tuner.errors import TuneError
from tuner.search.pruner import CapacityPruner
from tuner.search.storage import open_storage
from tuner.search.study import SamplerName, make_sampler
from tuner.search.workers import join_study
from tuner.store import attrs

optuna.logging.set_verbosity(optuna.logging.WARNING)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def worker_args(url: str, study: str, run_dir: Path, *extra: str) -> list[str]:
    # Synthetic levels of 0.3 s from a 40-request list; a 2 s heartbeat, so a dead worker's
    # trial is failed about 6 s after its last beat (a loaded 2-core CI machine is slow to
    # beat; the cause of this test's one-in-twenty failure was another, see settle()).
    return ["--slo", "tpot_p99=30ms", "--synthetic", "0.3", "--storage", url,
            "--study-name", study, "--trials", "14", "--heartbeat-interval", "2",
            "--num-requests", "40", "--level-seconds", "2", "--start-rate", "4",
            "--time-budget", "10m", "--json", "--run-dir", str(run_dir), *extra]  # fmt: skip


def trials_of(storage: optuna.storages.RDBStorage, study: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def kill_a_worker_mid_trial(
    procs: dict[str, Any], storage: optuna.storages.RDBStorage, study: str
) -> tuple[str, list]:
    """SIGKILL a worker that has finished a trial and is partway through another; returns its
    name and the study's finished trials just before. The trial is caught after one level that
    passed: its rate search must climb, so the kill lands during its next level, not after it."""
    by_pid = {str(p.pid): name for name, p in procs.items()}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            trials = trials_of(storage, study)
        except KeyError:  # the first worker is creating the study right now
            continue
        done = {attrs.worker_of(t) for t in trials if t.state in FINISHED}
        for t in trials:
            worker = attrs.worker_of(t)
            levels = [v for k, v in t.user_attrs.items() if k.startswith(attrs.LEVEL_PREFIX)]
            climbing = len(levels) == 1 and levels[0]["passed"]
            name = by_pid.get(worker.rpartition(":")[2])
            if t.state is TrialState.RUNNING and climbing and worker in done and name:
                procs[name].send_signal(signal.SIGKILL)  # no chance to clean up
                return name, [x for x in trials if x.state in FINISHED]
        time.sleep(0.05)  # polling a live study: how often to look, not a timing assumption
    pytest.fail("no worker was caught mid-trial: " + procs["a"].stderr.read())


@pytest.mark.slow
def test_three_workers_one_killed_mid_trial(
    postgres_url, study_name, tmp_path, start_worker, capsys
):
    procs = {n: start_worker(worker_args(postgres_url, study_name, tmp_path / n)) for n in "abc"}
    storage = optuna.storages.RDBStorage(postgres_url)  # one connection pool for all the polls
    victim, before = kill_a_worker_mid_trial(procs, storage, study_name)
    reports = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        if name == victim:
            assert proc.returncode == -signal.SIGKILL
            continue
        assert proc.returncode == 0, err
        reports[name] = json.loads(out)
    trials = trials_of(storage, study_name)

    # Every trial is accounted for: finished, or failed with its dead worker and retried.
    states = Counter(t.state for t in trials)
    assert set(states) <= {*FINISHED, TrialState.FAIL} and states[TrialState.FAIL] >= 1
    retried = {attrs.retry_of(t): t for t in trials if attrs.retry_of(t) is not None}
    for failed in (t for t in trials if t.state is TrialState.FAIL):
        assert attrs.worker_of(failed).endswith(f":{procs[victim].pid}")
        assert retried[failed.number].state in FINISHED
        assert attrs.role_of(retried[failed.number]) is attrs.role_of(failed)
    # The killed worker lost no trial it had finished.
    for old in before:
        new = trials[old.number]
        assert (new.state, new.value, new.user_attrs) == (old.state, old.value, old.user_attrs)
    # The default was measured exactly once, and no config twice.
    finished = [t for t in trials if t.state in FINISHED]
    assert [attrs.role_of(t).value for t in finished].count("default") == 1
    measured = [json.dumps(attrs.knobs_of(t), sort_keys=True) for t in finished
                if any(k.startswith(attrs.LEVEL_PREFIX) for k in t.user_attrs)]  # fmt: skip
    assert len(measured) == len(set(measured))
    assert len(finished) >= 14

    # One report, the same from every surviving worker and from `tune report --storage`.
    first, *others = reports.values()
    for other in others:  # on a mismatch, say which parts differ
        differ = {k: (first.get(k), other.get(k)) for k in first.keys() | other.keys()
                  if first.get(k) != other.get(k)}  # fmt: skip
        assert not differ, json.dumps(differ, default=str)[:4000]
    argv = ["report", str(tmp_path / "r"), "--storage", postgres_url, "--study-name",
            study_name, "--json"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert all({"state", "role"} <= set(t) for t in first["trials"])
    assert {t["state"] for t in first["trials"]} >= {"complete", "fail"}
    workers = first["workers"]
    assert len(workers) == 3 and sum(w["confirmed_and_reported"] for w in workers) == 1
    assert sum(str(w["joined"]).startswith("created") for w in workers) == 1


@pytest.mark.slow
def test_a_worker_with_another_workload_refuses_to_join(postgres_url, study_name, tmp_path,
                                                        start_worker):  # fmt: skip
    first = start_worker(worker_args(postgres_url, study_name, tmp_path / "a", "--trials", "1"))
    assert first.wait(timeout=120) == 0, first.stderr.read()
    other = start_worker(worker_args(postgres_url, study_name, tmp_path / "b",
                                     "--num-requests", "50"))  # fmt: skip
    out, err = other.communicate(timeout=120)
    assert other.returncode == 2 and out == ""
    line = err.strip()
    assert line.startswith("error: this worker's workload fingerprint") and "\n" not in line
    assert study_name in line and "--study-name" in line


def test_a_worker_on_other_hardware_refuses_to_join(postgres_url, study_name, tmp_path):
    storage = open_storage(postgres_url, tmp_path, 1)

    def join(device: str) -> optuna.Study:
        mine = {"slo": "tpot_p99=30ms", "device": device, "model": "llama-8b"}
        return join_study(storage, study_name, lambda seed: make_sampler(SamplerName.TPE, seed, 2),
                          0, CapacityPruner(), mine, lambda study: [])[0]  # fmt: skip

    join("cuda:NVIDIA H100 80GB HBM3")
    join("cuda:NVIDIA H100 80GB HBM3")  # the same hardware joins
    with pytest.raises(TuneError) as refused:
        join("cuda:NVIDIA A100-SXM4-80GB")
    assert str(refused.value).startswith("this worker's device differs from study")
    assert "'cuda:NVIDIA H100 80GB HBM3'" in str(refused.value)
    assert "'cuda:NVIDIA A100-SXM4-80GB'" in str(refused.value)
