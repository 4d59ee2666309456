"""The machine's pace: the decode burst on the real engine read against a fitted model."""

import asyncio

from engine_lite.costmodel import CostModel, fit
from engine_lite.sim import SimEngine
from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.search import fidelity
from tuner.search.space import SpaceFacts, build_space
from tuner.sim.decode_sweep import decode_sweep
from tuner.sim.machine_pace import machine_pace, paced
from tuner.sim.target import SimTarget
from tuner.store.records import Mode, rules_for
from tuner.targets.factory import TargetOptions, open_target


def test_paced_stretches_every_step_and_keeps_the_serving_latencies():
    model = CostModel(tuple(float(i) for i in range(9)), 0.002, 0.003)
    slow = paced(model, 1.5)
    assert slow.coefficients == tuple(1.5 * i for i in range(9))
    assert (slow.token_delivery_s, slow.request_overhead_s) == (0.002, 0.003)


def test_the_pace_reads_one_against_a_model_of_the_same_steps_and_twice_against_a_halved_one():
    async def run():
        target = open_target(TargetOptions(model="tiny"))
        try:
            facts = target.facts
            sim = fidelity.Simulator.for_target(target, None)
            assert sim is not None and sim.steps is not None
            meter = Meter(target, [], parse_slo("tpot_p99=3600s"),
                          LevelSettings(duration_s=None, min_requests=1),
                          rules_for(Mode.CAPACITY, facts.require_schedule))  # fmt: skip
            space = build_space(target.knobs, SpaceFacts(facts.block_size, facts.max_model_len,
                                                         1536))  # fmt: skip
            assert await machine_pace(sim, meter, space) is None  # nothing fitted yet
            sim.recording(True)
            await decode_sweep(meter, space)  # fit material
            sim.recording(False)
            samples = list(sim.steps.samples)
            model = fit(samples).model
            engine = target.engine
            shape = SimEngine(engine.num_kv_blocks, engine.block_size,
                             engine.max_model_len)  # fmt: skip
            sim.sim = SimTarget(facts, target.knobs, shape, model)
            same = await machine_pace(sim, meter, space)
            sim.sim.model = paced(model, 0.5)
            halved = await machine_pace(sim, meter, space)
            return samples, sim.steps.samples, same, halved
        finally:
            await target.close()

    fitted_on, log_after, same, halved = asyncio.run(run())
    assert len(fitted_on) > 100
    # a gauge, not fit material: the bursts it ran left the log as they found it
    assert log_after == fitted_on
    # a model fitted on one burst reads the next within the machine's own drift, and one
    # that reads every step at half its time reads the machine about twice as slow
    assert 0.6 < same < 1.6
    assert 1.4 * same < halved < 2.8 * same
