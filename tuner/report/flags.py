"""Ready-to-paste serving flags for a recommended config: vLLM and SGLang spellings.

Only knobs the config has become flags, so a target that lacks a knob (vLLM 0.32 has no
partial-prefill limits and no policy) never has it recommended.
"""

from __future__ import annotations

from typing import Any

from engine_lite import Policy
from tuner.targets.knobs import KNOBS

_CHUNKED = "enable_chunked_prefill"


def _flag(name: str, value: Any) -> str:
    return f"{KNOBS[name].vllm_flag} {value}"


def vllm_flags(knobs: dict[str, Any]) -> str:
    """`vllm serve` flags (vllm/engine/arg_utils.py names for SchedulerConfig fields)."""
    parts = [_flag(n, knobs[n]) for n in ("max_num_batched_tokens", "max_num_seqs") if n in knobs]
    if _CHUNKED in knobs:
        chunk_flag = str(KNOBS[_CHUNKED].vllm_flag)
        parts.append(chunk_flag if knobs[_CHUNKED] else "--no-" + chunk_flag.removeprefix("--"))
    if not knobs.get(_CHUNKED, True):
        return " ".join(parts)
    if knobs.get("long_prefill_token_threshold"):
        parts.append(_flag("long_prefill_token_threshold", knobs["long_prefill_token_threshold"]))
    if knobs.get("long_prefill_token_threshold_adaptive"):
        parts.append(str(KNOBS["long_prefill_token_threshold_adaptive"].vllm_flag))
    if knobs.get("max_num_partial_prefills", 1) > 1:
        parts.append(_flag("max_num_partial_prefills", knobs["max_num_partial_prefills"]))
        parts.append(_flag("max_long_partial_prefills", knobs["max_long_partial_prefills"]))
    return " ".join(parts)


def sglang_flags(knobs: dict[str, Any]) -> str:
    """`python -m sglang.launch_server` flags (sglang/srt/server_args.py).

    SGLang caps each prefill chunk with --chunked-prefill-size and the prefill batch with
    --max-prefill-tokens; --enable-mixed-chunk lets running decodes ride in the same batch as a
    prefill chunk, which is what decode_first (Sarathi's stall-free batching) means.
    """
    budget, chunked = knobs["max_num_batched_tokens"], knobs.get(_CHUNKED, True)
    chunk = (knobs.get("long_prefill_token_threshold") or budget) if chunked else -1
    parts = [f"--chunked-prefill-size {chunk}", f"--max-prefill-tokens {budget}"]
    if "max_num_seqs" in knobs:
        parts.append(f"--max-running-requests {knobs['max_num_seqs']}")
    if chunked and _policy(knobs) is Policy.DECODE_FIRST:
        parts.append("--enable-mixed-chunk")
    return " ".join(parts)


def flag_notes(knobs: dict[str, Any]) -> list[str]:
    """What the flags cannot say, so nobody pastes them believing they carry everything."""
    notes = []
    if _policy(knobs) is Policy.PREFILL_FIRST:
        notes.append(
            "policy=prefill_first has no vLLM flag: vLLM always schedules running decodes "
            "first; SGLang without --enable-mixed-chunk runs prefill batches first"
        )
    if knobs.get("max_num_partial_prefills", 1) > 1:
        notes.append("SGLang has no equivalent of --max-num-partial-prefills")
    return notes


def _policy(knobs: dict[str, Any]) -> Policy:
    # Without a policy knob the server is vLLM V1's: running requests (decodes) first.
    return Policy(knobs.get("policy", Policy.DECODE_FIRST))
