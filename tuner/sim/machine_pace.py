"""How fast the machine runs now, against the step-time model fitted earlier in the run.

On a shared 2-core VM the built-in engine's steps drift by tens of percent within minutes, with
no steal and nothing else running: on one afternoon, `chat`'s decode steps of 4 requests took
4.7 ms at the start and 6.1-6.7 ms some minutes later, at any request rate, and the same
request list replayed from the engine's own thread (no event loop beside it) read as slow as
served. A simulator fitted at the start then judges a config measured later against a machine
that is no longer there, and near a config's capacity (where the decode batch grows until the
engine keeps up) a step-time drift of a few percent moves TPOT p99 and the capacity several
times as much (docs/tuner.md, "Why chat reads high near its capacity").

So `machine_pace` runs the decode burst of `tuner/sim/decode_sweep.py` on the default config
(about 4 s on the `tiny` preset) and reads its steps' summed real time over what the model
predicts for them: a gauge that does not depend on the config being measured. Its ratio to
the same reading taken right after the fit is the drift since; `paced` scales a model by it.
`benchmarks/sim_vs_real.py` reports its errors both as fitted and paced this way, which tells
what the model gets wrong from what the machine changed. Built-in engine only: vLLM's steps
are not seen from here.
"""

from __future__ import annotations

import dataclasses

from engine_lite.costmodel import CostModel
from tuner.measure.meter import Meter
from tuner.search import fidelity
from tuner.search.space import SearchSpace
from tuner.sim.decode_sweep import decode_sweep


async def machine_pace(sim: fidelity.Simulator, meter: Meter, space: SearchSpace) -> float | None:
    """The burst's summed step time over the model's reading of the same steps (None where the
    engine's steps are not seen or no model is fitted). The burst's steps are read and then
    dropped from the simulator's step log: they are a gauge, not fit material. Leaves the
    target on the default config."""
    log = sim.steps
    if log is None or sim.sim is None:
        return None
    was_active, start = log.active, len(log.samples)
    sim.recording(True)
    try:
        await decode_sweep(meter, space)
    finally:
        sim.recording(was_active)
    taken = log.samples[start:]
    del log.samples[start:]
    predicted = sum(sim.sim.model.step_s(features) for features, _ in taken)
    if not taken or predicted <= 0:
        return None
    return sum(seconds for _, seconds in taken) / predicted


def paced(model: CostModel, factor: float) -> CostModel:
    """`model` with every step `factor` times as long; the serving path's latencies as fitted."""
    return dataclasses.replace(model, coefficients=tuple(c * factor for c in model.coefficients))
