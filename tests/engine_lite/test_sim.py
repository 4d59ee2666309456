"""The simulator: the real scheduler in virtual time, each step as long as the cost model says."""

import itertools
import time

import pytest

from engine_lite import EngineConfig, EngineLiteError
from engine_lite.costmodel import FEATURE_NAMES, CostModel, StepFeatures, features_of, fit
from engine_lite.sim import SimEngine, SimRequest, simulate

SHAPE = SimEngine(num_kv_blocks=4096, block_size=16, max_model_len=8192)
# 2 ms a step plus 50 us a request and 10 us a prefill token: a 4096-token prompt in one step
# stalls every decode beside it for ~41 ms.
MODEL = CostModel((0.002, 5e-5, 0.0, 1e-5, 0.0, 0.0, 0.0, 0.0), token_delivery_s=0.001,
                  request_overhead_s=0.0005)  # fmt: skip


def test_a_lone_request_takes_its_prefill_steps_then_one_step_per_token():
    cfg = EngineConfig(max_num_batched_tokens=256, max_num_seqs=8)
    (tl,) = simulate(cfg, SHAPE, MODEL, [SimRequest(1.0, 600, 4)])
    # 600 prompt tokens in chunks of 256, 256, 88; then 3 decode steps
    first = 1.0 + 0.0005 + (0.002 + 5e-5 + 256e-5) * 2 + (0.002 + 5e-5 + 88e-5) + 0.001
    assert abs(tl.token_times_s[0] - first) < 1e-9
    gaps = [b - a for a, b in zip(tl.token_times_s, tl.token_times_s[1:], strict=False)]
    assert all(abs(g - (0.002 + 5e-5)) < 1e-9 for g in gaps) and len(tl.token_times_s) == 4


def test_a_long_prompt_in_one_step_stalls_the_decodes_and_chunking_removes_the_stall():
    reqs = [SimRequest(0.01 * i, 64, 200) for i in range(8)] + [SimRequest(0.5, 4096, 4)]

    def worst_gap(budget):
        tls = simulate(EngineConfig(max_num_batched_tokens=budget), SHAPE, MODEL, reqs)
        times = [tl.token_times_s for tl in tls[:8]]
        return max(b - a for t in times for a, b in itertools.pairwise(t))

    assert worst_gap(8192) > 0.04
    assert worst_gap(256) < 0.006


def test_identical_inputs_give_identical_timelines_fast():
    reqs = [SimRequest(0.05 * i, 100 + 37 * (i % 9), 20 + i % 50) for i in range(300)]
    cfg = EngineConfig(max_num_batched_tokens=512, max_num_seqs=64)
    start = time.perf_counter()
    a = simulate(cfg, SHAPE, MODEL, reqs)
    elapsed = time.perf_counter() - start
    b = simulate(cfg, SHAPE, MODEL, reqs)
    assert [t.token_times_s for t in a] == [t.token_times_s for t in b]
    assert all(len(t.token_times_s) == r.output_len for t, r in zip(a, reqs, strict=True))
    assert elapsed < 30  # a generous bound for a busy runner; typically ~0.1 s


def test_fit_recovers_the_coefficients_that_made_the_steps():
    truth = (0.003, 1e-4, 1.3e-3, 2e-5, 1e-8, 2e-7, 1e-5, 3e-4)
    model = CostModel(truth)
    samples = []
    for i in range(90):
        decodes = [(i * 7 % 300, 1, False, True)] * (i % 30)
        prefills = [(i * 13 % 500 * k, 64 + i * k, True, (i + k) % 2 == 0) for k in range(i % 3)]
        f = features_of(decodes + prefills or [(0, 5, True, True)])
        samples.append((f, model.step_s(f)))
    report = fit(samples)
    assert report.median_rel_error < 1e-6
    for got, want in zip(report.model.coefficients, truth, strict=True):
        assert abs(got - want) <= 1e-6 * max(1.0, want) + 1e-3 * want
    assert CostModel.from_json(report.model.to_json()) == report.model
    assert len(FEATURE_NAMES) == len(StepFeatures().vector())


def test_a_profile_saved_before_the_small_row_cost_loads_and_predicts_as_it_did():
    saved = MODEL.to_json()
    del saved["coefficients"]["small_rows"]
    assert CostModel.from_json(saved) == MODEL
    del saved["coefficients"]["num_reqs"]  # a feature every profile has: malformed without it
    with pytest.raises(EngineLiteError, match="num_reqs"):
        CostModel.from_json(saved)
