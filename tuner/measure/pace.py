"""Did the built-in engine's steps run at this run's usual pace during a level?

`/proc` does not see everything that slows a shared VM. Measured on the 2-core machine this
project is developed on, nothing else running and no steal: one config (the CPU default), one
draw, one rate (`mixed`, 5 req/s), eight levels in a row read median TPOT 6.3-23.2 ms and TPOT
p99 11.8-97.8 ms. Their steps ran 0.97-1.74x a cost model fitted on all of them, in the order
of their TPOT; a one-thread matmul timed beside them moved only 2.90-3.32 ms. So the engine's
own steps are the gauge: each level's steps against a step-time model (engine_lite/costmodel.py)
fitted on every step of the levels this run kept, and the pace of a level is the median over
its steps of real over modelled time, relative to the median of the earlier levels' paces
under the same model. A level slower than `SLOW_PACE` is measured again (`Meter.level`).

Only for a target whose steps this process sees (the built-in engine); vLLM's are not reported.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

from engine_lite.costmodel import StepFeatures, fit
from engine_lite.errors import EngineLiteError

SLOW_PACE = 1.15  # a level's steps this much slower than the run's usual are measured again
MIN_LEVEL_STEPS = 50  # fewer steps do not give a level a pace
MIN_EARLIER = 2  # levels kept before one can be judged against them
KEEP_LEVELS = 24  # the most recent kept levels the model and the usual pace come from
LEVEL_SAMPLES = 800  # steps kept of a level (evenly spaced): bounds each fit's cost

Samples = list[tuple[StepFeatures, float]]


class StepPace:
    """Listens to an engine's steps; `start()` and `stop()` bracket one level."""

    def __init__(self, engine: Any) -> None:
        self._lock = threading.Lock()  # steps arrive on the engine's thread
        self._current: Samples | None = None
        self.kept: list[Samples] = []
        engine.add_step_listener(self)

    def __call__(self, step: Any) -> None:
        with self._lock:
            if self._current is not None and step.features.num_reqs and step.step_duration_s > 0:
                self._current.append((step.features, step.step_duration_s))

    def start(self) -> None:
        with self._lock:
            self._current = []

    def stop(self) -> float | None:
        """This level's pace over the usual (1.0: as usual; None: too little to tell). A level
        judged slow is not kept, so it neither moves the model nor what counts as usual."""
        with self._lock:
            level, self._current = self._current or [], None
        if len(level) < MIN_LEVEL_STEPS:
            return None
        if len(self.kept) < MIN_EARLIER:
            self._keep(level)
            return None
        pool = [s for earlier in self.kept for s in earlier] + level
        try:
            model = fit(pool).model
        except EngineLiteError:
            return None
        usual = statistics.median(_pace(model, earlier) for earlier in self.kept)
        relative = _pace(model, level) / usual if usual > 0 else None
        if relative is not None and relative <= SLOW_PACE:
            self._keep(level)
        return relative

    def _keep(self, level: Samples) -> None:
        every = -(-len(level) // LEVEL_SAMPLES)
        self.kept = [*self.kept, level[::every]][-KEEP_LEVELS:]


def _pace(model: Any, samples: Samples) -> float:
    ratios = [s / p for f, s in samples if (p := model.step_s(f)) > 0]
    return statistics.median(ratios) if ratios else 0.0
