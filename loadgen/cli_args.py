"""The `loadgen` command's flags; a bad flag is one `error:` line and exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from loadgen.arrivals import ArrivalKind
from loadgen.schedule import DEFAULT_LAG_TOLERANCE_S
from loadgen.trace_fit import OnLong
from loadgen.workloads import DEFAULT_VOCAB_SIZE, WORKLOADS

DESCRIPTION = "Replay a workload against a server (or the built-in engine) and judge it by an SLO."

DEFAULT_NUM_REQUESTS = 200
# Engine flags for --builtin, under vLLM's names; unset ones keep EngineConfig's defaults.
ENGINE_INT_FLAGS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "long_prefill_token_threshold",
    "block_size",
    "num_gpu_blocks_override",
    "cpu_threads",
)
ENGINE_OTHER_FLAGS = (
    "enable_chunked_prefill",
    "long_prefill_token_threshold_adaptive",
    "policy",
    "kv_cache_memory_gb",
    "gpu_memory_utilization",
    "device",
    "dtype",
    "attention_backend",
)


_ENGINE_HELP = {
    "max_num_batched_tokens": "token budget of one step",
    "max_num_seqs": "most running requests",
    "long_prefill_token_threshold": "most prompt tokens per request per step (0 = off)",
    "block_size": "tokens per KV block",
    "num_gpu_blocks_override": "KV cache size in blocks",
    "cpu_threads": "torch threads on a CPU (default: all usable cores but one in bfloat16, "
    "as vLLM serves; torch's count in float32)",
}


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad flag as one `error: ...` line and exits 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see loadgen --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="loadgen", description=DESCRIPTION)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    where.add_argument("--builtin", action="store_true", help="drive engine_lite in this process")
    p.add_argument(
        "--model",
        help="served model name (--url; default: the server's first) or "
        "engine model preset/folder (--builtin; default tiny)",
    )
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default="mixed")
    w.add_argument(
        "--num-requests",
        type=int,
        help=f"measured requests (default {DEFAULT_NUM_REQUESTS}; trace: all rows)",
    )
    w.add_argument("--seed", type=int, default=0, help="seed of lengths, prompts and arrivals")
    w.add_argument(
        "--max-model-len",
        type=int,
        help="context to size the workload for (default: the server's or engine's, else 8192)",
    )
    w.add_argument(
        "--vocab-size",
        type=int,
        help=f"prompt ids lie below this (default {DEFAULT_VOCAB_SIZE}; --builtin: the model's)",
    )
    w.add_argument("--length-scale", type=float, help="stretch every length by this factor")
    w.add_argument("--input-len", type=int, default=1024, help="random: mean prompt length")
    w.add_argument("--output-len", type=int, default=128, help="random: mean output length")
    w.add_argument("--range-ratio", type=float, default=0.0, help="random: U[L(1-r), L(1+r)]")
    w.add_argument(
        "--trace-file", help="Azure CSV, Mooncake JSONL or our JSONL (default: bundled Azure slice)"
    )
    w.add_argument("--trace-format", choices=["azure", "mooncake", "jsonl"])
    w.add_argument("--slice", help="trace rows START:END")
    w.add_argument(
        "--on-long",
        choices=[p.value for p in OnLong],
        default=OnLong.CLIP.value,
        help="trace rows longer than max_model_len: clip the prompt to fit (default), skip "
        "the row, or stop with an error; the count is printed",
    )
    a = p.add_argument_group("arrivals")
    a.add_argument(
        "--rate", type=float, help="requests/s (inf = all at once; trace default: its own timing)"
    )
    a.add_argument(
        "--arrival",
        choices=[k.value for k in ArrivalKind],
        help="default: trace for the trace workload, gamma if --burstiness != 1, else poisson",
    )
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; < 1 burstier")
    a.add_argument(
        "--time-scale", type=float, default=1.0, help="trace: stretch time (2 = half rate)"
    )
    r = p.add_argument_group("run")
    r.add_argument("--slo", help="e.g. tpot_p99=30ms,ttft_p99=2s")
    r.add_argument("--warmup", type=int, default=0, help="extra first requests left out of metrics")
    r.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    r.add_argument("--workers", type=int, default=1, help="client processes (--url only)")
    r.add_argument("--lag-tolerance-ms", type=float, default=DEFAULT_LAG_TOLERANCE_S * 1e3)
    r.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    r.add_argument("--out", help="directory for records.jsonl and result.json")
    r.add_argument("--no-progress", action="store_true")
    e = p.add_argument_group("engine (--builtin; vLLM flag names, vllm serve defaults)")
    for name in ENGINE_INT_FLAGS:
        e.add_argument("--" + name.replace("_", "-"), type=int, help=_ENGINE_HELP.get(name))
    e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    e.add_argument(
        "--long-prefill-token-threshold-adaptive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="floor the threshold at budget / (running + waiting)",
    )
    e.add_argument(
        "--policy",
        choices=["decode_first", "prefill_first"],
        help="engine_lite extension: decode_first is vLLM's order",
    )
    e.add_argument("--kv-cache-memory-gb", type=float)
    e.add_argument("--gpu-memory-utilization", type=float)
    e.add_argument("--device")
    e.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    e.add_argument("--attention-backend", choices=["auto", "torch", "flash"])
    return p
