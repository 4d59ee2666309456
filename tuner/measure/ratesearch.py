"""Pure capacity search: given pass/fail at the load levels so far, pick the next rate.

Capacity is the highest arrival rate at which every SLO term holds (DistServe's goodput,
OSDI'24). Pass/fail is close to monotone in the rate, so the search brackets the boundary and
bisects it in log space. It holds no clock and does no I/O: a caller measures each rate it is
given and records the verdict, which keeps it testable in microseconds and reusable by
`tune bench` and by simulators.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from tuner.errors import TuneError
from tuner.measure.verdict import capacity_envelope


class Outcome(enum.Enum):
    """Why a search stopped."""

    RUNNING = "running"
    CONVERGED = "converged"  # bracket narrower than the tolerance
    BELOW_MIN = "below_min"  # failed down to the lowest rate worth measuring
    AT_MAX = "at_max"  # passed at the highest rate allowed
    MAX_LEVELS = "max_levels"  # level limit reached before the bracket closed


@dataclass(frozen=True)
class RateSearchSettings:
    """How a capacity search moves between load levels."""

    start_rps: float
    growth: float = 2.0  # climb/descend factor until the boundary is bracketed
    rel_tol: float = 0.1  # stop once upper/lower - 1 <= rel_tol
    min_rps: float = 0.05
    max_rps: float = 1e6
    max_levels: int = 8

    def __post_init__(self) -> None:
        if not self.start_rps > 0 or not math.isfinite(self.start_rps):
            raise TuneError(f"start_rps={self.start_rps} must be a positive finite rate")
        if self.growth <= 1:
            raise TuneError(f"growth={self.growth} must exceed 1")
        if self.rel_tol <= 0:
            raise TuneError(f"rel_tol={self.rel_tol} must be positive")
        if not 0 < self.min_rps <= self.max_rps:
            raise TuneError(f"min_rps={self.min_rps} and max_rps={self.max_rps} are not a range")
        if self.max_levels < 1:
            raise TuneError(f"max_levels={self.max_levels} must be at least 1")


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A level the search asked for and the caller had no time to measure."""

    rate_rps: float
    requests: int
    expected_s: float  # its arrivals and drain
    short_s: float  # how far past the deadline it would have ended
    # The time budget of the run whose deadline that was (a resume may give another): the
    # budget under which the level fits is this plus `short_s`.
    budget_s: float | None = None


@dataclass
class RateSearch:
    """State of one capacity search; call `next_rate()` then `record()` until it returns None."""

    settings: RateSearchSettings
    levels: list[tuple[float, bool]] = field(default_factory=list)  # (rate, passed) as measured
    outcome: Outcome = Outcome.RUNNING
    # The level a deadline kept from starting, when one did: what a slow target needed.
    left_out: LeftOut | None = None

    @property
    def capacity_rps(self) -> float:
        """Highest passing rate below the lowest failing one (0 when none passed)."""
        return capacity_envelope(self.levels)[0]

    @property
    def upper_bound_rps(self) -> float:
        """Lowest failing rate: capacity is below it (inf until a level fails)."""
        return capacity_envelope(self.levels)[1]

    @property
    def done(self) -> bool:
        return self.outcome is not Outcome.RUNNING

    def record(self, rate_rps: float, passed: bool) -> None:
        """Add a measured level and decide whether the search is over."""
        if self.done:
            raise RuntimeError("record() after the search ended")
        self.levels.append((rate_rps, passed))
        self.left_out = None  # a level measured since: what was left out before is moot
        self.outcome = self._decide()

    def next_rate(self) -> float | None:
        """The next rate to measure, or None once the search has ended."""
        if self.done:
            return None
        s = self.settings
        if not self.levels:
            return min(max(s.start_rps, s.min_rps), s.max_rps)
        lo, hi = capacity_envelope(self.levels)
        if math.isinf(hi):
            return min(lo * s.growth, s.max_rps)
        if lo == 0.0:
            return max(hi / s.growth, s.min_rps)
        return math.sqrt(lo * hi)

    def _decide(self) -> Outcome:
        s = self.settings
        lo, hi = capacity_envelope(self.levels)
        if lo > 0 and hi / lo - 1 <= s.rel_tol:
            return Outcome.CONVERGED
        if lo == 0 and hi <= s.min_rps * (1 + 1e-9):
            return Outcome.BELOW_MIN
        if math.isinf(hi) and lo >= s.max_rps * (1 - 1e-9):
            return Outcome.AT_MAX
        if len(self.levels) >= s.max_levels:
            return Outcome.MAX_LEVELS
        return Outcome.RUNNING
