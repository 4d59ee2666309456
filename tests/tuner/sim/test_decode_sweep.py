"""The decode burst every step-time fit of the built-in engine sees: decode batches from many
requests down to one, on the real engine."""

import asyncio

import pytest

from slo import parse_slo
from tuner.measure.meter import LevelSettings, Meter
from tuner.search.space import SpaceFacts, build_space
from tuner.sim.calibrate import StepLog
from tuner.sim.decode_sweep import SWEEP_REQUESTS, decode_sweep, sweep_requests
from tuner.store.records import Mode, rules_for
from tuner.targets.factory import TargetOptions, open_target


@pytest.mark.parametrize("max_model_len", [64, 300, 8192])
def test_the_burst_fits_any_context_and_is_the_same_every_time(max_model_len):
    requests = sweep_requests(max_model_len, vocab_size=1000)
    assert len(requests) == SWEEP_REQUESTS
    assert all(r.prompt_len + r.output_len <= max_model_len for r in requests)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in requests)
    again = sweep_requests(max_model_len, vocab_size=1000)
    assert [(r.prompt_token_ids, r.output_len) for r in again] == [
        (r.prompt_token_ids, r.output_len) for r in requests
    ]
    if max_model_len == 8192:  # lengths spread, so the batch shrinks a finish at a time
        assert len({r.output_len for r in requests}) > SWEEP_REQUESTS // 2


def test_the_fit_sees_decode_batches_of_every_size_on_the_real_engine():
    async def run():
        target = open_target(TargetOptions(model="tiny"))
        try:
            facts = target.facts
            steps = StepLog()
            target.engine.add_step_listener(steps)
            steps.active = True
            meter = Meter(target, [], parse_slo("tpot_p99=3600s"),
                          LevelSettings(duration_s=None, min_requests=1),
                          rules_for(Mode.CAPACITY, facts.require_schedule))  # fmt: skip
            space = build_space(target.knobs, SpaceFacts(facts.block_size, facts.max_model_len,
                                                         1536))  # fmt: skip
            run = await decode_sweep(meter, space)
            return run, steps.samples
        finally:
            await target.close()

    run, samples = asyncio.run(run())
    assert len(run.records) == SWEEP_REQUESTS and all(r.success for r in run.records)
    decode_batches = {f.num_reqs for f, _ in samples if f.prefill_tokens == 0}
    assert max(decode_batches) >= 64  # the many-row steps a `mixed` level lacks
    assert 1 in decode_batches and len([n for n in decode_batches if n <= 4]) >= 3
    assert len([n for n in decode_batches if 16 <= n <= 64]) >= 20
