"""`tune profile`: measure a target's steps once and save its step-time model as a file.

The default config serves a few levels of the workload below its throughput (a burst of the
request list finds that first); the built-in engine adds a burst whose decode batch shrinks
from 96 requests to one and a level on a small budget, so decode and chunked steps of every
size are seen. The built-in engine's own step times are fitted; for vLLM, what its clients
saw (`read_back`). The file names the engine, device and model, and
`tune --profile FILE` or a `tune bench` sim suite reads it: a team profiles a GPU once and
screens or gates for it anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine_lite.costmodel import FitReport
from loadgen import LoadgenError, build_workload
from slo import parse_slo
from tuner.errors import TuneError
from tuner.measure.meter import LevelSettings, Meter
from tuner.search import fidelity
from tuner.search.space import SpaceFacts, build_space
from tuner.settings import (
    BURST_REQUESTS,
    BURST_REQUESTS_GPU,
    DEFAULT_LEVEL_S,
    MIN_REQUESTS_PER_LEVEL,
)
from tuner.sim.calibrate import RealLevel
from tuner.sim.profile import Profile
from tuner.store.identity import device_of, engine_of, model_of
from tuner.store.records import Mode, rules_for
from tuner.targets.base import Target
from tuner.targets.factory import TargetOptions, open_target

# Loads of the default config, as shares of its burst throughput: steps from a light queue to
# a full one, none past what it can serve (an overloaded level only repeats full steps).
LOADS = (0.3, 0.6, 0.9)
# Any SLO: profiling judges nothing, but a meter needs one.
_ANY_SLO = "tpot_p99=3600s"
ProgressFn = type(print)


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    target: TargetOptions
    workload: str = "mixed"
    num_requests: int = 400
    seed: int = 0
    level_s: float = DEFAULT_LEVEL_S


async def make_profile(request: ProfileRequest, progress: ProgressFn = print) -> Profile:
    """Measure the target and fit its step-time model."""
    target = open_target(request.target)
    try:
        return await _profile(target, request, progress)
    finally:
        await target.close()


async def _profile(target: Target, request: ProfileRequest, progress: ProgressFn) -> Profile:
    facts = target.facts
    try:
        workload = build_workload(request.workload, num_requests=request.num_requests,
                                  seed=request.seed, max_model_len=facts.max_model_len,
                                  vocab_size=facts.vocab_size)  # fmt: skip
    except LoadgenError as exc:
        raise TuneError(str(exc)) from None
    rules = rules_for(Mode.CAPACITY, facts.require_schedule)
    settings = LevelSettings(duration_s=request.level_s, min_requests=MIN_REQUESTS_PER_LEVEL)
    meter = Meter(target, workload.requests, parse_slo(_ANY_SLO), settings, rules)
    longest = max(r.prompt_len for r in workload.requests)
    space = build_space(target.knobs, SpaceFacts(facts.block_size, facts.max_model_len, longest))
    simulator = fidelity.Simulator.for_target(target, None)
    if simulator is None:
        raise TuneError(f"cannot profile {facts.description}: it reports no steps and its "
                        "scheduler is not vLLM's; profile the built-in engine or vLLM")  # fmt: skip
    default = space.default_config()
    await target.apply(default)
    size = BURST_REQUESTS_GPU if facts.device.startswith("cuda") else BURST_REQUESTS
    burst = Meter(target, workload.requests[:size], meter.slo, settings, rules)
    throughput = (await burst.level(math.inf)).level.request_throughput_rps
    progress(f"a burst of {size} requests on the default: {throughput:.2f} req/s")
    simulator.recording(True)
    levels = []
    for load in LOADS:
        run = await meter.level(load * throughput)
        levels.append(RealLevel(default, run.level.rate_rps, run.records))
        progress(f"default at {run.level.rate_rps:.2f} req/s: {len(run.records)} requests")
    # A profile is read for other workloads too: it must know decode batches this one lacks
    # (decode_sweep) and, for the built-in engine, small chunks.
    phase = simulator.calibration_phase
    if phase:
        await simulator.calibrate(meter, space, throughput)
        progress(phase)
    simulator.recording(False)
    if not await simulator.fit(meter, levels) or simulator.sim is None:
        raise TuneError("too few steps to fit a profile; raise --num-requests")
    progress(f"fitted: {simulator.source}")
    fit = FitReport(simulator.sim.model, simulator.fit_size, simulator.fit_error,
                    simulator.fit_p90_error)  # fmt: skip
    return Profile.of(engine_of(facts, None), device_of(facts), model_of(facts), fit,
                      simulator.sim.engine)  # fmt: skip


def default_path(engine: str, model: str) -> Path:
    """results/profile-ENGINE-MODEL.json for `tune profile --engine ENGINE --model MODEL`."""
    name = "vllm" if engine == "vllm" else "engine_lite"
    return Path("results") / f"profile-{name}-{Path(model).name.replace(' ', '-')}.json"
