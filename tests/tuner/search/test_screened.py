"""Verification rounds: a queued config the budget left unmeasured ends the rounds instead of
being read as a measured one (a 2-minute `tune` crashed on it), and once a verified config has
held its gain, the next is verified only if the simulator puts it a step above the best."""

import asyncio
from types import SimpleNamespace

import optuna
from optuna.trial import TrialState

from engine_lite import EngineConfig
from engine_lite.defaults import CPU_DEVICE
from tuner.report.simulated import sim_note
from tuner.search.fidelity import Simulator, summary
from tuner.search.screened import _verify_next
from tuner.search.space import BUDGET, SpaceFacts, build_space
from tuner.sim.screen import Screened, grid
from tuner.store import attrs
from tuner.store.records import Mode, Role, TrialEnding
from tuner.store.runfiles import RUN_FILE, RunFiles
from tuner.targets.knobs import KnobSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)
DEFAULTS = EngineConfig().resolved(CPU_DEVICE, max_model_len=4096)[0].scheduler_knobs()
FACTS = SpaceFacts(block_size=16, max_model_len=4096, longest_prompt=3000)


def space():
    return build_space(KnobSpace(DEFAULTS, frozenset(DEFAULTS), "vLLM 0.32's CPU default"), FACTS)


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


class Lines:
    def __init__(self):
        self.lines = []

    def set_phase(self, phase):
        pass

    def line(self, text):
        self.lines.append(text)


class Screening(Simulator):
    """The run's simulator with its screening replaced by a fixed ranking."""

    async def rescreen(self, space, start_rps):
        return self.ranked


def verified_run(tmp_path, first, measured_rps, goal_s=None):
    """A run with the default measured at 6 req/s and `first` verified at `measured_rps`, 80 s
    into it; levels of 10 s."""
    files = RunFiles(tmp_path)
    files.ensure()
    files.write_json(RUN_FILE, {"settings": {}, "slo": "tpot_p99=30ms", "study_name": "t"})
    study = optuna.create_study(direction="maximize")
    sp = space()
    for role, knobs, rps in ((Role.DEFAULT, sp.default_config(), 6.0),
                             (Role.SCREENED, first, measured_rps)):  # fmt: skip
        trial = study.ask()
        attrs.start_trial(trial, role, knobs)
        attrs.end_capacity(trial, TrialEnding.CONVERGED, rps, rps * 1.15)
        study.tell(trial, rps)
    settings = SimpleNamespace(trials=100, rel_tol=0.15, top_k=3, repeats=1, rate_rps=None,
                               robust=False, resolved_goal_s=lambda: goal_s)  # fmt: skip
    budget = SimpleNamespace(fits=lambda s: True, elapsed_s=80.0)
    meter = SimpleNamespace(expected_level_s=lambda rps: 10.0, target=None)
    return SimpleNamespace(
        files=files, study=study, settings=settings, space=sp, meter=meter, mode=Mode.CAPACITY
    ), budget


def ended_verification(run, sim, budget) -> str:
    """Once a verified config held, the round queues nothing and says why, in the progress and
    in the report's simulator summary alike."""
    display = Lines()
    assert not asyncio.run(_verify_next(run, sim, budget, display, held=True))
    assert not [t for t in run.study.trials if t.state is TrialState.WAITING]
    assert summary(sim, [])["verification_ended"] == display.lines[-1]
    return display.lines[-1]


def test_verification_ends_when_the_next_config_is_within_a_step_of_the_best_measured(tmp_path):
    # t1 of this machine: 432 / 32 simulated at 11.71, measured at 8.85; the refitted model
    # then put 432 / 32 adaptive at 10.25, and it measured 8.91: 20 s for a tie.
    first, twin = [k for k in grid(space(), [432], thresholds=True)
                   if k["long_prefill_token_threshold"] == 32][:2]  # fmt: skip
    run, budget = verified_run(tmp_path, first, 8.85)
    sim = Screening(target=None, steps=None, profile=None)
    sim.ranked = [Screened(first, 10.4, 3), Screened(twin, 10.25, 3)]
    why = ended_verification(run, sim, budget)
    assert "within a tolerance step" in why
    assert why in sim_note({"sim": {**summary(sim, []), "screen_s": 1.0}})
    # More than a step above the best measured one (under the same model): verified.
    sim.ranked = [Screened(twin, 12.2, 3), Screened(first, 10.4, 3)]
    assert asyncio.run(_verify_next(run, sim, budget, Lines(), held=True))
    queued = [t for t in run.study.trials if t.state is TrialState.WAITING]
    assert len(queued) == 1 and run.space.suggest(run.study.ask()) == twin


def test_verification_ends_when_one_more_config_would_end_the_run_past_its_goal(tmp_path):
    first, second = grid(space(), [432, 1024], thresholds=False)[:2]
    run, budget = verified_run(tmp_path, first, 8.85, goal_s=120.0)
    sim = Screening(target=None, steps=None, profile=None)
    # Far more than a step above the best measured config: only the goal stops it.
    sim.ranked = [Screened(second, 14.0, 3), Screened(first, 10.4, 3)]
    # 80 s in, three 10 s levels to verify and the confirmation's reserve: past 120 s.
    assert "past its 120 s goal (--goal)" in ended_verification(run, sim, budget)
    # The first verified config overstated its gain: the goal does not stop the search.
    assert asyncio.run(_verify_next(run, sim, budget, Lines(), held=False))
    assert len([t for t in run.study.trials if t.state is TrialState.WAITING]) == 1


def test_a_goal_that_leaves_time_verifies_the_next_config(tmp_path):
    first, second = grid(space(), [432, 1024], thresholds=False)[:2]
    run, budget = verified_run(tmp_path, first, 8.85, goal_s=600.0)
    sim = Screening(target=None, steps=None, profile=None)
    sim.ranked = [Screened(second, 14.0, 3), Screened(first, 10.4, 3)]
    assert asyncio.run(_verify_next(run, sim, budget, Lines(), held=True))
    assert sim.verification_ended is None
