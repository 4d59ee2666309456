"""A step-time model fitted to what a server's clients saw: the spans from first to last token
and the times to first token, through the real scheduler, with a few milliseconds of jitter."""

import random
import re

import numpy as np

from engine_lite import EngineConfig
from engine_lite.costmodel import FEATURE_NAMES, CostModel
from engine_lite.sim import SimEngine, SimRequest, simulate
from loadgen import RequestRecord, RequestSpec
from slo import parse_slo
from tuner.measure.meter import Meter
from tuner.search.fidelity import Simulator
from tuner.sim.calibrate import RealLevel, compare, refit, scaled
from tuner.sim.read_back import fit_served
from tuner.sim.target import SimTarget
from tuner.targets.base import TargetFacts, TargetKind
from tuner.targets.knobs import KnobSpace

SHAPE = SimEngine(num_kv_blocks=1 << 15, block_size=16, max_model_len=8192)
COEF = {"step": 0.002, "num_reqs": 1e-4, "prefill_chunks": 1e-3, "prefill_tokens": 1.2e-5,
        "prefill_attn": 1e-8, "decode_context": 2e-7, "sampled": 5e-5}  # fmt: skip
TRUTH = CostModel(tuple(COEF.get(n, 0.0) for n in FEATURE_NAMES), request_overhead_s=0.008)
KNOBS = {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "enable_chunked_prefill": True,
         "long_prefill_token_threshold": 0,
         "long_prefill_token_threshold_adaptive": False}  # fmt: skip


def served_level(rate_rps: float, seed: int, jitter_s: float, first_index: int = 0) -> RealLevel:
    """What a client of a server running TRUTH would have recorded: every token late by up
    to `jitter_s` (delivery on a busy machine), in order."""
    rng = random.Random(seed)
    t, sim = 0.0, []
    for _ in range(120):
        t += rng.expovariate(rate_rps)
        long = rng.random() < 0.1
        prompt = rng.randint(4096, 7680) if long else rng.randint(64, 1024)
        sim.append(SimRequest(t, prompt, rng.choice([4, 12, 60, 200])))
    lines = simulate(EngineConfig(**KNOBS), SHAPE, TRUTH, sim)
    records = []
    for i, (req, line) in enumerate(zip(sim, lines, strict=True)):
        times = sorted(x + rng.uniform(0, jitter_s) for x in line.token_times_s)
        records.append(RequestRecord(first_index + i, "long" if req.prompt_len > 4000 else "short",
                                     req.prompt_len, req.output_len, req.arrival_s,
                                     sent_s=req.arrival_s, chunk_times_s=times,
                                     chunk_tokens=[1] * len(times), prompt_tokens=req.prompt_len,
                                     output_tokens=req.output_len, success=True))  # fmt: skip
    return RealLevel(KNOBS, rate_rps, records)


def test_the_fit_reproduces_what_clients_saw_at_a_rate_it_never_saw():
    fitted = fit_served([served_level(4.0, 0, 0.006), served_level(8.0, 1, 0.006)], SHAPE)
    assert fitted is not None and fitted.mean_rel_error < 0.1
    # Held out: another seed and rate, no jitter. Each request's decode span and TTFT.
    held = served_level(6.0, 7, 0.0)
    sim = [SimRequest(r.sent_s, r.prompt_len, r.output_tokens) for r in held.records]
    mine = simulate(EngineConfig(**KNOBS), SHAPE, fitted.model, sim)
    real_span = np.array([r.chunk_times_s[-1] - r.chunk_times_s[0] for r in held.records])
    my_span = np.array([t.token_times_s[-1] - t.token_times_s[0] for t in mine])
    long_spans = real_span > 0.05
    assert np.median(np.abs(my_span - real_span)[long_spans] / real_span[long_spans]) < 0.1
    real_ttft = np.array([r.chunk_times_s[0] - r.sent_s for r in held.records])
    my_ttft = np.array([t.token_times_s[0] - t.arrival_s for t in mine])
    assert abs(np.percentile(my_ttft, 99) / np.percentile(real_ttft, 99) - 1) < 0.2


def test_too_few_finished_requests_fit_nothing():
    level = served_level(4.0, 0, 0.0)
    assert fit_served([RealLevel(KNOBS, 4.0, level.records[:3])], SHAPE) is None


class ServedLikeVllm:
    """What the simulator asks of a vLLM target: its kind, knobs and engine shape."""

    facts = TargetFacts(TargetKind.VLLM, "vLLM 0.32 (served levels)", "tiny", "cpu", 8192,
                        32000, 16, require_schedule=True)  # fmt: skip
    knobs = KnobSpace(KNOBS, frozenset(KNOBS), "vLLM 0.32's CPU row")

    def sim_shape(self) -> SimEngine:
        return SHAPE


def two_levels() -> tuple[list[RealLevel], Meter]:
    levels = [served_level(4.0, 0, 0.006), served_level(8.0, 1, 0.006, first_index=1000)]
    specs = [RequestSpec(r.index, [1] * r.prompt_len, r.output_len, r.class_name)
             for lv in levels for r in lv.records]  # fmt: skip
    return levels, Meter(ServedLikeVllm(), specs, parse_slo("tpot_p99=30ms"))


async def tail_errors(sim: SimTarget, meter: Meter, levels: list[RealLevel]) -> list[float]:
    return [(await compare(sim, meter, lv))["tpot_p99"] for lv in levels]


async def test_a_model_too_fast_for_the_served_tail_is_scaled_to_it():
    # Steps 1.6x slower than the model says (another machine, another engine's profile):
    # the refit finds the factor from the levels' percentiles, and their TPOT p99 follows.
    levels, meter = two_levels()
    sim = SimTarget(ServedLikeVllm.facts, ServedLikeVllm.knobs, SHAPE, scaled(TRUTH, 1 / 1.6))
    before = await tail_errors(sim, meter, levels)
    result = await refit(sim, meter, levels)
    assert 1.4 < result.scale < 1.8
    after = await tail_errors(sim, meter, levels)
    assert max(after) < 0.1 < min(before)


async def test_vllm_spans_are_refitted_to_the_tail_and_a_good_fit_is_kept():
    # On vLLM the span fit is then scaled to the percentiles the SLO judges; where the spans
    # already tell the truth, the refit leaves the model as it is (x1.00), never worse.
    levels, meter = two_levels()
    simulator = Simulator.for_target(ServedLikeVllm(), None)
    assert simulator is not None and await simulator.fit(meter, levels)
    assert re.search(r"step time x1\.00 and [\d.]+ ms per request to match 2 real levels",
                     simulator.source)  # fmt: skip
    refitted = await tail_errors(simulator.sim, simulator.meter, levels)
    simulator.sim.model = fit_served(levels, SHAPE).model
    spans_only = await tail_errors(simulator.sim, simulator.meter, levels)
    assert max(refitted) <= max(spans_only) + 1e-9 and max(refitted) < 0.05
