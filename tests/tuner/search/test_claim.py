"""The study's confirmation: one worker claims it, the others read the report it stores, and a
confirmer that fails hands the job back."""

from __future__ import annotations

import optuna
import pytest

from tuner.search.claim import latest_report, open_jobs, try_claim
from tuner.search.storage import open_storage
from tuner.search.workers import Workers
from tuner.store import attrs

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def workers(tmp_path) -> Workers:
    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path, 1)
    return Workers(storage, "node-a:1", created=True)


def test_one_worker_claims_and_the_others_wait_then_read_its_report(workers):
    jobs = open_jobs(workers, "s")
    claim = try_claim(jobs, 12, workers)
    assert claim is not None and claim is not False
    assert try_claim(jobs, 12, workers) is False  # held: another worker waits
    with claim.held():
        claim.done({"path": "results/a"}, {"candidates": [], "chosen_trial": None})
    assert try_claim(jobs, 12, workers) is None  # done: nothing to claim
    stored = latest_report(jobs)
    assert stored is not None and stored.finished_trials == 12
    assert stored.run_info == {"path": "results/a"} and stored.worker == attrs.worker_id()
    # The study grew after that confirmation: its new state needs one of its own.
    assert try_claim(jobs, 13, workers) not in (None, False)


def test_of_two_jobs_queued_at_once_only_the_first_is_claimed(workers):
    jobs = open_jobs(workers, "s")
    for _ in range(2):  # two workers that found the study settled at the same moment
        jobs.enqueue_trial({}, user_attrs=attrs.job_attrs(7))
    claim = try_claim(jobs, 7, workers)
    assert claim not in (None, False) and claim.trial.number == 0
    assert try_claim(jobs, 7, workers) is False


def test_a_confirmer_that_fails_hands_the_job_back(workers):
    jobs = open_jobs(workers, "s")
    claim = try_claim(jobs, 3, workers)
    with pytest.raises(RuntimeError), claim.held():
        raise RuntimeError("the target went away")
    retry = try_claim(jobs, 3, workers)
    assert retry not in (None, False) and retry.trial.number != claim.trial.number
    assert latest_report(jobs) is None
