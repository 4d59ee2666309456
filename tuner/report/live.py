"""What a run is doing right now: a rich Live panel on a terminal, plain lines elsewhere."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tuner.measure.contention import FOREIGN_CORES, SLOW_PACE
from tuner.measure.meter import LevelRecord
from tuner.measure.ratesearch import RateSearch
from tuner.report.summary import short_config
from tuner.store.records import Role, TrialRecord
from tuner.targets.knobs import Knobs


class RunStatus:
    """Everything the display shows, updated by the run and by trials."""

    def __init__(self, total_trials: int, budget_s: float, clock: Callable[[], float],
                 run_dir: str = "", start_s: float | None = None) -> None:  # fmt: skip
        self.total_trials = total_trials
        self.budget_s = budget_s
        self.clock = clock
        self.run_dir = run_dir  # where the run writes, so a person can find (or resume) it
        self.start_s = clock() if start_s is None else start_s  # the run's, when it began earlier
        self.phase = "starting"
        self._phase_start_s = self.start_s
        self._phase_s: dict[str, float] = {}
        self.trial = ""
        self.config = ""
        self.level = ""
        self.bracket = ""
        self.best = "none yet"
        self.last = ""

    def elapsed_s(self) -> float:
        return self.clock() - self.start_s

    def enter(self, phase: str) -> None:
        """Start a phase; the time of the one before adds to its total (a phase entered again,
        such as screening after each verified config, keeps one total)."""
        now = self.clock()
        self._phase_s[self.phase] = self._phase_s.get(self.phase, 0.0) + now - self._phase_start_s
        self.phase, self._phase_start_s = phase, now

    def phase_seconds(self, now: float | None = None) -> dict[str, float]:
        """Seconds spent in each phase up to `now` (the clock's reading when None), in the order
        they were first entered; a caller that also states the elapsed time passes the same
        reading, so the phases add up to it exactly."""
        out = dict(self._phase_s)
        now = self.clock() if now is None else now
        out[self.phase] = out.get(self.phase, 0.0) + now - self._phase_start_s
        return out

    def time_left_s(self) -> float:
        return max(0.0, self.budget_s - self.elapsed_s())


class StatusSink:
    """A `ProgressSink` that keeps a `RunStatus` current; subclasses decide how to show it."""

    def __init__(self, status: RunStatus) -> None:
        self.status = status

    def set_phase(self, phase: str) -> None:
        self.status.enter(phase)
        self.refresh()

    def set_best(self, capacity_rps: float, number: int, unit: str = "req/s") -> None:
        self.status.best = f"{capacity_rps:.2f} {unit} (trial {number})"
        self.refresh()

    def trial_started(self, number: int, role: Role, knobs: Knobs) -> None:
        s = self.status
        label = "" if role is Role.SEARCH else f" [{role.value.replace('_', ' ')}]"
        s.trial = f"{number + 1} of {s.total_trials}{label}"
        s.config = short_config(knobs)
        s.bracket = ""
        self.refresh()

    def level_started(self, rate_rps: float, level_index: int) -> None:
        self.status.level = f"#{level_index + 1} at {rate_rps:.2f} req/s: measuring"
        self.refresh()

    def level_done(self, level: LevelRecord, search: RateSearch | None) -> None:
        s, v = self.status, level.verdict
        verdict = "pass" if level.passed else "FAIL"
        term = v.binding
        detail = f", {term.name} {_ms(term.value_s)}" if term else ""
        if level.stopped_s is not None:  # its served share is over the part it measured
            detail += f", stopped at {level.stopped_s:.0f}s: already over"
        elif v.served_fraction < 0.995:
            detail += f", served {v.served_fraction:.0%}"
        if level.tries > 1:  # the tries before were lagged, or the machine was not ours
            detail += f", try {level.tries}"
        if (level.foreign_cpu_cores or 0) > FOREIGN_CORES:
            detail += f", other processes used {level.foreign_cpu_cores:.1f} cores"
        if (level.step_pace or 0) > SLOW_PACE:
            detail += f", steps at {level.step_pace:.2f}x their usual time"
        s.level = f"at {level.rate_rps:.2f} req/s: {verdict}{detail} ({level.wall_s:.0f}s)"
        if search is not None:
            lo, hi = search.capacity_rps, search.upper_bound_rps
            s.bracket = f">= {lo:.2f}" + ("" if math.isinf(hi) else f", < {hi:.2f}") + " req/s"
        self.refresh()
        self.line(f"  level {s.level}")

    def trial_done(self, trial: TrialRecord) -> None:
        state = trial.state.name.lower()
        value = "" if trial.value is None else f" {trial.value:.2f}"
        self.status.last = f"trial {trial.number + 1}: {state}{value}"
        self.refresh()
        self.line(f"trial {trial.number + 1} {state}{value}: {short_config(trial.knobs)}")

    def refresh(self) -> None:
        return None

    def line(self, text: str) -> None:
        return None

    def __enter__(self) -> StatusSink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveDisplay(StatusSink):
    """The rich Live panel (for terminals); `refresh_per_second` keeps the clock moving."""

    def __init__(self, status: RunStatus, console: Console | None = None) -> None:
        super().__init__(status)
        self.console = console or Console(stderr=True)
        self._live = Live(
            get_renderable=self.render, console=self.console, refresh_per_second=2, transient=False
        )

    def render(self) -> Table:
        s = self.status
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", justify="right")
        table.add_column()
        table.add_row("run folder", s.run_dir or "-")
        table.add_row("phase", s.phase)
        table.add_row("trial", s.trial or "-")
        table.add_row("config", s.config or "-")
        table.add_row("load level", s.level or "-")
        table.add_row("this trial", s.bracket or "-")
        table.add_row("best", s.best)
        table.add_row("last", s.last or "-")
        table.add_row("time", f"{_clock(s.elapsed_s())} elapsed, {_clock(s.time_left_s())} left")
        return table

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)


class LineDisplay(StatusSink):
    """One line per level and trial, for logs and pipes."""

    def __init__(self, status: RunStatus, stream: Any = None) -> None:
        super().__init__(status)
        self.stream = stream or sys.stderr

    def line(self, text: str) -> None:
        left = _clock(self.status.time_left_s())
        print(f"[{left} left] {text}", file=self.stream, flush=True)

    def set_phase(self, phase: str) -> None:
        super().set_phase(phase)
        self.line(phase)

    def __enter__(self) -> LineDisplay:
        if self.status.run_dir:
            self.line(f"run folder: {self.status.run_dir}")
        return self


def make_display(status: RunStatus, quiet: bool) -> StatusSink:
    """Live panel on a terminal, lines otherwise, nothing with --quiet."""
    if quiet:
        return StatusSink(status)
    if sys.stderr.isatty():
        return LiveDisplay(status)
    return LineDisplay(status)


def _ms(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{seconds * 1e3:.1f}ms"


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"
