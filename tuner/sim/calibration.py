"""Levels a fit needs that a workload's own levels lack, run once before the first fit.

- The built-in engine's step fit: the decode burst (`decode_sweep`: batches from 96 requests
  down to one), then a level on a small budget with a threshold (chunks of every size).
- vLLM's span fit (`read_back`): the decode burst alone, its spans fitted beside the default's
  levels. A level on a small budget would cost a server start (45-75 s on a CPU); the burst
  runs on the default the server already serves. Fitted on `mixed` alone, whose decode steps
  hold fewer than 24 rows, the span fit put `chat` at 24 and at 64 req/s in two runs where
  vLLM measured 24-57 and 38-45 (docs/tuner.md).
"""

from __future__ import annotations

import math

from tuner.measure.meter import LevelRun, Meter
from tuner.search.space import BUDGET, THRESHOLD, SearchSpace
from tuner.sim.calibrate import RealLevel
from tuner.sim.decode_sweep import decode_sweep
from tuner.targets.knobs import Knobs

CALIBRATION_BUDGET = 256  # the small budget of the built-in engine's extra level
CALIBRATION_LOAD = 0.6  # its rate, as a share of the default's capacity


def calibration_config(space: SearchSpace) -> Knobs:
    """A small budget with a threshold: steps of small chunks, which the default lacks."""
    knobs = {**space.default_config(), BUDGET: CALIBRATION_BUDGET}
    if THRESHOLD in knobs:
        knobs[THRESHOLD] = CALIBRATION_BUDGET // 4
    return space.normalise(knobs)


async def calibration_level(meter: Meter, space: SearchSpace, capacity_rps: float) -> LevelRun:
    """The built-in engine's: wide decode batches, then small chunks (its steps are logged)."""
    await decode_sweep(meter, space)
    await meter.target.apply(calibration_config(space))
    return await meter.level(max(0.1, CALIBRATION_LOAD * capacity_rps))


async def burst_level(meter: Meter, space: SearchSpace) -> RealLevel:
    """vLLM's: the decode burst on the default, as a level its span fit reads."""
    run = await decode_sweep(meter, space)
    return RealLevel(space.default_config(), math.inf, run.records)
