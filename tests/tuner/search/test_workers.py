"""Workers on one study (SQLite here; tests/tuner/cluster/ runs the same on PostgreSQL): who
sets the study up, who may join, and what happens to a trial whose worker died."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.trial import TrialState

from slo import parse_slo
from tuner.errors import TuneError
from tuner.measure.meter import Meter
from tuner.measure.ratesearch import RateSearchSettings
from tuner.measure.verdict import VerdictRules
from tuner.search.pruner import CapacityPruner
from tuner.search.space import SpaceFacts, build_space
from tuner.search.starting import Scenario, enqueue_starting_configs
from tuner.search.storage import open_storage
from tuner.search.study import SamplerName, make_sampler, recover_stale_trials
from tuner.search.trial import TrialRunner
from tuner.search.workers import RETRY_WINDOW_S, join_study, next_trial, retry_pending, settle
from tuner.store import attrs
from tuner.store.records import Role, TrialEnding
from tuner.store.runfiles import RunFiles
from tuner.targets.knobs import KnobSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)
DEFAULTS = {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 0}  # fmt: skip
SPACE = build_space(
    KnobSpace(DEFAULTS, frozenset(DEFAULTS), "a CPU row"), SpaceFacts(16, 8192, 4000)
)
MINE = {"slo": "tpot_p99=30ms", "device": "cpu:Xeon x2", "model": "tiny"}
SLO = parse_slo("tpot_p99=30ms")


def join(tmp_path, identity=MINE, setups=None):
    """Join the study in tmp_path's SQLite file as a worker with this identity."""
    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path, 1)

    def setup(study: optuna.Study) -> list[str]:
        (setups if setups is not None else []).append(study.study_name)
        return enqueue_starting_configs(study, SPACE, Scenario.CHAT)

    def sampler(seed: int):
        return make_sampler(SamplerName.TPE, seed, 2)

    return join_study(storage, "s", sampler, 0, CapacityPruner(), dict(identity), setup)


def test_the_creator_queues_the_references_and_a_joiner_nothing(tmp_path):
    setups: list[str] = []
    study, first, _ = join(tmp_path, setups=setups)
    _, second, _ = join(tmp_path, setups=setups)
    assert first.created and not second.created and setups == ["s"]
    roles = [attrs.role_of(t) for t in study.get_trials(states=(TrialState.WAITING,))]
    assert roles.count(Role.DEFAULT) == 1 and roles.count(Role.RULE_OF_THUMB) == 1


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"slo": "tpot_p99=50ms"}, "SLO"), ({"device": "cuda:NVIDIA H200"}, "device")],
)
def test_a_worker_whose_identity_differs_is_refused_naming_it(tmp_path, changed, named):
    join(tmp_path)
    with pytest.raises(TuneError) as refused:
        join(tmp_path, {**MINE, **changed})
    message = str(refused.value)
    assert message.startswith(f"this worker's {named} differs from study 's'")
    assert repr(MINE[next(iter(changed))]) in message and "--study-name" in message
    assert "\n" not in message


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def test_a_dead_workers_trial_is_failed_and_measured_again_before_anything_new():
    study = optuna.create_study(direction="maximize")
    enqueue_starting_configs(study, SPACE, Scenario.CHAT)  # default, rule of thumb, sweep
    trial = study.ask()
    knobs = SPACE.suggest(trial)
    attrs.start_trial(trial, attrs.role_of(trial), knobs)
    trial.set_user_attr("level_000", {"rate_rps": 4.0})
    trial.set_user_attr(attrs.WORKER, f"{socket.gethostname()}:{dead_pid()}")

    assert recover_stale_trials(study) == [trial.number]
    assert study.trials[trial.number].state is TrialState.FAIL
    retry = next_trial(study)  # not the rule of thumb, queued earlier
    frozen = study.trials[retry.number]
    assert attrs.retry_of(frozen) == trial.number and attrs.role_of(frozen) is Role.DEFAULT
    assert SPACE.suggest(retry) == knobs
    assert not any(k.startswith(attrs.LEVEL_PREFIX) for k in frozen.user_attrs)


