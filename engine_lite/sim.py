"""A discrete-event simulator of serving: the real scheduler, a step-time model, virtual time.

The scheduler is engine_lite's own `Scheduler` (vLLM 0.32's, checked step by step against it);
each step lasts what the `CostModel` predicts for what the scheduler put in it, and the virtual
clock moves by that much. Requests
reach the engine `request_overhead_s` after they are sent and their tokens reach the client
`token_delivery_s` after the step that made them, as over a real server.

Nothing here sleeps: a minute of serving replays in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine_lite.config import EngineConfig
from engine_lite.costmodel import CostModel, StepFeatures
from engine_lite.defaults import CPU_DEVICE, DeviceInfo
from engine_lite.errors import EngineLiteError
from engine_lite.request import Request, RequestStatus
from engine_lite.sampling_params import SamplingParams
from engine_lite.scheduler import Scheduler

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
    token_steps: list[int] = field(default_factory=list)  # the step that made each token
    admitted_step: int = -1  # the first step that saw the request (it waits from arrival)
    admitted_s: float = 0.0  # when that step started

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


def simulate(
    config: EngineConfig,
    shape: SimEngine,
    model: CostModel,
    requests: Sequence[SimRequest],
    step_log: list[StepFeatures] | None = None,
    on_finish: Callable[[int, SimTimeline], bool] | None = None,
) -> list[SimTimeline]:
    """Replay `requests` through the real scheduler in virtual time; `step_log` (when given)
    receives each step's features, in order, for fitting a model to what clients saw.
    `on_finish(i, timeline)` is told of each request that finished, in virtual-time order; True ends
    the replay there, the timelines of the requests still running or not yet arrived left as
    far as they got (a level whose verdict is already settled needs no more steps).

    The step loop is `LLMEngine`'s for the case it needs: every request ignores EOS and runs
    to its output length (or max_model_len), so a step only advances computed tokens, samples
    one token for each request whose known tokens are all computed, and ends requests that
    reached their length; no runner, events or stats objects.
    """
    config, _ = config.resolved(shape.device, shape.max_model_len)
    # The invariants are checked wherever the engine runs this scheduler (and in its tests);
    # unchecked here, a screening of the space runs about a tenth faster.
    sched = Scheduler(config, shape.num_kv_blocks, shape.block_size, shape.max_model_len,
                      check_invariants=False)  # fmt: skip
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    timelines = [SimTimeline(r.arrival_s) for r in requests]
    timeline_of = {str(i): tl for i, tl in enumerate(timelines)}  # by request_id
    ready_s = [r.arrival_s + model.request_overhead_s for r in requests]
    clock, nxt, step, max_len = 0.0, 0, -1, shape.max_model_len
    while nxt < len(order) or sched.has_unfinished():
        if not sched.has_unfinished():
            clock = max(clock, ready_s[order[nxt]])  # idle until the next request
        step += 1
        while nxt < len(order) and ready_s[order[nxt]] <= clock:
            sched.add_request(_request(order[nxt], requests[order[nxt]], clock))
            timelines[order[nxt]].admitted_step, timelines[order[nxt]].admitted_s = step, clock
            nxt += 1
        out = sched.schedule()
        if not out.scheduled:
            raise EngineLiteError("the simulated scheduler made no progress")  # a bug, not input
        if step_log is not None:
            step_log.append(out.features)
        clock += model.step_s(out.features)
        seen_s, done = clock + model.token_delivery_s, []
        for req, n in out.scheduled:
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk that is not the last
            outputs = req.output_token_ids
            outputs.append(_TOKEN)
            tl = timeline_of[req.request_id]
            tl.token_times_s.append(seen_s)
            tl.token_steps.append(step)
            if len(outputs) >= req.sampling_params.max_tokens or req.num_tokens >= max_len:
                done.append((req, RequestStatus.FINISHED_LENGTH))
                tl.num_preemptions = req.num_preemptions
        sched.finish_requests(done)
        if on_finish is not None and done:
            ended = [int(req.request_id) for req, _ in done]
            if any([on_finish(i, timelines[i]) for i in ended]):
                break  # a list: every finished request is told, as a real client would be
    return timelines


def _request(index: int, req: SimRequest, now_s: float) -> Request:
    n = req.output_len
    params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)
    return Request(str(index), [_TOKEN] * req.prompt_len, params, now_s)
