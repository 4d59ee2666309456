"""Ready-to-paste serving flags for a recommended config: vLLM and SGLang spellings."""

from __future__ import annotations

from typing import Any

from engine_lite import Policy


def vllm_flags(knobs: dict[str, Any]) -> str:
    """`vllm serve` flags (vllm/engine/arg_utils.py names for SchedulerConfig fields)."""
    parts = [
        f"--max-num-batched-tokens {knobs['max_num_batched_tokens']}",
        f"--max-num-seqs {knobs['max_num_seqs']}",
    ]
    if not knobs["enable_chunked_prefill"]:
        parts.append("--no-enable-chunked-prefill")
        return " ".join(parts)
    parts.append("--enable-chunked-prefill")
    if knobs["long_prefill_token_threshold"]:
        parts.append(f"--long-prefill-token-threshold {knobs['long_prefill_token_threshold']}")
    if knobs["max_num_partial_prefills"] > 1:
        parts.append(f"--max-num-partial-prefills {knobs['max_num_partial_prefills']}")
        parts.append(f"--max-long-partial-prefills {knobs['max_long_partial_prefills']}")
    return " ".join(parts)


def sglang_flags(knobs: dict[str, Any]) -> str:
    """`python -m sglang.launch_server` flags (sglang/srt/server_args.py).

    SGLang caps each prefill chunk with --chunked-prefill-size and the prefill batch with
    --max-prefill-tokens; --enable-mixed-chunk lets running decodes ride in the same batch as a
    prefill chunk, which is what decode_first (Sarathi's stall-free batching) means.
    """
    budget = knobs["max_num_batched_tokens"]
    if not knobs["enable_chunked_prefill"]:
        chunk = -1
    else:
        chunk = knobs["long_prefill_token_threshold"] or budget
    parts = [
        f"--chunked-prefill-size {chunk}",
        f"--max-prefill-tokens {budget}",
        f"--max-running-requests {knobs['max_num_seqs']}",
    ]
    if knobs["enable_chunked_prefill"] and Policy(knobs["policy"]) is Policy.DECODE_FIRST:
        parts.append("--enable-mixed-chunk")
    return " ".join(parts)


def flag_notes(knobs: dict[str, Any]) -> list[str]:
    """What the flags cannot say, so nobody pastes them believing they carry everything."""
    notes = []
    if Policy(knobs["policy"]) is Policy.PREFILL_FIRST:
        notes.append(
            "policy=prefill_first has no vLLM flag: vLLM always schedules running decodes "
            "first; SGLang without --enable-mixed-chunk runs prefill batches first"
        )
    if knobs["max_num_partial_prefills"] > 1:
        notes.append("SGLang has no equivalent of --max-num-partial-prefills")
    return notes
