"""Typed records of a run: one trial, one confirmed candidate, the same-traffic check. The
search writes them, the study keeps them (store/attrs.py), and reports are built from them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from optuna.trial import TrialState

from tuner.measure.meter import LevelRecord
from tuner.measure.ratesearch import LeftOut
from tuner.measure.verdict import Interval, LevelVerdict, VerdictRules
from tuner.targets.knobs import Knobs


class Role(enum.StrEnum):
    """Why a trial exists: a reference config the report compares against, or the search."""

    DEFAULT = "default"
    RULE_OF_THUMB = "rule_of_thumb"
    SWEEP = "sweep"  # a coarse budget sweep queued first: capacity is ~unimodal in the budget
    SCREENED = "screened"  # ranked high by the simulator, measured to verify it
    SEARCH = "search"
    # A confirmation job (in the study's confirmation study, search/claim.py): the top configs
    # re-measured and the report written, once per study, by one worker.
    CONFIRM = "confirm"

    @property
    def is_reference(self) -> bool:
        """Reference configs run to the end; the report compares against their capacity."""
        return self in (Role.DEFAULT, Role.RULE_OF_THUMB)


class Mode(enum.StrEnum):
    """What a trial's value is."""

    CAPACITY = "capacity"  # max req/s meeting the SLO (the default)
    GOODPUT = "goodput"  # vLLM's goodput at the fixed --rate, SLO terms as constraints


class TrialEnding(enum.StrEnum):
    """How a trial's measurement ended."""

    CONVERGED = "converged"  # the capacity bracket closed
    BELOW_MIN = "below_min"  # failed down to the lowest rate worth measuring
    AT_MAX = "at_max"  # passed at the highest rate allowed
    MAX_LEVELS = "max_levels"  # level limit reached before the bracket closed
    PRUNED = "pruned"  # cannot beat the best capacity so far
    TIME_BUDGET = "time_budget"  # cut by the run's deadline
    SERVER_LOST = "server_lost"  # cut by the server exiting or no longer answering
    FEASIBLE = "feasible"  # --rate mode: every constraint holds
    INFEASIBLE = "infeasible"
    DUPLICATE = "duplicate"  # the sampler proposed a config already measured or in flight

    @property
    def cut(self) -> bool:
        """The measurement stopped before the rate search did: a capacity so ended is at most
        a lower bound."""
        return self in (TrialEnding.TIME_BUDGET, TrialEnding.SERVER_LOST)


@dataclass(slots=True)
class TrialRecord:
    """One trial as the study keeps it."""

    number: int
    state: TrialState
    role: Role
    knobs: Knobs
    levels: list[LevelRecord] = field(default_factory=list)
    value: float | None = None  # Optuna's value, for complete trials
    capacity_rps: float | None = None
    upper_bound_rps: float | None = None
    ending: TrialEnding | None = None
    constraints: list[float] = field(default_factory=list)  # --rate mode: <= 0 holds
    worker: str = ""  # "host:pid" of the process that measured it
    retry_of: int | None = None  # the trial whose worker died and which this one measures again
    same_as: int | None = None  # a duplicate: the trial that measured (or measures) this config
    predicted_rps: float | None = None  # --fidelity sim: the capacity screening gave it
    predicted_default_rps: float | None = None  # ... and the default's, by the same model
    left_out: LeftOut | None = None  # cut by the deadline: the level it had no time for
    # An earlier attempt at this config ended before its search did (cut by the time budget,
    # or left by a killed run): this trial went on from its levels (rate, passed), which stay
    # with that trial and are not counted again here.
    continues: int | None = None
    carried: list[tuple[float, bool]] = field(default_factory=list)
    # Those levels as the study holds them, each with the trial and index it was measured as
    # (RunView links them): what the report shows for a capacity one of them measured.
    carried_records: list[tuple[int, int, LevelRecord]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in (TrialState.COMPLETE, TrialState.PRUNED)

    @property
    def feasible(self) -> bool:
        return all(c <= 0 for c in self.constraints)

    @property
    def measurement_s(self) -> float:
        return sum(level.wall_s for level in self.levels)

    @property
    def search_positions(self) -> list[tuple[int, int, LevelRecord]]:
        """Its search's levels, each with the trial and index it was measured as: those it
        went on from, then its own (which may be none)."""
        return self.carried_records + [(self.number, i, lv) for i, lv in enumerate(self.levels)]

    @property
    def search_levels(self) -> list[LevelRecord]:
        return [level for _, _, level in self.search_positions]

    def level_at(self, rate_rps: float | None) -> LevelRecord | None:
        """The last level its search measured at this rate."""
        hits = [lv for lv in self.search_levels if rate_rps and lv.rate_rps == rate_rps]
        return hits[-1] if hits else None


@dataclass(slots=True)
class Candidate:
    """One top config after re-measurement."""

    trial: int
    role: Role
    knobs: Knobs
    search_value: float  # capacity (req/s) or goodput at --rate, as the search measured it
    verdict: LevelVerdict  # pooled runs with intervals, at the confirmed rate when there is one
    repeats: int  # re-measurements made
    confirmed_rps: float  # the capacity envelope of rates whose intervals clear (0: none)
    capacity_ci: Interval | None = None
    goodput_ci: Interval | None = None

    @property
    def clears(self) -> bool:
        return self.confirmed_rps > 0


@dataclass(slots=True)
class SameRateCheck:
    """The default measured at the recommended config's confirmed rate, beside the latter."""

    rate_rps: float
    default: LevelVerdict  # its runs pooled, terms with intervals
    recommended: LevelVerdict
    recommended_repeats: int
    default_draws: int = 1  # arrival draws the default's verdict pools
    default_draws_missed: int | None = None  # of them, those it missed on alone (None: unknown)
    # Of them, those stopped once their SLO was already broken: their figures are over the
    # requests that finished before the stop.
    default_draws_stopped: int = 0


@dataclass(slots=True)
class Confirmation:
    """What the confirmation phase decided."""

    candidates: list[Candidate]
    chosen_trial: int | None
    same_rate: SameRateCheck | None
    stopped_by: str
    elapsed_s: float | None
    # Seconds per phase of the run (tuner/report/live.py), this process's only on a resume.
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def chosen(self) -> Candidate | None:
        return next((c for c in self.candidates if c.trial == self.chosen_trial), None)


def rules_for(mode: Mode, require_schedule: bool) -> VerdictRules:
    """A run's verdict rules: keep-up only when capacity is the value (vLLM's goodput at a
    fixed rate already pays for a queue); the schedule only where the client stamps chunks."""
    return VerdictRules(require_keep_up=mode is Mode.CAPACITY, require_schedule=require_schedule)