def test_a_screened_trial_measured_again_keeps_its_prediction():
    study = optuna.create_study(direction="maximize")
    queued = attrs.role_attrs(Role.SCREENED, predicted_rps=9.5, predicted_default_rps=6.0)
    study.enqueue_trial(SPACE.to_params(SPACE.default_config()), user_attrs=queued)
    trial = study.ask()
    attrs.start_trial(trial, Role.SCREENED, SPACE.suggest(trial))
    trial.set_user_attr("level_000", {"rate_rps": 9.5})
    trial.set_user_attr(attrs.WORKER, f"{socket.gethostname()}:{dead_pid()}")

    assert recover_stale_trials(study) == [trial.number]
    frozen = study.trials[next_trial(study).number]
    assert attrs.predicted_of(frozen) == 9.5 and attrs.role_of(frozen) is Role.SCREENED
    assert frozen.user_attrs[attrs.PREDICTED_DEFAULT] == 6.0
    assert not any(k.startswith(attrs.LEVEL_PREFIX) for k in frozen.user_attrs)


async def test_settling_waits_for_nothing_when_no_trial_runs_and_hands_back_a_retry(tmp_path):
    study, workers, _ = join(tmp_path)
    assert await settle(study, workers, print) is False
    trial = next_trial(study)
    trial.set_user_attr(attrs.WORKER, f"{socket.gethostname()}:{dead_pid()}")
    # Over SQLite with a heartbeat, Optuna's heartbeat decides; this trial never beat, so the
    # same-host rule of a storage without one is what a resume uses.
    study_without_heartbeat = optuna.load_study(study_name="s", storage=workers.storage.storage.url)
    assert recover_stale_trials(study_without_heartbeat) == [trial.number]
    assert await settle(study, workers, print) is True


async def test_a_config_already_measured_is_not_measured_again(tmp_path, sim_target):
    study = optuna.create_study(direction="maximize")
    knobs = {**DEFAULTS, "max_num_batched_tokens": 512}
    for _ in range(2):
        study.enqueue_trial(SPACE.to_params(knobs), user_attrs=attrs.role_attrs(Role.SEARCH))
    first = study.ask()
    attrs.start_trial(first, Role.SEARCH, SPACE.suggest(first))
    attrs.end_capacity(first, TrialEnding.CONVERGED, 9.5, 10.5)
    study.tell(first, 9.5)

    meter = Meter(sim_target, [], SLO)
    runner = TrialRunner(meter, SPACE, RateSearchSettings(start_rps=4.0), RunFiles(tmp_path),
                         _Silent())  # fmt: skip
    record = await runner.run(study, study.ask())
    assert sim_target.applied == []
    assert record.ending is TrialEnding.DUPLICATE and record.same_as == first.number
    twin = study.trials[record.number]
    assert twin.state is TrialState.COMPLETE and twin.value == 9.5
    assert attrs.read_trial(twin, SLO, VerdictRules()).same_as == first.number


class _Silent:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_a_trial_failed_moments_ago_without_its_retry_keeps_the_study_unsettled(tmp_path):
    # Optuna fails a stale trial, then queues its retry: a worker looking in between must not
    # take the study for settled, or it confirms a study one trial short (seen on PostgreSQL:
    # two workers confirmed, and their reports differed).
    study, _, _ = join(tmp_path)
    trial = next_trial(study)
    study.tell(trial, state=TrialState.FAIL)  # the first of Optuna's two steps
    assert retry_pending(study)
    later = datetime.now() + timedelta(seconds=RETRY_WINDOW_S + 1)
    assert not retry_pending(study, now=later)  # a failure nobody retries waits no longer
    study.enqueue_trial(trial.params)  # the second step, as RetryFailedTrialCallback takes it
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))[-1]
    study._storage.set_trial_system_attr(queued._trial_id, "failed_trial", trial.number)
    assert not retry_pending(study)
