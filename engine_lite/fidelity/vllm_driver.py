"""Runs scheduling cases through vLLM's own V1 `Scheduler`, with no model (a script).

Run by the interpreter that has vLLM installed (it may be another virtual environment), so it
imports nothing of engine_lite: cases come in as JSON on stdin, one trace per case goes out as
JSON on stdout. The scheduler is built the way vLLM's tests/v1/core/utils.py builds it: a
config-only model folder, one full-attention KV group, and a fake model output that samples
one token per request whose prefill is complete.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SAMPLED_TOKEN = 7  # same as engine_lite.fidelity.trace
MAX_STEPS = 20_000

# A config.json is all vLLM's ModelConfig reads when the tokenizer is skipped.
_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
}


def build_scheduler(case: dict[str, Any], model_dir: str) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched = SchedulerConfig(
        max_num_batched_tokens=case["max_num_batched_tokens"],
        max_num_seqs=case["max_num_seqs"],
        enable_chunked_prefill=case["enable_chunked_prefill"],
        long_prefill_token_threshold=case["long_prefill_token_threshold"],
        long_prefill_token_threshold_adaptive=case["long_prefill_token_threshold_adaptive"],
        max_model_len=case["max_model_len"],
        is_encoder_decoder=False,
        async_scheduling=False,
    )
    model = ModelConfig(
        model=model_dir, dtype="float32", seed=0, skip_tokenizer_init=True,
        max_model_len=case["max_model_len"],
    )  # fmt: skip
    block_size = case["block_size"]
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    num_blocks = case["num_blocks"] + 1  # vLLM's block pool keeps block 0 as its null block
    cache.num_gpu_blocks = num_blocks
    config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)  # fmt: skip
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])  # fmt: skip
    return Scheduler(vllm_config=config, kv_cache_config=kv, block_size=block_size,
                     structured_output_manager=StructuredOutputManager(config))  # fmt: skip


def run_case(case: dict[str, Any], model_dir: str) -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    scheduler = build_scheduler(case, model_dir)
    pending = sorted(case["requests"], key=lambda r: r["arrival_step"])
    trace: dict[str, Any] = {"steps": [], "preempted": [], "first_token_step": {},
                             "finish_step": {}}  # fmt: skip
    step = 0
    while pending or scheduler.get_num_unfinished_requests():
        while pending and pending[0]["arrival_step"] <= step:
            r = pending.pop(0)
            params = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True)
            scheduler.add_request(Request(r["request_id"], [1] * r["prompt_len"], params,
                                          None, arrival_time=float(step)))  # fmt: skip
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        trace["steps"].append([[rid, out.num_scheduled_tokens[rid]] for rid in ids])
        trace["preempted"].append(sorted(out.preempted_req_ids or (), key=request_number))
        sampled = []
        for rid in ids:
            req = scheduler.requests[rid]  # computed tokens already advanced by schedule()
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([SAMPLED_TOKEN] if done else [])
            if done and req.num_output_tokens == 0:
                trace["first_token_step"].setdefault(rid, step)
        index = {rid: i for i, rid in enumerate(ids)}
        outputs = scheduler.update_from_output(
            out, ModelRunnerOutput(req_ids=ids, req_id_to_index=index, sampled_token_ids=sampled)
        )
        for engine_outputs in outputs.values():
            for o in engine_outputs.outputs:
                if o.finish_reason is not None:
                    trace["finish_step"][o.request_id] = step
        step += 1
        if step > MAX_STEPS:
            raise RuntimeError(f"case {case['name']} did not drain in {MAX_STEPS} steps")
    return trace


def request_number(request_id: str) -> int:
    """Case ids are r0, r1, ...: vLLM reports a step's preemptions as a set, so both sides
    list them sorted by this number."""
    return int(request_id.lstrip("r"))


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    cases = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(_MODEL_CONFIG))
        traces = [run_case(case, model_dir) for case in cases]
    json.dump(traces, sys.stdout)


if __name__ == "__main__":
    main()
