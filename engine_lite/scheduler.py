"""Pure chunked-prefill scheduling: which requests get how many tokens in the next step.

No torch and no clock: the engine passes requests in and reads a `SchedulerOutput` back.
The rules are vLLM 0.32's V1 scheduler (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`;
line numbers below are that file's in the 0.32.0 release) for everything engine_lite models;
prefix caching, speculative decoding, async scheduling, encoders and KV connectors it does
not model. `tests/engine_lite/test_vllm_fidelity.py` checks it step by step against vLLM's own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_lite.block_manager import BlockManager
from engine_lite.config import EngineConfig, Policy
from engine_lite.costmodel import StepFeatures, features_of
from engine_lite.errors import EngineLiteError
from engine_lite.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    """The only thing the runner sees: which requests run how many tokens, in batch order."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefill_reqs: int = 0
    num_decode_reqs: int = 0
    features: StepFeatures = field(default_factory=StepFeatures)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    def count_kinds(self) -> None:
        """Prefill and decode totals of the final batch, and its cost-model features."""
        entries = []
        for req, n in self.scheduled:
            prefill = req.is_prefill
            if prefill:
                self.num_prefill_tokens += n
                self.num_prefill_reqs += 1
            else:
                self.num_decode_tokens += n
                self.num_decode_reqs += 1
            computed = req.num_computed_tokens
            entries.append((computed, n, prefill, computed + n == req.num_tokens))
        self.features = features_of(entries)


