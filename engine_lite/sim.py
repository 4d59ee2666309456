"""A discrete-event simulator of serving: the real scheduler, a step-time model, virtual time.

The engine is engine_lite's own `LLMEngine` (so its `Scheduler`, which is vLLM 0.32's, and its
stop rules), driven by a runner that computes nothing; each step lasts what the `CostModel`
predicts for what the scheduler put in it, and the virtual clock moves by that much. Requests
reach the engine `request_overhead_s` after they are sent and their tokens reach the client
`token_delivery_s` after the step that made them, as over a real server.

Nothing here sleeps: a minute of serving replays in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_lite.config import EngineConfig
from engine_lite.costmodel import CostModel
from engine_lite.defaults import CPU_DEVICE, DeviceInfo
from engine_lite.engine import LLMEngine
from engine_lite.errors import EngineLiteError
from engine_lite.request import Request
from engine_lite.sampling_params import SamplingParams

_TOKEN = 7  # every simulated token; requests ignore EOS and stop at their output length


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival_s: float  # when the client sends it
    prompt_len: int
    output_len: int


@dataclass(slots=True)
class SimTimeline:
    """What the client of one request would see, in virtual seconds."""

    arrival_s: float
    token_times_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def finish_s(self) -> float:
        return self.token_times_s[-1] if self.token_times_s else self.arrival_s


@dataclass(frozen=True, slots=True)
class SimEngine:
    """The simulated engine's fixed shape: its cache, context and device."""

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    device: DeviceInfo = CPU_DEVICE


class _Runner:
    """The runner interface, computing nothing: a token for each entry that reaches its end."""

    eos_token_id: int | None = None
    last_forward_duration_s = 0.0

    def __init__(self, shape: SimEngine) -> None:
        self.num_kv_blocks = shape.num_kv_blocks
        self.block_size = shape.block_size
        self.max_model_len = shape.max_model_len
        self.device_info = shape.device
        self.vocab_size = _TOKEN + 1

    def execute(self, batch: list[tuple[Request, int]]) -> list[int | None]:
        return [_TOKEN if r.num_computed_tokens + n == r.num_tokens else None for r, n in batch]

    def release(self, request_id: str) -> None:
        pass


def simulate(
    config: EngineConfig,
    shape: SimEngine,
    model: CostModel,
    requests: Sequence[SimRequest],
) -> list[SimTimeline]:
    """Replay `requests` (sorted by arrival) through the engine in virtual time."""
    clock = [0.0]
    engine = LLMEngine(config, runner=_Runner(shape), clock=lambda: clock[0])
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    timelines = [SimTimeline(r.arrival_s) for r in requests]
    ready_s = [r.arrival_s + model.request_overhead_s for r in requests]
    nxt = 0
    while nxt < len(order) or engine.has_unfinished():
        if not engine.has_unfinished():
            clock[0] = max(clock[0], ready_s[order[nxt]])  # idle until the next request
        while nxt < len(order) and ready_s[order[nxt]] <= clock[0]:
            _add(engine, order[nxt], requests[order[nxt]])
            nxt += 1
        start = clock[0]
        out = engine.begin_step()
        if not out.scheduled:
            raise EngineLiteError("the simulated scheduler made no progress")  # a bug, not input
        clock[0] = start + model.step_s(out.features)
        result = engine.finish_step(out, engine.runner.execute(out.scheduled), start)
        seen_s = clock[0] + model.token_delivery_s
        for rid, event in result.events:
            timelines[int(rid)].token_times_s.extend([seen_s] * len(event.token_ids))
        for stats in result.finished:
            timelines[int(stats.request_id)].num_preemptions = stats.num_preemptions
    return timelines


def _add(engine: LLMEngine, index: int, req: SimRequest) -> None:
    n = req.output_len
    params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)
    engine.add_request([_TOKEN] * req.prompt_len, params, request_id=str(index))
