"""A run as its folder and study hold it: settings, typed trial records, the confirmation.

`tune` and `tune report` both build the report from this view, so a report rebuilt from the
folder alone is the one the run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from slo import SLO, parse_slo
from tuner.errors import TuneError
from tuner.measure.verdict import VerdictRules
from tuner.store import attrs
from tuner.store.codec import confirmation_from_json
from tuner.store.records import Confirmation, Mode, Role, TrialRecord, rules_for
from tuner.store.runfiles import CONFIRMATION_FILE, RUN_FILE, RunFiles


@dataclass(slots=True)
class RunView:
    """What one run folder and its study hold, read into typed records."""

    files: RunFiles
    info: dict[str, Any]  # run.json: settings, workload, target, environment
    study: optuna.Study
    slo: SLO
    mode: Mode
    rules: VerdictRules
    trials: list[TrialRecord]

    @classmethod
    def read(cls, files: RunFiles, study: optuna.Study) -> RunView:
        info = files.read_json(RUN_FILE)
        if not isinstance(info, dict):
            raise TuneError(f"{files.root} has no {RUN_FILE}; pass the folder a tune run wrote")
        slo, mode = parse_slo(info["slo"]), Mode(info.get("mode", Mode.CAPACITY.value))
        rules = rules_for(mode, bool(info.get("target", {}).get("require_schedule", False)))
        trials = [attrs.read_trial(t, slo, rules) for t in study.get_trials(deepcopy=False)]
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
        return None if data is None else confirmation_from_json(data, self.slo, self.rules)

    @property
    def settings(self) -> dict[str, Any]:
        return self.info.get("settings", {})