def step_threshold(
    config: EngineConfig, token_budget: int, num_running: int, num_waiting: int
) -> int:
    """The per-request chunk cap in force this step (0 = none).

    vLLM drops `long_prefill_token_threshold` when running + waiting <= 1: a lone request has
    nobody to starve (scheduler.py 638-646). The adaptive switch floors it at the budget's
    fair share, budget // (running + waiting) (647-651).
    """
    eligible = num_running + num_waiting
    threshold = config.long_prefill_token_threshold if eligible > 1 else 0
    if threshold > 0 and config.long_prefill_token_threshold_adaptive:
        threshold = max(threshold, token_budget // eligible)
    return threshold


class _Step:
    """Working state of one `schedule()` call: the output so far and the budget left."""

    __slots__ = ("budget", "out", "threshold")

    def __init__(self, budget: int, threshold: int) -> None:
        self.out = SchedulerOutput()
        self.budget = budget
        self.threshold = threshold

    def chunk(self, req: Request) -> int:
        """min(tokens left, threshold when in force, budget left): vLLM's rule in both passes
        (scheduler.py 705-712 and 1155-1169)."""
        n = req.num_uncomputed_tokens  # a resumed request recomputes its outputs too
        if 0 < self.threshold < n:
            n = self.threshold
        return n

    def add(self, req: Request, n: int) -> None:
        self.out.scheduled.append((req, n))
        self.budget -= n

    def unschedule(self, req: Request) -> None:
        """Only prefill-first can preempt a request it already scheduled in this step
        (a new prompt admitted before the decodes); FCFS never does."""
        for i, (r, n) in enumerate(self.out.scheduled):
            if r is req:
                del self.out.scheduled[i]
                self.budget += n
                return


class Scheduler:
    """Token budget, sequence limit and paged KV blocks, per step, as vLLM 0.32 V1."""

    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        check_invariants: bool = True,
    ) -> None:
        if config.max_num_batched_tokens is None or config.max_num_seqs is None:
            raise EngineLiteError(
                "the scheduler needs resolved limits; build it from EngineConfig.resolved()"
            )
        config.check_max_model_len(max_model_len)
        self.config = config
        self.block_manager = BlockManager(num_blocks, block_size)
        self.max_model_len = max_model_len
        self.token_budget: int = config.max_num_batched_tokens
        self.max_num_seqs: int = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is the newest
        self.num_preemptions_total = 0
        self._requests: dict[str, Request] = {}
        # Every step is checked against the budget, the sequence limit and its blocks; the
        # simulator, which replays millions of steps of this same code, may skip the check.
        self.check_invariants = check_invariants

    # ---- queue management -------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a request that could never run to the end, instead of looping on it."""
        # The last sampled token never needs KV, so the peak is prompt + max_tokens - 1.
        peak = num_prompt_tokens + max_tokens - 1
        bm = self.block_manager
        if bm.blocks_for(peak) > bm.num_blocks:
            raise EngineLiteError(
                f"a {num_prompt_tokens}-token prompt with max_tokens={max_tokens} needs KV for "
                f"{peak} tokens but the whole cache holds {bm.capacity_tokens} "
                f"({bm.num_blocks} blocks of {bm.block_size}); shorten the prompt, lower "
                "max_tokens, or raise num_gpu_blocks_override / kv_cache_memory_gb"
            )

    def add_request(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise EngineLiteError(
                f"request_id={request.request_id!r} is already in flight; use a unique id"
            )
        self.check_fits(request.num_prompt_tokens, request.sampling_params.max_tokens)
        request.status = RequestStatus.WAITING
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str, free_blocks: bool = True) -> Request | None:
        """Drop a request wherever it is; None if unknown or finished.

        With `free_blocks=False` its KV blocks stay allocated: a forward that is running now
        still reads its block table, so the engine frees them when that step ends.
        """
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        if free_blocks:
            self.block_manager.free(req)
        req.status = RequestStatus.FINISHED_ABORTED
        return req

    def finish_requests(self, finished: list[tuple[Request, RequestStatus]]) -> None:
        """Mark running requests finished and free their blocks (one pass over `running`)."""
        if not finished:
            return
        for req, status in finished:
            req.status = status
            self.block_manager.free(req)
            del self._requests[req.request_id]
        self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.block_manager.usage

    # ---- one step ---------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        threshold = step_threshold(
            self.config, self.token_budget, len(self.running), len(self.waiting)
        )
        step = _Step(self.token_budget, threshold)
        if self.config.policy is Policy.DECODE_FIRST:
            self._schedule_running(step, self.running)
            self._schedule_waiting(step)
        else:  # engine_lite extension: prefill chunks before decodes
            prefills = [r for r in self.running if r.is_prefill]
            decodes = [r for r in self.running if not r.is_prefill]
            self._schedule_running(step, prefills)
            self._schedule_waiting(step)
            self._schedule_running(step, decodes)
        step.out.count_kinds()
        if self.check_invariants:
            self._check_invariants(step.out)
        return step.out

    def _schedule_running(self, step: _Step, reqs: list[Request]) -> None:
        """vLLM's running pass (scheduler.py 653-848): each request in admission order gets
        its chunk; when its blocks do not fit, the newest running request is preempted until
        they do, and if that was the request itself, the pass ends."""
        index = 0
        while index < len(reqs) and step.budget > 0:
            req = reqs[index]
            index += 1
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step (prefill-first's second pass)
            n = min(step.chunk(req), step.budget)
            if not self._allocate_or_preempt(req, n, step):
                break
            step.add(req, n)

    def _allocate_or_preempt(self, req: Request, n: int, step: _Step) -> bool:
        """Blocks for `req`'s next n positions, preempting `running[-1]` by recompute until
        they fit; False once `req` itself was preempted (scheduler.py 776-843)."""
        target = req.num_computed_tokens + n
        while not self.block_manager.allocate(req, target):
            victim = self.running.pop()
            step.unschedule(victim)
            self._preempt(victim, step.out)
            if victim is req:
                return False
        return True

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        # `_preempt_request` (scheduler.py 1571-1614): blocks freed, computed tokens reset,
        # outputs kept, back to the front of the waiting queue; the next prefill covers
        # prompt + outputs so far.
        self.block_manager.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted_req_ids.append(victim.request_id)
        self.num_preemptions_total += 1

    def _schedule_waiting(self, step: _Step) -> None:
        """vLLM's waiting pass (scheduler.py 900-1380), skipped in a step that preempted:
        FCFS admission while budget and `max_num_seqs` allow, each prompt only if the whole
        of it fits in free KV blocks (`scheduler_reserve_full_isl`, kv_cache_manager.py
        520-539); the first one that does not fit stops the pass."""
        if step.out.preempted_req_ids:
            return
        waiting, bm = self.waiting, self.block_manager
        while step.budget > 0 and waiting and len(self.running) < self.max_num_seqs:
            req = waiting[0]
            n = step.chunk(req)
            if not self.chunked and n > step.budget:
                break  # a prompt runs whole or waits; FCFS order holds
            n = min(n, step.budget)
            full = min(req.num_tokens, self.max_model_len)
            if bm.blocks_for(full) - len(req.block_table) > bm.num_free_blocks:
                break
            if not bm.allocate(req, req.num_computed_tokens + n):
                break
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, n)

    def _check_invariants(self, out: SchedulerOutput) -> None:
        assert out.total_num_scheduled_tokens <= self.token_budget, "token budget exceeded"
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        block_size, running = self.block_manager.block_size, RequestStatus.RUNNING
        for req, n in out.scheduled:
            end = req.num_computed_tokens + n
            ok = n >= 1 and req.status is running and end <= req.num_tokens
            # One test on the hot path; the messages only when it fails.
            if not (ok and len(req.block_table) * block_size >= end):
                assert n >= 1, f"{req.request_id} scheduled for {n} tokens"
                assert req.status is running, f"{req.request_id} is {req.status}"
                assert end <= req.num_tokens, f"{req.request_id} scheduled past its known tokens"
                raise AssertionError(f"{req.request_id} lacks blocks")
