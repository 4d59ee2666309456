"""Levels a fit needs that a workload's own levels lack, run once before the first fit.

- The built-in engine's step fit: the decode burst (`decode_sweep`: batches from 96 requests
  down to one), then a level on a small budget with a threshold (chunks of every size).
- vLLM's span fit (`read_back`): the decode burst alone, its spans fitted beside the default's
  levels. A level on a small budget would cost a server start (45-75 s on a CPU); the burst
  runs on the default the server already serves. Side by side on one default search on
  `mixed` (docs/tuner.md), the fit without it put budget 512 / threshold 128 below the
  default, where vLLM measured it at 1.70x; with it, `mixed`'s configs ranked as measured and
  the TPOT p99 errors fell, most on `chat` (40-273% at half load to 2-61%). It is fitted with
  the levels, but the refit to their tail leaves it out: it has no rate to match.
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
