"""Several `tune` workers on one study, coordinated by Optuna alone.

The worker that creates the study sets it up (queues the references and the budget sweep,
then records the study's identity); another joins only once that identity is there and equals
its own. While a trial runs its worker beats (Optuna's heartbeat, on a shared RDB storage), so
a dead worker's trial is failed and queued again, and the next trial a worker takes is such a
retry before anything new. A worker whose search is over waits until no trial runs anywhere,
taking over any retry that appears, so the study always ends with every trial accounted for.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from tuner.errors import TuneError
from tuner.search.storage import RunStorage
from tuner.search.study import (
    STORAGE_ERRORS,
    ask,
    first_line,
    heartbeat_on,
    recover_stale_trials,
)
from tuner.store import attrs, identity

# How long a joining worker waits for the creator to finish setting the study up (it takes
# milliseconds; only a creator killed right then leaves a study without an identity).
SETUP_WAIT_S = 60.0
POLL_WITHOUT_HEARTBEAT_S = 2.0


@dataclass(slots=True)
class Workers:
    """This worker's place among the study's workers."""

    storage: RunStorage
    worker: str  # "host:pid"
    created: bool  # this worker created the study and set it up
    facts: dict[str, Any] = field(default_factory=dict)  # what the study records about it

    def record_search(self, study: optuna.Study) -> None:
        """Add what this worker's search spent in storage calls to its entry in the study
        (what coordination cost: benchmarks/cluster_scaling.py reads it)."""
        clock = self.storage.clock
        self.facts.update(storage_s=clock.seconds, storage_calls=clock.calls)
        attrs.register_worker(study, self.worker, self.facts)

    @property
    def poll_s(self) -> float:
        """How often a waiting worker looks at the study again."""
        beat = self.storage.heartbeat_s
        return beat / 2 if beat else POLL_WITHOUT_HEARTBEAT_S

    @contextmanager
    def beating(self, trial: optuna.Trial) -> Iterator[None]:
        """Optuna's heartbeat for a running trial, on its own thread (Study.optimize runs the
        same loop; an ask-and-tell worker runs it itself)."""
        rdb, interval = self.storage.heartbeat, self.storage.heartbeat_s
        if rdb is None or interval is None:
            yield
            return
        trial_id = trial._trial_id  # the id Optuna's own heartbeat thread takes
        rdb.record_heartbeat(trial_id)  # before the trial runs: never RUNNING without a beat
        stop = threading.Event()
        thread = threading.Thread(target=_beat, args=(rdb, trial_id, interval, stop), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _beat(rdb: Any, trial_id: int, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        try:
            rdb.record_heartbeat(trial_id)
        except Exception:  # a database blip: the next beat tries again; silence fails the trial
            continue


def join_study(
    storage: RunStorage, study_name: str, sampler: Callable[[int], BaseSampler], seed: int,
    pruner: BasePruner, mine: dict[str, Any], setup: Callable[[optuna.Study], list[str]],
) -> tuple[optuna.Study, Workers, list[str]]:  # fmt: skip
    """Create and set up the study, or join it if its identity is this worker's.

    `sampler(seed)` builds this worker's sampler: the creator keeps `seed`, a joiner takes one
    of its own, so that workers asking at the same moment do not propose the same config.
    Returns the study, this worker's place, and the setup's notes (creator only).
    """
    worker = attrs.worker_id()
    try:
        study = _create(storage, study_name, sampler(seed), pruner)
        created, notes = True, []
    except optuna.exceptions.DuplicatedStudyError:
        joiner_seed = (seed + zlib.crc32(worker.encode())) % 2**31
        study = _load(storage, study_name, sampler(joiner_seed), pruner)
        created, notes = False, []
    if created:
        notes = setup(study)
        attrs.set_study_meta(study, mine)  # last: a joiner waits for it
    else:
        _check_identity(study, study_name, mine)
    role = "created the study and queued the references" if created else "joined"
    workers = Workers(storage, worker, created, {"role": role, "device": mine.get("device")})
    attrs.register_worker(study, worker, workers.facts)
    return study, workers, notes


def _create(storage: RunStorage, name: str, sampler: BaseSampler,
            pruner: BasePruner) -> optuna.Study:  # fmt: skip
    try:
        return optuna.create_study(storage=storage.storage, study_name=name, sampler=sampler,
                                   pruner=pruner, direction="maximize")  # fmt: skip
    except optuna.exceptions.DuplicatedStudyError:
        raise
    except STORAGE_ERRORS as exc:  # a damaged or unwritable storage file, a lost database
        raise TuneError(f"cannot create study {name!r} in its storage: {first_line(exc)}") from None


def _load(storage: RunStorage, name: str, sampler: BaseSampler,
          pruner: BasePruner) -> optuna.Study:  # fmt: skip
    try:
        return optuna.load_study(study_name=name, storage=storage.storage, sampler=sampler,
                                 pruner=pruner)  # fmt: skip
    except (KeyError, *STORAGE_ERRORS) as exc:
        raise TuneError(f"cannot load study {name!r} from its storage: {first_line(exc)}") from None


def _check_identity(study: optuna.Study, name: str, mine: dict[str, Any]) -> None:
    deadline = time.monotonic() + SETUP_WAIT_S
    while (stored := attrs.study_meta(study)) is None:
        if time.monotonic() > deadline:
            raise TuneError(
                f"study {name!r} exists but was never set up (its first worker stopped while "
                "creating it); pass a new --study-name"
            )
        time.sleep(0.2)
    if why := identity.mismatch(name, stored, mine):
        raise TuneError(why)


def next_trial(study: optuna.Study, retry_first: bool = True) -> optuna.Trial:
    """A dead worker's trial queued again, before anything new (`retry_first`: when there may
    be one); else what Optuna hands out."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) if retry_first else []
    for frozen in waiting:
        if attrs.retry_of(frozen) is None:
            continue
        try:  # Optuna's atomic WAITING -> RUNNING step, the one Study.ask takes a queued trial by
            if study._storage.set_trial_state_values(frozen._trial_id, TrialState.RUNNING):
                return optuna.Trial(study, frozen._trial_id)
        except UpdateFinishedTrialError:
            continue
    with warnings.catch_warnings():
        # Optuna expects a heartbeat storage under Study.optimize; `Workers.beating` runs it.
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        return ask(study)  # a queued reference before what the sampler proposes


