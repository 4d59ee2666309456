"""The confirmation and the report of a study, done once, by one worker.

A job is a trial in the study's companion study `NAME:confirmation`, one per state of the
study (its number of finished trials). A worker whose search is over and which finds nothing
running claims the job with Optuna's own atomic WAITING -> RUNNING step (the one `Study.ask`
takes a queued trial by), so exactly one worker confirms; it beats while it does, and stores
the run description and the confirmation on the job, from which every worker and
`tune report --storage URL --study-name NAME` build the same report. If it dies, the heartbeat
fails the job and Optuna's retry queues it again for a waiting worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from tuner.search.study import finished_trials, recover_stale_trials
from tuner.search.workers import Workers
from tuner.store import attrs

JOBS_SUFFIX = ":confirmation"


@dataclass(frozen=True, slots=True)
class StoredReport:
    """What the worker that confirmed a study stored for its report."""

    run_info: dict[str, Any]  # its run.json: settings, workload, target, environment
    confirmation: dict[str, Any]  # codec.confirmation_json
    worker: str
    finished_trials: int


@dataclass(slots=True)
class Claim:
    """This worker holds the study's confirmation job."""

    jobs: optuna.Study
    trial: optuna.Trial
    workers: Workers
    finished_trials: int  # the state of the study it confirms

    @contextmanager
    def held(self) -> Iterator[None]:
        """Beat while confirming; a confirmation that raises gives the job back (failed)."""
        with self.workers.beating(self.trial):
            try:
                yield
            except BaseException:
                self.jobs.tell(self.trial, state=TrialState.FAIL, skip_if_finished=True)
                raise

    def done(self, run_info: Mapping[str, Any], confirmation: Mapping[str, Any]) -> None:
        """Store the report's inputs on the job (refused if the heartbeat gave the job to
        another worker meanwhile) and finish it."""
        attrs.save_report(self.trial, run_info, confirmation)
        self.jobs.tell(self.trial, float(self.finished_trials))


def open_jobs(workers: Workers, study_name: str) -> optuna.Study:
    """The study's confirmation jobs (made by whichever worker gets there first)."""
    return optuna.create_study(storage=workers.storage.storage,
                               study_name=study_name + JOBS_SUFFIX, load_if_exists=True,
                               sampler=optuna.samplers.RandomSampler())  # fmt: skip


def load_jobs(storage: BaseStorage, study_name: str) -> optuna.Study | None:
    """The study's confirmation jobs, to read (None before any worker made them)."""
    try:
        return optuna.load_study(study_name=study_name + JOBS_SUFFIX, storage=storage)
    except KeyError:
        return None


async def claim_confirmation(study: optuna.Study, jobs: optuna.Study, workers: Workers,
                             say: Callable[[str], None]) -> Claim | None:  # fmt: skip
    """Claim the job for the study as it stands, or wait until another worker has done it
    (None). Call it only when the study is settled (nothing running)."""
    finished = len(finished_trials(study))
    told = False
    while True:
        outcome = try_claim(jobs, finished, workers)
        if outcome is not False:
            return outcome
        if not told:
            say("another worker confirms the top configs; waiting for its report")
            told = True
        recover_stale_trials(jobs)  # a dead confirmer's job goes back in the queue
        await asyncio.sleep(workers.poll_s)


def try_claim(jobs: optuna.Study, finished: int, workers: Workers) -> Claim | bool | None:
    """A Claim, None when the job is done, False while another worker holds it."""
    mine = [t for t in jobs.get_trials(deepcopy=False) if attrs.job_finished_trials(t) == finished]
    if any(t.state is TrialState.COMPLETE for t in mine):
        return None
    if any(t.state is TrialState.RUNNING for t in mine):
        return False
    waiting = [t for t in mine if t.state is TrialState.WAITING]
    if not waiting:
        # Two workers may both queue one; the lowest-numbered is the one claimed.
        jobs.enqueue_trial({}, user_attrs=attrs.job_attrs(finished))
        return try_claim(jobs, finished, workers)
    first = min(waiting, key=lambda t: t.number)
    try:
        if not jobs._storage.set_trial_state_values(first._trial_id, TrialState.RUNNING):
            return False
    except UpdateFinishedTrialError:
        return False
    trial = optuna.Trial(jobs, first._trial_id)
    attrs.start_job(trial)
    return Claim(jobs, trial, workers, finished)


def latest_report(jobs: optuna.Study) -> StoredReport | None:
    """The report inputs of the latest finished confirmation (the study's latest state)."""
    done = jobs.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    for trial in sorted(done, key=lambda t: (attrs.job_finished_trials(t), t.number),
                        reverse=True):  # fmt: skip
        stored = attrs.report_of(trial)
        if stored is not None:
            return StoredReport(stored[0], stored[1], attrs.worker_of(trial),
                                attrs.job_finished_trials(trial))  # fmt: skip
    return None
