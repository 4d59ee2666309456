"""vLLM 0.32's device-dependent scheduler defaults, so "the default" means what `vllm serve` runs.

Mirrors `EngineArgs.get_batch_defaults` and `_set_default_max_num_seqs_and_batched_tokens_args`
(vllm/engine/arg_utils.py, 0.32): the token budget and sequence limit depend on the device and
on whether the engine serves (the OpenAI server) or runs offline (the `LLM` class). Pure: the
device is described by the caller. So are the CPU threads a serving engine takes, but for
`usable_cores`, which asks the OS.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

GIB = 1 << 30


class UsageContext(enum.StrEnum):
    """vLLM's `UsageContext`: the server and the offline class have different defaults."""

    SERVER = "server"  # vLLM OPENAI_API_SERVER
    OFFLINE = "offline"  # vLLM LLM_CLASS


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What vLLM's defaults look at: the platform, the device's name and memory."""

    kind: str  # "cpu" or "cuda"
    name: str = ""
    total_memory_bytes: int = 0
    world_size: int = 1  # tensor x pipeline parallel ranks; engine_lite runs one


CPU_DEVICE = DeviceInfo("cpu", "cpu")


@dataclass(frozen=True, slots=True)
class BatchDefaults:
    """One row of vLLM's table: which row it is, and its budget and sequence limit."""

    row: str
    max_num_batched_tokens: int
    max_num_seqs: int

    def describe(self) -> str:
        return (
            f"vLLM 0.32's {self.row} default (max_num_batched_tokens="
            f"{self.max_num_batched_tokens}, max_num_seqs={self.max_num_seqs})"
        )


# (row, server budget, offline budget, server seqs, offline seqs); `get_batch_defaults`.
_ROWS = {
    "b200": ("GPU with >= 160 GiB (B200/B300)", 16384, 16384, 1024, 1024),
    "h100": ("GPU with >= 70 GiB, not A100 (H100/H200)", 8192, 16384, 1024, 1024),
    "other": ("other GPU (A100, L4, ...)", 2048, 8192, 256, 256),
    "cpu": ("CPU", 2048, 4096, 128, 256),
}


def batch_defaults(device: DeviceInfo, usage: UsageContext = UsageContext.SERVER) -> BatchDefaults:
    """The table row vLLM 0.32 picks for this device, scaled by world size on CPU."""
    if device.kind == "cpu":
        key = "cpu"
    elif device.total_memory_bytes >= 160 * GIB:
        key = "b200"
    elif device.total_memory_bytes >= 70 * GIB and "a100" not in device.name.lower():
        key = "h100"
    else:
        key = "other"
    row, server_tokens, offline_tokens, server_seqs, offline_seqs = _ROWS[key]
    server = usage is UsageContext.SERVER
    tokens = server_tokens if server else offline_tokens
    seqs = server_seqs if server else offline_seqs
    if key == "cpu":  # only the CPU row scales with world size
        tokens, seqs = tokens * device.world_size, seqs * device.world_size
    return BatchDefaults(row, tokens, seqs)


def resolve_batch_limits(
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    enable_chunked_prefill: bool,
    max_model_len: int,
    defaults: BatchDefaults,
) -> tuple[int, int]:
    """Fill the unset limits the way vLLM does: the table value, then its clamps (a budget
    that covers max_model_len without chunking, at most max_num_seqs x max_model_len, and a
    sequence limit no larger than the budget)."""
    seqs = defaults.max_num_seqs if max_num_seqs is None else max_num_seqs
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = defaults.max_num_batched_tokens
        if not enable_chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs


def cpu_threads(
    requested: int | None, usage: UsageContext, usable_cores: int, half_precision: bool
) -> int | None:
    """Torch's intra-op threads on a CPU device; None leaves the process's count.

    Serving in bfloat16 or float16, what vLLM 0.32 runs on a CPU (a float32 checkpoint in
    bfloat16), the engine takes vLLM's layout: its CPU worker binds OpenMP threads to all usable
    cores but one, which it reserves for the API server and the engine core (its log on 2 cores:
    "reserved_cpus=[1]", "Reducing Torch threads from 2 to 1 for serving"). The layout changes
    which budget wins, so a stand-in for vLLM must run it: on a 2-core AMX CPU (`tiny`,
    bfloat16, `mixed`) one thread took TPOT median from 5.4-7.2 ms to 3.0-3.3 ms, the free core
    taking the client's event loop instead of holding up every op, while the default's long
    prefills ran slower (TTFT p99 0.41-0.59 s against 0.25-0.29 s); the built-in engine's
    ranking of six budgets then followed vLLM's (Spearman 0.78, from 0.23-0.25).
    In float32, the built-in engine's CPU default and not what vLLM serves by default, one
    thread doubled the tail (TPOT p99 42.7-51.1 ms against 18.5-28.9, TTFT p99 1.04-1.08 s
    against 0.43-0.49 s), so it keeps the process's count, as does the offline `LLM` class.
    """
    if requested is not None:
        return requested
    if usage is UsageContext.SERVER and half_precision:
        return max(1, usable_cores - 1)
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity on Linux, the machine's elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
