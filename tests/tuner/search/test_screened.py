"""Verification rounds under a time budget: a queued config the budget left unmeasured ends
the rounds instead of being read as a measured one (a 2-minute `tune` crashed on it)."""

import asyncio
from types import SimpleNamespace

import optuna

from tuner.search.screened import _verify_next
from tuner.search.space import BUDGET
from tuner.store.runfiles import RUN_FILE, RunFiles

optuna.logging.set_verbosity(optuna.logging.WARNING)


class NoScreening:
    """Fails the test if the round screens: nothing should be screened or queued again."""

    def __getattr__(self, name):
        raise AssertionError(f"screened again ({name}) with a config still queued")


def test_a_config_queued_but_not_measured_ends_the_verification_rounds(tmp_path):
    files = RunFiles(tmp_path)
    files.ensure()
    files.write_json(RUN_FILE, {"settings": {}, "slo": "tpot_p99=30ms", "study_name": "t"})
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({BUDGET: 256})  # queued by the last round; the search had no time
    run = SimpleNamespace(files=files, study=study, settings=SimpleNamespace(trials=100))
    done = asyncio.run(_verify_next(run, NoScreening(), budget=None, display=None))
    assert done is False
