"""loadgen: replay realistic mixed LLM traffic and record every request's token timings."""

from loadgen.arrivals import ArrivalKind, arrival_offsets, arrival_pattern
from loadgen.client import HttpTarget, HttpTargetConfig
from loadgen.errors import LoadgenError
from loadgen.inprocess import InProcessTarget
from loadgen.records import (
    RequestRecord,
    read_records_jsonl,
    records_from_dataframe,
    records_to_dataframe,
    write_records_jsonl,
)
from loadgen.runner import ReplayResult, replay
from loadgen.target import Target
from loadgen.traces import TraceFormat, TraceRow, read_trace
from loadgen.workloads import WORKLOADS, RequestSpec, Workload, build_workload

__all__ = [
    "WORKLOADS",
    "ArrivalKind",
    "HttpTarget",
    "HttpTargetConfig",
    "InProcessTarget",
    "LoadgenError",
    "ReplayResult",
    "RequestRecord",
    "RequestSpec",
    "Target",
    "TraceFormat",
    "TraceRow",
    "Workload",
    "arrival_offsets",
    "arrival_pattern",
    "build_workload",
    "read_records_jsonl",
    "read_trace",
    "records_from_dataframe",
    "records_to_dataframe",
    "replay",
    "write_records_jsonl",
]
