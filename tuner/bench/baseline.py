"""Baseline files for `tune bench`: the samples of a past run plus the environment they came from.

Figures only compare within one environment: a baseline records the device, model, workload hash
and mode it was measured under (in sim mode, the profile's file name and content hash too), and a
run in another environment is refused rather than compared.
Software versions are recorded and shown, not refused, because a version change is exactly what a
serving team's CI wants to measure.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import TuneError

FORMAT_VERSION = 1
# Keys of `Environment` that must match for a comparison to mean anything.
STRICT_KEYS = ("device", "model", "workload_hash", "mode", "rate_rps", "slo", "profile",
               "profile_hash")  # fmt: skip


@dataclass(slots=True)
class Environment:
    """Where and on what a suite was measured."""

    device: str
    model: str
    workload_hash: str
    mode: str
    rate_rps: float
    slo: str
    versions: dict[str, str] = field(default_factory=dict)
    # Sim mode: the cost-model profile the figures were simulated with ("" in other modes).
    profile: str = ""  # its file name
    profile_hash: str = ""  # sha256 of its content, as canonical JSON

    def mismatches(self, other: Environment) -> list[str]:
        """Human-readable differences in the keys that make a comparison meaningless."""
        ours, theirs = asdict(self), asdict(other)
        return [
            f"{k}: baseline {theirs[k]!r}, now {ours[k]!r}"
            for k in STRICT_KEYS
            if ours[k] != theirs[k]
        ]


@dataclass(slots=True)
class ConfigSamples:
    """One config's knobs and its per-repeat samples of each figure."""

    knobs: dict[str, Any]
    samples: dict[str, list[float]]  # absolute figures, one value per repeat
    ratios: dict[str, list[float]] = field(default_factory=dict)  # vs the reference, per repeat


@dataclass(slots=True)
class Baseline:
    """What `--update-baseline` writes and later runs compare against."""

    suite: str
    environment: Environment
    configs: dict[str, ConfigSamples]
    reference: str | None
    created: str = ""
    format: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def load_baseline(path: str | Path) -> Baseline:
    p = Path(path)
    if not p.is_file():
        raise TuneError(
            f"--baseline {str(p)!r} does not exist; record one first with --update-baseline"
        )
    try:
        raw = json.loads(p.read_text())
        if raw.get("format") != FORMAT_VERSION:
            raise TuneError(
                f"baseline {str(p)!r} has format {raw.get('format')!r}, this tool reads "
                f"{FORMAT_VERSION}; re-record it with --update-baseline"
            )
        configs = {k: ConfigSamples(**v) for k, v in raw["configs"].items()}
        return Baseline(raw["suite"], Environment(**raw["environment"]), configs,
                        raw.get("reference"), raw.get("created", ""))  # fmt: skip
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise TuneError(
            f"baseline {str(p)!r} is not a tune bench baseline ({exc}); re-record it with "
            "--update-baseline"
        ) from None


def write_baseline(baseline: Baseline, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    baseline.created = baseline.created or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(baseline.to_json())
    tmp.replace(p)  # atomic: a killed run never leaves a half-written baseline
    return p
