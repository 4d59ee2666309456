"""Replays a case through engine_lite's real `LLMEngine` with a model-free runner."""

from __future__ import annotations

from engine_lite.config import EngineConfig
from engine_lite.defaults import CPU_DEVICE
from engine_lite.engine import LLMEngine
from engine_lite.fidelity.cases import SchedCase
from engine_lite.fidelity.trace import MAX_STEPS, SAMPLED_TOKEN, SchedTrace
from engine_lite.fidelity.vllm_driver import request_number
from engine_lite.request import Request
from engine_lite.sampling_params import SamplingParams


class TokenRunner:
    """The runner interface without a model: one fixed token for each entry that reaches
    its last known token, and a record of each batch it was handed."""

    device_info = CPU_DEVICE
    eos_token_id: int | None = None
    last_forward_duration_s = 0.0

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = SAMPLED_TOKEN + 1
        self.last_batch: list[tuple[str, int]] = []

    def execute(self, batch: list[tuple[Request, int]]) -> list[int | None]:
        self.last_batch = [(req.request_id, n) for req, n in batch]
        return [
            SAMPLED_TOKEN if req.num_computed_tokens + n == req.num_tokens else None
            for req, n in batch
        ]

    def release(self, request_id: str) -> None:
        pass


def replay_case(case: SchedCase) -> SchedTrace:
    """Feed the case's arrivals step by step and record what each step scheduled."""
    runner = TokenRunner(case.num_blocks, case.block_size, case.max_model_len)
    engine = LLMEngine(EngineConfig(**case.scheduler_knobs()), runner=runner, clock=lambda: 0.0)
    pending = sorted(case.requests, key=lambda r: r.arrival_step)
    trace, step = SchedTrace(), 0
    while pending or engine.has_unfinished():
        while pending and pending[0].arrival_step <= step:
            req = pending.pop(0)
            params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
            engine.add_request([1] * req.prompt_len, params, request_id=req.request_id)
        runner.last_batch = []
        result = engine.step()
        trace.steps.append(runner.last_batch)
        trace.preempted.append(sorted(result.preempted_req_ids, key=request_number))
        for rid, event in result.events:
            if event.num_output_tokens == 1 and rid not in trace.first_token_step:
                trace.first_token_step[rid] = step
        for stats in result.finished:
            trace.finish_step[stats.request_id] = step
        step += 1
        if step > MAX_STEPS:
            raise RuntimeError(f"case {case.name} did not drain in {MAX_STEPS} steps")
    return trace
