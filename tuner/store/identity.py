"""What makes two workers' measurements comparable. A study records it when it is created; a
worker whose own differs refuses to join, naming what differs, rather than mix its figures in."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.store.environment import device_description, software_versions
from tuner.targets.base import TargetFacts, TargetKind

# Each key a study's identity may hold, in the order a mismatch is reported, with its words.
# Earlier versions kept slo, workload, workload_fingerprint, mode, rate_rps, model and arrival
# (studies they made still resume); a key a study lacks is not checked.
LABELS = {
    "device": "device",
    "model": "model",
    "engine": "engine version",
    "target": "target kind",
    "workload": "workload",
    "workload_fingerprint": "workload fingerprint (the seeded request list)",
    "slo": "SLO",
    "mode": "objective",
    "rate_rps": "--rate",
    "arrival": "arrival process",
    "burstiness": "--burstiness",
    "level_s": "--level-seconds",
    "min_requests": "--min-requests",
    "level_mix": "--level-mix",
    "space": "search space (--param / --fix)",
}
# Engines whose version decides how a server schedules, when a launch template starts one.
_SERVER_PACKAGES = ("vllm", "sglang")


def device_of(facts: TargetFacts) -> str:
    """The hardware a target's figures depend on, the same on two nodes of one kind."""
    if facts.kind is TargetKind.SYNTHETIC:
        return facts.device
    if facts.kind is TargetKind.BUILTIN and "(" in facts.device:  # "cuda:1 (NVIDIA H200)"
        return "cuda:" + facts.device.split("(", 1)[1].rstrip(")")
    # The CPU by model and core count, or the node's GPU (a launched server runs beside us).
    return device_description()


def engine_of(facts: TargetFacts, launch: str | None) -> str:
    """The engine and the versions that change its scheduling or speed."""
    versions = software_versions()
    if facts.kind is TargetKind.BUILTIN:
        parts = [f"engine_lite {versions.get('chunked-prefill-tuner')}",
                 f"torch {versions.get('torch')}"]  # fmt: skip
        if "flash-attn" in versions:
            parts.append(f"flash-attn {versions['flash-attn']}")
        return ", ".join(parts)
    if facts.kind is TargetKind.LAUNCH and launch:
        program = Path(shlex.split(launch)[0]).name
        servers = [f"{p} {versions[p]}" for p in _SERVER_PACKAGES if p in versions]
        return ", ".join([program, *servers])
    return facts.description


def model_of(facts: TargetFacts) -> str:
    """A Hugging Face folder by its name: nodes keep the same model under different paths."""
    path = Path(facts.model)
    return path.name if facts.kind is TargetKind.BUILTIN and path.is_dir() else facts.model


def mismatch(study_name: str, stored: Mapping[str, Any], mine: Mapping[str, Any]) -> str | None:
    """One line naming the first thing that differs (None when the worker may join)."""
    for key in [*LABELS, *sorted(set(stored) - set(LABELS))]:
        if key not in stored:
            continue
        theirs, ours = _plain(stored[key]), _plain(mine.get(key))
        if theirs != ours:
            label = LABELS.get(key, key)
            return (
                f"this worker's {label} differs from study {study_name!r}: the study has "
                f"{_text(theirs)}, this worker {_text(ours)}; run it with the same settings on "
                "the same hardware, or pass a new --study-name"
            )
    return None


def _plain(value: Any) -> Any:
    """The value as it reads back from the study's JSON (tuples become lists, and so on)."""
    return json.loads(json.dumps(value, sort_keys=True))


def _text(value: Any) -> str:
    return repr(value) if not isinstance(value, dict) else json.dumps(value, sort_keys=True)
