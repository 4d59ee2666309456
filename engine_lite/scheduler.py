"""Pure chunked-prefill scheduling: which requests get how many tokens in the next step.

No torch and no clock: the engine passes requests in and reads a `SchedulerOutput` back.
Order and limits follow vLLM V0's chunked-prefill scheduler (`vllm/core/scheduler.py`,
`_schedule_chunked_prefill`, `PartialPrefillMetadata`) and Sarathi-Serve's stall-free batching
(Agrawal et al., OSDI'24); the per-request cap is vLLM V1's `long_prefill_token_threshold`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine_lite.block_manager import BlockManager
from engine_lite.config import EngineConfig, Policy
from engine_lite.errors import EngineLiteError
from engine_lite.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    """The only thing the runner sees: which requests run how many tokens, in batch order."""

    num_scheduled_tokens: dict[str, int]
    scheduled: list[tuple[Request, int]]
    preempted_req_ids: list[str]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_reqs: int = 0
    num_decode_reqs: int = 0

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


def effective_long_prefill_threshold(config: EngineConfig, max_model_len: int) -> int:
    """The threshold in force: the knob, or vLLM's default of 4% of max_model_len when
    several partial prefills are allowed and the knob is 0 (vLLM `SchedulerConfig`).
    Without chunked prefill there is none: a prompt runs whole or waits."""
    if not config.enable_chunked_prefill:
        return 0
    if config.long_prefill_token_threshold > 0:
        return config.long_prefill_token_threshold
    if config.max_num_partial_prefills > 1:
        return max(1, int(max_model_len * 0.04))
    return 0


class _Step:
    """Working state of one `schedule()` call."""

    __slots__ = ("budget_left", "long_ids", "partial_ids", "preempted", "scheduled", "slot_budget")

    def __init__(self, token_budget: int) -> None:
        self.budget_left = token_budget
        self.slot_budget = token_budget
        # request_id -> (request, tokens, is_prefill), insertion order = batch order
        self.scheduled: dict[str, tuple[Request, int, bool]] = {}
        self.preempted: list[str] = []
        # Requests that will still be mid-prefill after this step, and the long ones among them.
        self.partial_ids: set[str] = set()
        self.long_ids: set[str] = set()

    def add(self, req: Request, n: int, is_prefill: bool) -> None:
        self.scheduled[req.request_id] = (req, n, is_prefill)
        self.budget_left -= n

    def unschedule(self, req: Request) -> None:
        entry = self.scheduled.pop(req.request_id, None)
        if entry is not None:
            self.budget_left += entry[1]
        self.partial_ids.discard(req.request_id)
        self.long_ids.discard(req.request_id)


class Scheduler:
    """Token budget, sequence limit, partial-prefill limits and paged KV blocks, per step."""

    def __init__(
        self, config: EngineConfig, num_blocks: int, block_size: int, max_model_len: int
    ) -> None:
        config.check_max_model_len(max_model_len)
        self.config = config
        self.block_manager = BlockManager(num_blocks, block_size)
        self.max_model_len = max_model_len
        self.token_budget = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.long_prefill_threshold = effective_long_prefill_threshold(config, max_model_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is the newest
        self.num_preemptions_total = 0
        self._requests: dict[str, Request] = {}

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
        if not self.chunked and peak > self.token_budget:
            raise EngineLiteError(
                f"a {num_prompt_tokens}-token prompt with max_tokens={max_tokens} may need a "
                f"{peak}-token prefill, over max_num_batched_tokens={self.token_budget} with "
                "enable_chunked_prefill=False; raise max_num_batched_tokens or enable chunking"
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

    def abort_request(self, request_id: str) -> Request | None:
        """Drop a request wherever it is and free its blocks now; None if unknown/finished."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
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
        step = _Step(self.token_budget)
        decodes, prefills = self._split_running(step)
        if self.config.policy is Policy.DECODE_FIRST:
            self._schedule_running(step, decodes, is_prefill=False)
            self._schedule_running(step, prefills, is_prefill=True)
            self._schedule_waiting(step)
        else:
            self._schedule_running(step, prefills, is_prefill=True)
            self._schedule_waiting(step)
            self._schedule_running(step, decodes, is_prefill=False)
        out = self._build_output(step)
        self._check_invariants(out)
        return out

    def _split_running(self, step: _Step) -> tuple[list[Request], list[Request]]:
        """Running decodes and running mid-prefill requests, in admission order; the latter
        count as partial prefills (and long ones as long) until their prefill completes."""
        threshold = self.long_prefill_threshold
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in self.running:
            if req.is_prefill:
                prefills.append(req)
                step.partial_ids.add(req.request_id)
                if threshold and req.num_uncomputed_tokens > threshold:
                    step.long_ids.add(req.request_id)
            else:
                decodes.append(req)
        step.slot_budget = self._partial_prefill_slot_budget(step)
        return decodes, prefills

    def _partial_prefill_slot_budget(self, step: _Step) -> int:
        """vLLM V0 splits the budget evenly over the prefills that can run at once
        (`PartialPrefillMetadata.from_queues`, `partial_prefill_budget_lookup_list`)."""
        max_partial = self.config.max_num_partial_prefills
        if max_partial == 1:
            return self.token_budget
        prefills, longs = len(step.partial_ids), len(step.long_ids)
        for req in self.waiting:
            if prefills >= max_partial:
                break
            if req.num_uncomputed_tokens > self.long_prefill_threshold:
                if longs >= self.config.max_long_partial_prefills:
                    continue
                longs += 1
            prefills += 1
        # At least 1 token, or a budget smaller than the prefill count would stall them all.
        return max(1, self.token_budget // max(1, min(prefills, max_partial)))

    def _prefill_chunk(self, req: Request, step: _Step) -> int:
        remaining = req.num_uncomputed_tokens
        if not self.chunked:
            return remaining if remaining <= step.budget_left else 0
        n = min(remaining, step.budget_left, step.slot_budget)
        if self.long_prefill_threshold:
            n = min(n, self.long_prefill_threshold)
        return n

    def _schedule_running(self, step: _Step, reqs: list[Request], is_prefill: bool) -> None:
        running = RequestStatus.RUNNING
        for req in reqs:
            if step.budget_left <= 0:
                return
            if req.status is not running:
                continue  # preempted earlier in this step
            n = self._prefill_chunk(req, step) if is_prefill else 1
            if n == 0 or not self._allocate_or_preempt(req, n, step):
                continue
            step.add(req, n, is_prefill)
            if is_prefill and n == req.num_uncomputed_tokens:
                step.partial_ids.discard(req.request_id)  # its prefill completes this step

    def _schedule_waiting(self, step: _Step) -> None:
        # vLLM V1: a step that had to preempt admits nothing new (memory is already short).
        if step.preempted:
            return
        waiting, threshold = self.waiting, self.long_prefill_threshold
        skipped: list[Request] = []
        while waiting and step.budget_left > 0 and len(self.running) < self.max_num_seqs:
            req = waiting[0]
            n = self._prefill_chunk(req, step)
            if n == 0:
                break  # unchunked: the head prompt must fit whole; keep FCFS order
            remaining = req.num_uncomputed_tokens
            partial = n < remaining
            is_long = bool(threshold) and remaining > threshold
            if partial and not self._may_start_partial(step, is_long):
                # vLLM V0 `PartialPrefillMetadata.can_schedule`: shorter prompts go first.
                skipped.append(waiting.popleft())
                continue
            if not self.block_manager.allocate(req, n):
                break  # new work never preempts running work
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, n, True)
            if partial:
                step.partial_ids.add(req.request_id)
                if is_long:
                    step.long_ids.add(req.request_id)
        if skipped:
            waiting.extendleft(reversed(skipped))

    def _may_start_partial(self, step: _Step, is_long: bool) -> bool:
        if len(step.partial_ids) >= self.config.max_num_partial_prefills:
            return False
        return not is_long or len(step.long_ids) < self.config.max_long_partial_prefills

    def _allocate_or_preempt(self, req: Request, n: int, step: _Step) -> bool:
        """Get blocks for `req`'s next n positions, preempting the newest running requests
        (possibly `req` itself, then False) by recompute until they fit."""
        target = req.num_computed_tokens + n
        while not self.block_manager.allocate(req, target):
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is req:
                return False
        return True

    def _preempt(self, victim: Request, step: _Step) -> None:
        # Recompute preemption (vLLM PreemptionMode.RECOMPUTE): outputs are kept, KV is not,
        # so the next prefill covers prompt + outputs so far.
        self.running.pop()
        step.unschedule(victim)
        self.block_manager.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        step.preempted.append(victim.request_id)
        self.num_preemptions_total += 1

    def _build_output(self, step: _Step) -> SchedulerOutput:
        scheduled: list[tuple[Request, int]] = []
        num_tokens: dict[str, int] = {}
        prefill_tokens = decode_tokens = prefill_reqs = 0
        for rid, (req, n, is_prefill) in step.scheduled.items():
            scheduled.append((req, n))
            num_tokens[rid] = n
            if is_prefill:
                prefill_tokens += n
                prefill_reqs += 1
            else:
                decode_tokens += n
        return SchedulerOutput(
            num_scheduled_tokens=num_tokens,
            scheduled=scheduled,
            preempted_req_ids=step.preempted,
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=decode_tokens,
            num_prefill_reqs=prefill_reqs,
            num_decode_reqs=len(scheduled) - prefill_reqs,
        )

    def _check_invariants(self, out: SchedulerOutput) -> None:
        assert out.total_num_scheduled_tokens <= self.token_budget, "token budget exceeded"
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        block_size, running = self.block_manager.block_size, RequestStatus.RUNNING
        for req, n in out.scheduled:
            end = req.num_computed_tokens + n
            num_tokens = len(req.prompt_token_ids) + len(req.output_token_ids)
            assert n >= 1, f"{req.request_id} scheduled for {n} tokens"
            assert req.status is running, f"{req.request_id} is {req.status}"
            assert end <= num_tokens, f"{req.request_id} scheduled past its known tokens"
            assert len(req.block_table) * block_size >= end, f"{req.request_id} lacks blocks"
            assert self.chunked or end == num_tokens, f"{req.request_id} was chunked"
