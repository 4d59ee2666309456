"""The simulator: the real scheduler in virtual time, each step as long as the cost model says."""

import itertools
import random
import time

import pytest

from engine_lite import EngineConfig, EngineLiteError
from engine_lite.costmodel import FEATURE_NAMES, CostModel, StepFeatures, features_of, fit
from engine_lite.request import Request, RequestStatus
from engine_lite.sampling_params import SamplingParams
from engine_lite.scheduler import Scheduler
from engine_lite.sim import SimEngine, SimRequest, simulate

SHAPE = SimEngine(num_kv_blocks=4096, block_size=16, max_model_len=8192)
# 2 ms a step plus 50 us a request and 10 us a prefill token: a 4096-token prompt in one step
# stalls every decode beside it for ~41 ms.
MODEL = CostModel((0.002, 5e-5, 0.0, 1e-5, 0.0, 0.0, 0.0, 0.0, 0.0), token_delivery_s=0.001,
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
    truth = (0.003, 1e-4, 1.3e-3, 2e-5, 1e-8, 2e-7, 1e-5, 3e-4, 4e-7)
    model = CostModel(truth)
    samples = []
    for i in range(90):
        decodes = [(i * 7 % 300, 1, False, True)] * (i % 30)
        prefills = [(i * 13 % 500 * k, 64 + i * k, True, (i + k) % 2 == 0) for k in range(i % 3)]
        f = features_of(decodes + prefills or [(0, 5, True, True)])
        samples.append((f, model.step_s(f)))
    report = fit(samples, context_s=4e-7)
    assert report.median_rel_error < 1e-6
    for got, want in zip(report.model.coefficients, truth, strict=True):
        assert abs(got - want) <= 1e-6 * max(1.0, want) + 1e-3 * want
    assert CostModel.from_json(report.model.to_json()) == report.model
    assert len(FEATURE_NAMES) == len(StepFeatures().vector())


def test_a_chunk_cost_measured_apart_fixes_what_chunks_of_one_size_leave_unidentified():
    # Serving steps whose chunks are all 64 tokens: chunk count and prefill tokens move
    # together, so the fit alone splits their cost arbitrarily and a lone 512-token chunk
    # (a large budget's step) is read at half its time.
    truth = CostModel((0.003, 1e-4, 7e-4, 2e-5, 1e-8, 2e-7, 1e-5, 3e-4, 0.0))
    samples = []
    for i in range(120):
        decodes = [(100 + i * 7 % 300, 1, False, True)] * (1 + i % 24)
        chunks = [(64 * k + i % 5 * 64, 64, True, False) for k in range(i % 4)]
        f = features_of(decodes + chunks)
        samples.append((f, truth.step_s(f)))
    lone = features_of([(0, 512, True, True)] + [(200, 1, False, True)] * 8)
    alone = fit(samples).model
    assert alone.step_s(lone) < 0.7 * truth.step_s(lone)
    # The probe measures a chunk with its request row: 0.7 + 0.1 ms.
    pinned = fit(samples, chunk_s=8e-4).model
    assert abs(pinned.step_s(lone) / truth.step_s(lone) - 1) < 0.01
    assert abs(pinned.coefficients[1] + pinned.coefficients[2] - 8e-4) < 1e-9


def test_a_context_read_measured_apart_prices_small_chunks_after_long_prompts():
    # Serving steps of a large budget: one chunk of 512-2048 tokens a step, whose cached
    # context grows with its attention work. Fitted alone, the read a chunk pays per cached
    # position goes onto the attention term, which charges a 16-token chunk a hundredth of a
    # 2048-token one's: a small threshold's steps read fast. With the probe's figure they do not.
    truth = CostModel((0.003, 1e-4, 3e-4, 2e-5, 7e-9, 2e-7, 1e-5, 3e-4, 4e-7))
    samples = []
    for i in range(150):
        n = (512, 1024, 2048)[i % 3]
        chunk = [(n * (i % 4), n, True, False)] if i % 5 else []
        f = features_of([(100 + i * 7 % 300, 1, False, True)] * (1 + i % 24) + chunk)
        samples.append((f, truth.step_s(f)))
    small = features_of([(3000, 16, True, False)] * 8 + [(200, 1, False, True)] * 8)
    alone = fit(samples, chunk_s=4e-4).model
    assert alone.coefficients[FEATURE_NAMES.index("chunk_context")] == 0.0  # never fitted
    assert alone.step_s(small) < 0.8 * truth.step_s(small)
    pinned = fit(samples, chunk_s=4e-4, context_s=4e-7).model
    assert abs(pinned.step_s(small) / truth.step_s(small) - 1) < 0.01


def test_a_fit_on_steps_mostly_of_few_requests_still_reads_the_few_wide_ones():
    # A row's cost bends (steep to 8 rows, flat beyond), which no linear feature draws; 2000
    # steps of 1-8 requests (a `mixed` level's) and 40 of 16-96 (a decode burst's). Fitted on
    # the steps as they came, the narrow ones set the per-row cost and the wide steps read
    # 1.22-1.42x their time: a simulator so fitted puts a workload of wide batches low.
    def truth(n: int, ctx: int) -> float:
        return 1e-3 + 2e-4 * min(n, 8) + 2e-5 * max(0, n - 8) + 2e-7 * n * ctx

    rng = random.Random(0)
    samples = []
    for i in range(2040):
        n = rng.randint(1, 8) if i < 2000 else rng.choice((16, 32, 64, 96))
        ctx = rng.randint(100, 3000)
        samples.append((features_of([(ctx, 1, False, True)] * n), truth(n, ctx)))
    model = fit(samples).model
    for n in (2, 6, 32, 64, 96):
        read = model.step_s(features_of([(500, 1, False, True)] * n))
        assert abs(read / truth(n, 500) - 1) < 0.05


def test_a_profile_saved_before_the_small_row_cost_loads_and_predicts_as_it_did():
    saved = MODEL.to_json()
    del saved["coefficients"]["small_rows"]
    del saved["coefficients"]["chunk_context"]
    assert CostModel.from_json(saved) == MODEL
    del saved["coefficients"]["num_reqs"]  # a feature every profile has: malformed without it
    with pytest.raises(EngineLiteError, match="num_reqs"):
        CostModel.from_json(saved)


def test_a_step_costs_the_dot_product_of_its_features_to_the_bit():
    # step_s is written out for speed; a virtual-time figure must not move by a bit for it.
    rng = random.Random(3)
    model = CostModel(tuple(rng.uniform(0, 1e-3) for _ in FEATURE_NAMES))
    for _ in range(200):
        f = StepFeatures(*(rng.randrange(0, 5000) for _ in range(3)), rng.uniform(0, 1e7),
                         *(rng.randrange(0, 5000) for _ in range(4)))  # fmt: skip
        dot = sum(c * x for c, x in zip(model.coefficients, f.vector(), strict=True))
        assert model.step_s(f) == dot
    with pytest.raises(EngineLiteError, match="9 coefficients"):
        CostModel((0.001, 0.0))


def test_each_step_reports_the_features_of_the_batch_it_scheduled():
    cfg, _ = EngineConfig(max_num_batched_tokens=256, max_num_seqs=16,
                          long_prefill_token_threshold=64).resolved(SHAPE.device, 8192)  # fmt: skip
    sched = Scheduler(cfg, 48, 16, 8192)
    for i in range(24):
        params = SamplingParams(max_tokens=40 + 9 * (i % 9))
        sched.add_request(Request(str(i), [7] * (20 + 53 * (i % 7)), params, 0.0))
    steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        batch = [(r.num_computed_tokens, n, r.is_prefill, r.num_computed_tokens + n == r.num_tokens)
                 for r, n in out.scheduled]  # fmt: skip
        assert out.features == features_of(batch)
        assert out.num_prefill_reqs + out.num_decode_reqs == len(out.scheduled)
        assert out.total_num_scheduled_tokens == sum(n for _, n in out.scheduled)
        done = []
        for req, n in out.scheduled:
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                req.output_token_ids.append(7)
                if len(req.output_token_ids) >= req.sampling_params.max_tokens:
                    done.append((req, RequestStatus.FINISHED_LENGTH))
        sched.finish_requests(done)
        steps += 1
    assert steps > 100 and sched.num_preemptions_total > 0  # a small cache: preemptions too
