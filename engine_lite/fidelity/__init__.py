"""Step-by-step comparison of engine_lite's scheduler with vLLM 0.32's own `Scheduler`."""

from engine_lite.fidelity.cases import KINDS, CaseRequest, SchedCase, make_cases
from engine_lite.fidelity.compare import CaseResult, compare, find_vllm_python
from engine_lite.fidelity.replay import replay_case
from engine_lite.fidelity.trace import SchedTrace, first_difference

__all__ = [
    "KINDS",
    "CaseRequest",
    "CaseResult",
    "SchedCase",
    "SchedTrace",
    "compare",
    "find_vllm_python",
    "first_difference",
    "make_cases",
    "replay_case",
]
