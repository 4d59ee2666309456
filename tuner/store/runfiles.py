"""The run folder (its layout is in docs/tuner.md, "The run folder"): records, the trials
table, the settings; and `RunView`, the run read back as typed records for every report."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from loadgen.records import RequestRecord, read_records_jsonl, write_records_jsonl
from loadgen.stop import measured_part
from slo import SLO, parse_slo
from tuner.errors import TuneError
from tuner.measure.judge import Run
from tuner.measure.meter import LevelRun
from tuner.measure.verdict import VerdictRules
from tuner.store import attrs
from tuner.store.codec import clean_json, confirmation_from_json, level_row
from tuner.store.records import Confirmation, Mode, Role, TrialRecord, rules_for
from tuner.targets.knobs import knobs_to_json

RUN_FILE = "run.json"
CONFIRMATION_FILE = "confirmation.json"
RECOMMENDED_RECORDS = "records_recommended.jsonl"
DEFAULT_RECORDS = "records_default.jsonl"
SAME_RATE_RECORDS = "records_default_at_recommended_rate.jsonl"
_CONFIRM_FILE = re.compile(r"-(\d+(?:\.\d+)?)rps\.jsonl$")


class RunFiles:
    """Paths inside one run folder, and reading/writing what lives there."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir)
        self.records_dir = self.root / "records"
        self.plots_dir = self.root / "plots"

    def ensure(self) -> None:
        with self.writing(self.records_dir):
            self.records_dir.mkdir(parents=True, exist_ok=True)

    def check_writable(self) -> None:
        """Fail in one line before anything is measured when the folder cannot be made (under a
        file, say) or written (read-only), rather than losing a measurement to it later."""
        probe = self.root / ".write-check"
        try:
            self.records_dir.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise TuneError(
                f"cannot write the run folder {self.root} ({exc.strerror or exc}); pass a "
                "--run-dir you can write to"
            ) from None

    @contextlib.contextmanager
    def writing(self, path: Path) -> Iterator[None]:
        """Turn a failed write (a full disk, a folder made read-only mid-run) into one line."""
        try:
            yield
        except OSError as exc:
            raise TuneError(
                f"cannot write {path} ({exc.strerror or exc}); free the space or fix the "
                f"permissions, then tune --resume {self.root}"
            ) from None

    def level_path(self, trial: int, level: int) -> Path:
        return self.records_dir / f"trial-{trial:04d}-level-{level:02d}.jsonl"

    def lost_level_path(self, trial: int, level: int) -> Path:
        """The requests of a level the server did not live through: kept, never judged."""
        return self.records_dir / f"trial-{trial:04d}-level-{level:02d}-server-lost.jsonl"

    def confirm_path(self, trial: int, index: int, rate_rps: float) -> Path:
        return self.records_dir / f"confirm-{trial:04d}-{index:02d}-{rate_rps:.6f}rps.jsonl"

    def write_confirm_run(self, trial: int, index: int, run: LevelRun) -> None:
        """A re-measurement's records, and its figures beside them (for `tune report`)."""
        path = self.confirm_path(trial, index, run.level.rate_rps)
        self.write_records(path, run.records)
        self.write_text(path.with_suffix(".level.json"), json.dumps(level_row(run.level)))

    def confirm_run_count(self, trial: int) -> int:
        """How many re-measurements of a trial this folder holds, without reading them."""
        return sum(1 for _ in self.records_dir.glob(f"confirm-{trial:04d}-*rps.jsonl"))

    def confirm_runs(self, trial: int) -> list[Run]:
        """A trial's re-measurements, in the order they were measured."""
        out = []
        for path in sorted(self.records_dir.glob(f"confirm-{trial:04d}-*rps.jsonl")):
            match = _CONFIRM_FILE.search(path.name)
            records = self.read_records(path)
            if match and records is not None:
                side = path.with_suffix(".level.json")
                row = json.loads(side.read_text()) if side.exists() else {}
                # The file name rounds the rate; the figures beside it hold it exactly, as the
                # confirmation's verdicts (matched against it) do.
                rate = float(row.get("rate_rps", match.group(1)))
                stopped = row.get("stopped_s") is not None  # what it measured, and it failed
                out.append(Run(rate, measured_part(records), row.get("schedule_ok", True),
                               stopped))  # fmt: skip
        return out

    def search_runs(self, trial: TrialRecord, measured_only: bool = True,
                    carried: bool = True) -> list[Run]:  # fmt: skip
        """A trial's search levels whose records are in this folder, with those of the attempt
        it went on from unless `carried` is off: what each level measured (a level stopped
        early once its SLO broke left the rest unmeasured), or with `measured_only=False` every
        request it scheduled, as the simulator replays a level."""
        positions = trial.search_positions[0 if carried else len(trial.carried_records) :]
        out = []
        for number, i, level in positions:
            records = self.read_records(self.level_path(number, i))
            if records is not None:
                kept = measured_part(records) if measured_only else records
                out.append(Run(level.rate_rps, kept, level.verdict.schedule_ok,
                               level.stopped_s is not None))  # fmt: skip
        return out

    def write_records(self, path: Path, records: Sequence[RequestRecord]) -> None:
        self.ensure()
        tmp = path.with_suffix(".tmp")
        with self.writing(path):
            write_records_jsonl(list(records), tmp)
            tmp.replace(path)  # a killed run never leaves half a file behind

    def read_records(self, path: Path) -> list[RequestRecord] | None:
        if not path.exists():
            return None
        try:
            return read_records_jsonl(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # truncated, edited, not ours
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TuneError(
                f"{path} is damaged ({why}); delete it and the report leaves that level's "
                "requests out"
            ) from None

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        path = self.root / name
        self.write_text(path, json.dumps(clean_json(data), indent=2, allow_nan=False) + "\n")
        return path

    def read_json(self, name: str) -> dict[str, Any] | None:
        """A JSON object file of the run (None when there is none); a damaged one is a
        one-line error naming the file and what is wrong with it."""
        path = self.root / name
        try:
            data = json.loads(path.read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise TuneError(f"cannot read {path} ({exc.strerror or exc})") from None
        except ValueError as exc:  # not UTF-8, not JSON
            raise TuneError(f"{path} is not valid JSON ({exc}); it is damaged") from None
        if not isinstance(data, dict):
            raise TuneError(f"{path} holds a JSON {type(data).__name__}, not an object; it is "
                            "damaged or not a tune file")  # fmt: skip
        return data

    def read_run_info(self) -> dict[str, Any]:
        """run.json, checked for what a resume and a report read from it."""
        info = self.read_json(RUN_FILE)
        if info is None:
            raise TuneError(f"{self.root} has no {RUN_FILE}; pass the folder a tune run wrote")
        if not isinstance(info, dict):
            raise TuneError(f"{self.root / RUN_FILE} holds a {type(info).__name__}, not an "
                            "object; it is damaged or was not written by tune")  # fmt: skip
        for key, kind in (("settings", dict), ("slo", str), ("study_name", str)):
            if not isinstance(info.get(key), kind):
                raise TuneError(f"{self.root / RUN_FILE} has no {key!r} {kind.__name__}; it is "
                                "damaged or was not written by tune")  # fmt: skip
        return info

    def write_text(self, path: Path, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path: Path, data: bytes) -> None:
        """Whole or not at all: a killed run never leaves half a file behind."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        with self.writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            tmp.replace(path)


def level_rows(trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """One row per trial and load level: the trials table."""
    rows = []
    for t in trials:
        base = {
            "trial": t.number, "role": t.role.value, "state": t.state.name.lower(),
            "capacity_rps": t.capacity_rps, "upper_bound_rps": t.upper_bound_rps,
            "outcome": t.ending.value if t.ending else None,
            **{f"knob_{k}": v for k, v in knobs_to_json(t.knobs).items()},
        }  # fmt: skip
        levels = [level_row(level) for level in t.levels] or [{}]
        for i, level in enumerate(levels):
            rows.append({**base, "level": i if level else None, **level})
    return rows


def write_trials_table(trials: Sequence[TrialRecord], files: RunFiles) -> list[Path]:
    """trials.csv, and trials.parquet when pyarrow is installed (trials queued or started but
    without a level yet are left out)."""
    import pandas as pd

    waiting = (TrialState.WAITING, TrialState.RUNNING)
    shown = [t for t in trials if t.levels or t.state not in waiting]
    df = pd.DataFrame(level_rows(shown))
    written = [files.root / "trials.csv"]
    files.write_text(written[0], df.to_csv(index=False))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return written
    written.append(files.root / "trials.parquet")
    files.write_bytes(written[1], df.to_parquet(index=False))
    return written


@dataclass(slots=True)
class RunView:
    """What one run folder and its study hold, read into typed records. `tune` and `tune report`
    both build the report from it, so a report rebuilt from the folder is the one the run wrote."""

    files: RunFiles
    info: dict[str, Any]  # run.json: settings, workload, target, environment
    study: optuna.Study
    slo: SLO
    mode: Mode
    rules: VerdictRules
    trials: list[TrialRecord]

    @classmethod
    def read(
        cls, files: RunFiles, study: optuna.Study, info: dict[str, Any] | None = None
    ) -> RunView:
        """`info` is run.json as the worker that confirmed a shared study stored it (else this
        folder's own)."""
        info = info if info is not None else files.read_run_info()
        try:
            slo, mode = parse_slo(info["slo"]), Mode(info.get("mode", Mode.CAPACITY.value))
            target = info.get("target") or {}
            rules = rules_for(mode, bool(target.get("require_schedule", False)))
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise TuneError(f"{files.root / RUN_FILE} is damaged: {exc}") from None
        trials = [attrs.read_trial(t, slo, rules) for t in study.get_trials(deepcopy=False)]
        for t in trials:  # in order: an attempt's own carried records are linked before
            if t.continues is not None:
                t.carried_records = trials[t.continues].search_positions
        return cls(files, info, study, slo, mode, rules, trials)

    @property
    def finished(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.finished]

    def trial(self, number: int) -> TrialRecord:
        return self.trials[number]

    def with_role(self, role: Role) -> TrialRecord | None:
        """The latest finished trial measured in this role (a reference re-run after a crash
        wins)."""
        hits = [t for t in self.finished if t.role is role]
        return hits[-1] if hits else None

    def confirmation(self) -> Confirmation | None:
        data = self.files.read_json(CONFIRMATION_FILE)
        if data is None:
            return None
        try:
            return confirmation_from_json(data, self.slo, self.rules)
        except (KeyError, TypeError, ValueError) as exc:
            raise TuneError(
                f"{self.files.root / CONFIRMATION_FILE} is damaged ({type(exc).__name__}: "
                f"{exc}); delete it and `tune report {self.files.root}` rebuilds it"
            ) from None

    @property
    def settings(self) -> dict[str, Any]:
        return self.info.get("settings", {})