def retry_waiting(study: optuna.Study) -> bool:
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    return any(attrs.retry_of(t) is not None for t in waiting)


# Under a heartbeat, Optuna fails a stale trial and queues its retry in two steps; a trial
# failed this recently whose retry is not queued yet may be between them.
RETRY_WINDOW_S = 10.0


def retry_pending(study: optuna.Study, now: datetime | None = None) -> bool:
    """A trial failed moments ago with no retry queued yet: the study is not settled (a worker
    that confirmed then would confirm a study one trial short of the one reported)."""
    if not heartbeat_on(study):
        return False  # no heartbeat: a worker fails and requeues a stale trial itself
    trials = study.get_trials(deepcopy=False)
    retried = {attrs.retry_of(t) for t in trials}
    since = (now or datetime.now()) - timedelta(seconds=RETRY_WINDOW_S)
    return any(t.state is TrialState.FAIL and t.number not in retried
               and t.datetime_complete is not None and t.datetime_complete > since
               for t in trials)  # fmt: skip


async def settle(study: optuna.Study, workers: Workers, say: Callable[[str], None]) -> bool:
    """Wait until no trial runs anywhere. True as soon as a dead worker's trial has been queued
    again (measure it), False when the study is settled."""
    said: set[int] = set()
    while True:
        recover_stale_trials(study)
        if retry_waiting(study):
            return True
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running and not retry_pending(study):
            return False
        if new := {t.number for t in running} - said:
            said |= new
            numbers = ", ".join(str(n + 1) for n in sorted(new))
            say(f"search over here; waiting for trial(s) {numbers} on other workers")
        await asyncio.sleep(workers.poll_s)
