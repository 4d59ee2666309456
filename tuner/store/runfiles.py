"""The run folder: where records, the trials table and the settings of a run live on disk.

results/<run>/study.db                      Optuna storage (unless --storage says otherwise)
results/<run>/run.json                      settings, so `tune report` and resumes find them
results/<run>/records/trial-0007-level-02.jsonl   per-request records of each load level
results/<run>/records/confirm-0007-rep-1.jsonl    re-measurements of the top configs
results/<run>/records_recommended.jsonl, records_default.jsonl
results/<run>/trials.csv (+ trials.parquet with pyarrow)  one row per trial and load level
results/<run>/confirmation.json             intervals and the choice they led to
results/<run>/recommendation.{json,md,html}, plots/*.png
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from loadgen.records import RequestRecord, read_records_jsonl, write_records_jsonl
from tuner.errors import TuneError
from tuner.search.study import ROLE, Role
from tuner.search.trial import CAPACITY, KNOBS, LEVEL_PREFIX, OUTCOME, UPPER

RUN_FILE = "run.json"
CONFIRMATION_FILE = "confirmation.json"
_CONFIRM_FILE = re.compile(r"-(\d+(?:\.\d+)?)rps\.jsonl$")


class RunFiles:
    """Paths inside one run folder, and reading/writing what lives there."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir)
        self.records_dir = self.root / "records"
        self.plots_dir = self.root / "plots"

    def ensure(self) -> None:
        self.records_dir.mkdir(parents=True, exist_ok=True)

    def level_path(self, trial: int, level: int) -> Path:
        return self.records_dir / f"trial-{trial:04d}-level-{level:02d}.jsonl"

    def confirm_path(self, trial: int, index: int, rate_rps: float) -> Path:
        return self.records_dir / f"confirm-{trial:04d}-{index:02d}-{rate_rps:.6f}rps.jsonl"

    def confirm_levels(self, trial: int) -> list[tuple[float, Path]]:
        """(rate, path) of a trial's confirmation runs, in the order they were measured."""
        out = []
        for path in sorted(self.records_dir.glob(f"confirm-{trial:04d}-*rps.jsonl")):
            match = _CONFIRM_FILE.search(path.name)
            if match:
                out.append((float(match.group(1)), path))
        return out

    def write_records(self, path: Path, records: Sequence[RequestRecord]) -> None:
        self.ensure()
        tmp = path.with_suffix(".tmp")
        write_records_jsonl(list(records), tmp)
        tmp.replace(path)  # a killed run never leaves half a file behind

    def read_records(self, path: Path) -> list[RequestRecord] | None:
        return read_records_jsonl(path) if path.exists() else None

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(clean_json(data), indent=2, allow_nan=False) + "\n")
        tmp.replace(path)
        return path

    def read_json(self, name: str) -> dict[str, Any] | None:
        path = self.root / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise TuneError(f"{path} is not valid JSON ({exc}); delete it and run again") from None


def trial_levels(trial: FrozenTrial) -> list[dict[str, Any]]:
    """A trial's load levels in order, from its user attrs."""
    keys = sorted(k for k in trial.user_attrs if k.startswith(LEVEL_PREFIX))
    return [trial.user_attrs[k] for k in keys]


def level_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial and load level: the trials table."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state in (TrialState.WAITING, TrialState.RUNNING) and not trial_levels(trial):
            continue
        base = {
            "trial": trial.number,
            "role": trial.user_attrs.get(ROLE, Role.SEARCH.value),
            "state": trial.state.name.lower(),
            "capacity_rps": trial.user_attrs.get(CAPACITY),
            "upper_bound_rps": trial.user_attrs.get(UPPER),
            "outcome": trial.user_attrs.get(OUTCOME),
            **{f"knob_{k}": v for k, v in trial.user_attrs.get(KNOBS, {}).items()},
        }
        levels = trial_levels(trial) or [{}]
        for i, level in enumerate(levels):
            rows.append({**base, "level": i if level else None, **level})
    return rows


def write_trials_table(study: optuna.Study, files: RunFiles) -> list[Path]:
    """trials.csv, and trials.parquet when pyarrow is installed."""
    import pandas as pd

    df = pd.DataFrame(level_rows(study))
    files.root.mkdir(parents=True, exist_ok=True)
    written = [files.root / "trials.csv"]
    df.to_csv(written[0], index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return written
    df.to_parquet(files.root / "trials.parquet", index=False)
    written.append(files.root / "trials.parquet")
    return written


def levels_with_records(
    files: RunFiles, trial: FrozenTrial
) -> list[tuple[float, list[RequestRecord]]]:
    """(rate, records) of each level of a trial whose records are in this run folder."""
    out = []
    for i, level in enumerate(trial_levels(trial)):
        records = files.read_records(files.level_path(trial.number, i))
        rate = level.get("rate_rps")
        if records is not None and rate is not None:
            out.append((float(rate), records))
    return out


def clean_json(value: Any) -> Any:
    """JSON-safe copy: NaN and inf become null, enums their value, paths strings."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
