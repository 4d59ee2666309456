"""`LLMEngine`: the synchronous step loop (schedule, run the batch, update, finish)."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine_lite.config import SCHEDULER_KNOBS, EngineConfig
from engine_lite.defaults import BatchDefaults, DeviceInfo, UsageContext
from engine_lite.errors import EngineLiteError
from engine_lite.outputs import EngineStats, RequestStats, StepStats, TokenEvent
from engine_lite.request import Request, RequestStatus
from engine_lite.sampling_params import SamplingParams
from engine_lite.scheduler import Scheduler, SchedulerOutput


class Runner(Protocol):
    """What the engine needs from `engine_lite.runner.ModelRunner` (docs/ARCHITECTURE.md)."""

    num_kv_blocks: int
    block_size: int
    device_info: DeviceInfo
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None
    last_forward_duration_s: float

    def execute(self, batch: list[tuple[Request, int]]) -> list[int | None]: ...

    def release(self, request_id: str) -> None: ...


@dataclass(slots=True)
class StepResult:
    """Everything one step produced: new tokens per request, finished requests, stats."""

    events: list[tuple[str, TokenEvent]]
    finished: list[RequestStats]
    stats: StepStats
    preempted_req_ids: list[str]


class LLMEngine:
    """Owns the scheduler and the runner; `step()` advances every scheduled request once."""

    def __init__(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.monotonic,
        usage: UsageContext = UsageContext.SERVER,
    ) -> None:
        if runner is None:
            # Resolved at run time: importing engine_lite, or type-checking its pure parts,
            # never loads torch; only building a real model does.
            runner = importlib.import_module("engine_lite.runner").ModelRunner(config, usage)
        self.runner: Runner = runner
        self.clock = clock
        self.usage = usage
        self.max_model_len = runner.max_model_len
        self.vocab_size = runner.vocab_size
        self.eos_token_id = runner.eos_token_id
        # What the caller asked for (None = vLLM's default), and what that resolved to here.
        self.requested_config = config
        self.config, self.batch_defaults = self._resolve(config)
        self.scheduler = self._make_scheduler(self.config)
        self.num_steps_total = 0
        self._preemptions_earlier = 0  # from schedulers replaced by reconfigure()
        self._pending_release: list[str] = []
        # Ids in the step whose forward is running now, and aborted requests among them whose
        # KV blocks wait for that step to end: the runner reads their block tables unlocked.
        self._in_step: set[str] = set()
        self._deferred_free: list[Request] = []
        self._ids = itertools.count()

    def _resolve(self, config: EngineConfig) -> tuple[EngineConfig, BatchDefaults]:
        return config.resolved(self.runner.device_info, self.max_model_len, self.usage)

    def _make_scheduler(self, config: EngineConfig) -> Scheduler:
        return Scheduler(
            config, self.runner.num_kv_blocks, self.runner.block_size, self.max_model_len
        )

    # ---- requests -----------------------------------------------------------------------

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise EngineLiteError for a prompt this engine could never serve."""
        if not isinstance(params, SamplingParams):
            raise EngineLiteError(
                f"sampling params of type {type(params).__name__} are invalid; "
                "pass engine_lite.SamplingParams"
            )
        if isinstance(prompt_token_ids, (str, bytes)) or not prompt_token_ids:
            raise EngineLiteError(
                f"prompt {prompt_token_ids!r:.40} is invalid; pass a non-empty list of token ids"
            )
        for tok in prompt_token_ids:
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < self.vocab_size:
                raise EngineLiteError(
                    f"prompt token id {tok!r} is outside the vocabulary; use ids in "
                    f"0..{self.vocab_size - 1}"
                )
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise EngineLiteError(
                f"a {len(prompt_token_ids)}-token prompt plus max_tokens={params.max_tokens} "
                f"is {total} tokens, over max_model_len={self.max_model_len}; shorten the "
                "prompt or lower max_tokens"
            )
        self.scheduler.check_fits(len(prompt_token_ids), params.max_tokens)

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time_s: float | None = None,
    ) -> Request:
        params = SamplingParams() if params is None else params
        self.validate(prompt_token_ids, params)
        req = Request(
            request_id=str(next(self._ids)) if request_id is None else request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            arrival_time_s=self.clock() if arrival_time_s is None else arrival_time_s,
        )
        self.scheduler.add_request(req)
        return req

    def abort_request(self, request_id: str) -> RequestStats | None:
        """End the request now; returns its stats, None if not in flight.

        Its KV blocks are freed at once, or when the current step ends if that step's forward
        (running outside the engine lock) includes it: an abort never changes a batch that
        is being computed.
        """
        in_step = request_id in self._in_step
        req = self.scheduler.abort_request(request_id, free_blocks=not in_step)
        if req is None:
            return None
        if in_step:
            self._deferred_free.append(req)
        # The runner may be mid-forward on another thread: drop its state before the next step.
        self._pending_release.append(request_id)
        return _request_stats(req, self.clock())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ---------------------------------------------------------------------

    def step(self) -> StepResult:
        start_s = self.clock()
        out = self.begin_step()
        sampled = self.runner.execute(out.scheduled) if out.scheduled else []
        return self.finish_step(out, sampled, start_s)

    def begin_step(self) -> SchedulerOutput:
        """Release aborted requests' runner state, then schedule (call under the engine lock)."""
        self.release_pending()
        out = self.scheduler.schedule()
        self._in_step = {req.request_id for req, _ in out.scheduled}
        return out

    def release_pending(self) -> None:
        while self._pending_release:
            self.runner.release(self._pending_release.pop())

    def finish_step(
        self, out: SchedulerOutput, sampled: list[int | None], start_s: float
    ) -> StepResult:
        """Advance computed tokens, append samples, apply stop conditions, free finished."""
        tokens_s = self.clock()  # the forward is done: this step's tokens exist from now on
        events: list[tuple[str, TokenEvent]] = []
        done: list[tuple[Request, RequestStatus]] = []
        running = RequestStatus.RUNNING
        for (req, n), tok in zip(out.scheduled, sampled, strict=True):
            if req.status is not running:
                continue  # aborted while the forward ran
            if req.first_scheduled_time_s is None:
                req.first_scheduled_time_s = start_s
            req.num_computed_tokens += n
            if tok is None:
                continue
            req.output_token_ids.append(tok)
            req.token_times_s.append(tokens_s)
            status = self._check_stop(req, tok)
            if status is not None:
                done.append((req, status))
            event = TokenEvent(
                [tok],
                tokens_s,
                status is not None,
                None if status is None else status.finish_reason,
                len(req.prompt_token_ids),
                len(req.output_token_ids),
            )
            events.append((req.request_id, event))
        self.scheduler.finish_requests(done)
        self._end_step()
        finished = []
        for req, _ in done:
            self.runner.release(req.request_id)
            finished.append(_request_stats(req, tokens_s))
        self.num_steps_total += 1
        stats = self._step_stats(out, start_s, tokens_s)
        return StepResult(events, finished, stats, out.preempted_req_ids)

    def _end_step(self) -> None:
        """The forward is over: blocks of requests aborted during it can go back now."""
        self._in_step = set()
        for req in self._deferred_free:
            self.scheduler.block_manager.free(req)
        self._deferred_free = []

    def _check_stop(self, req: Request, tok: int) -> RequestStatus | None:
        # vLLM 0.32 `check_stop` (v1/core/sched/utils.py): EOS, then stop ids, then the length
        # caps. vLLM masks EOS and stop ids in the logits until min_tokens outputs exist; here
        # they simply do not count until then.
        params = req.sampling_params
        num_out = len(req.output_token_ids)
        if num_out >= params.min_tokens:
            if tok == self.eos_token_id and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if tok in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if num_out >= params.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _step_stats(self, out: SchedulerOutput, start_s: float, tokens_s: float) -> StepStats:
        duration_s = self.clock() - start_s
        prefill, decode = out.num_prefill_tokens, out.num_decode_tokens
        stall_s = duration_s * prefill / (prefill + decode) if prefill and decode else 0.0
        sched = self.scheduler
        return StepStats(
            time_s=tokens_s,
            step_duration_s=duration_s,
            forward_duration_s=self.runner.last_forward_duration_s if out.scheduled else 0.0,
            num_prefill_tokens=prefill,
            num_decode_tokens=decode,
            num_prefill_reqs=out.num_prefill_reqs,
            num_decode_reqs=out.num_decode_reqs,
            decode_stall_s=stall_s,
            num_preemptions=len(out.preempted_req_ids),
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            kv_cache_usage=sched.kv_cache_usage,
            features=out.features,
        )

    # ---- configuration and stats --------------------------------------------------------

    def reconfigure(self, config: EngineConfig) -> None:
        """Swap in new scheduler knobs; weights and KV tensors stay. Only when idle.

        `config` is what the caller asks for: limits left as None take the device default.
        """
        for f in dataclasses.fields(config):
            if f.name not in SCHEDULER_KNOBS and getattr(config, f.name) != getattr(
                self.requested_config, f.name
            ):
                raise EngineLiteError(
                    f"reconfigure cannot change {f.name}; it changes only the scheduler knobs "
                    f"({', '.join(SCHEDULER_KNOBS)}); build a new engine for {f.name}"
                )
        if self.scheduler.has_unfinished():
            raise EngineLiteError(
                "reconfigure needs an idle engine; wait for in-flight requests or abort them"
            )
        resolved, defaults = self._resolve(config)
        scheduler = self._make_scheduler(resolved)  # validates against max_model_len first
        self._preemptions_earlier += self.scheduler.num_preemptions_total
        self.scheduler, self.config, self.batch_defaults = scheduler, resolved, defaults
        self.requested_config = config

    def stats(self) -> EngineStats:
        sched = self.scheduler
        return EngineStats(
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            kv_cache_usage=sched.kv_cache_usage,
            num_preemptions_total=self._preemptions_earlier + sched.num_preemptions_total,
            num_steps_total=self.num_steps_total,
        )


def _request_stats(req: Request, finish_time_s: float) -> RequestStats:
    times = req.token_times_s
    return RequestStats(
        request_id=req.request_id,
        arrival_time_s=req.arrival_time_s,
        first_scheduled_time_s=req.first_scheduled_time_s,
        first_token_time_s=times[0] if times else None,
        finish_time_s=finish_time_s,
        num_prompt_tokens=len(req.prompt_token_ids),
        num_output_tokens=len(req.output_token_ids),
        finish_reason=req.status.finish_reason or "abort",
        token_times_s=times,
        num_preemptions=req.num_preemptions,
    )
