"""`tune report RUN_DIR`: rebuild a run's recommendation from its study and records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import optuna

from slo import parse_slo
from tuner.confirm.candidates import Confirmer, choose, top_trials
from tuner.errors import TuneError
from tuner.measure.level import LevelSettings
from tuner.report.recommendation import build_recommendation, write_reports
from tuner.search.space import SearchSpace
from tuner.search.study import storage_url
from tuner.search.trial import KNOBS, Mode
from tuner.settings import TuneSettings
from tuner.store.runfiles import (
    CONFIRMATION_FILE,
    RUN_FILE,
    RunFiles,
    levels_with_records,
    write_trials_table,
)


def load_run(run_dir: Path) -> tuple[RunFiles, dict[str, Any], optuna.Study]:
    files = RunFiles(run_dir)
    info = files.read_json(RUN_FILE)
    if info is None:
        raise TuneError(f"{run_dir} has no {RUN_FILE}; pass the folder a tune run wrote")
    settings = TuneSettings.from_json(info["settings"])
    storage = storage_url(settings.storage, files.root)
    try:
        study = optuna.load_study(study_name=info["study_name"], storage=storage)
    except KeyError:
        raise TuneError(f"study {info['study_name']!r} is not in {storage}") from None
    return files, info, study


def rebuild_confirmation(files: RunFiles, info: dict[str, Any], study: optuna.Study) -> dict:
    """Intervals from the records on disk when a run ended before its confirmation."""
    settings = TuneSettings.from_json(info["settings"])
    mode = Mode(info.get("mode", "capacity"))
    confirmer = Confirmer(
        target=None,  # type: ignore[arg-type]  # build() measures nothing
        requests=[], slo=parse_slo(info["slo"]), files=files,
        level_settings=LevelSettings(), mode=mode, rate_rps=settings.rate_rps,
        seed=settings.seed,
    )  # fmt: skip
    space = SearchSpace({}, {}, 1, 1, 1)
    candidates = []
    for trial in top_trials(study, settings.top_k, mode):
        rate = settings.rate_rps or float(trial.value or 0.0)
        levels = _levels(files, trial)
        if not levels:
            continue
        knobs = space.normalise(trial.user_attrs[KNOBS]) if trial.user_attrs.get(KNOBS) else {}
        candidates.append(confirmer.build(trial, knobs, levels, rate, repeats=0))
    chosen = choose(candidates)
    return {
        "candidates": [c.summary() for c in candidates],
        "chosen_trial": chosen.trial if chosen else None,
        "stopped_by": "rebuilt from records (the run ended before its confirmation)",
        "elapsed_s": None,
    }


def _levels(files: RunFiles, trial: optuna.trial.FrozenTrial) -> list:
    levels = levels_with_records(files, trial)
    for rate, path in files.confirm_levels(trial.number):
        records = files.read_records(path)
        if records is not None:
            levels.append((rate, records))
    return levels


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune report", description=__doc__)
    parser.add_argument("run_dir", help="a folder written by tune")
    parser.add_argument("--json", action="store_true", help="print the recommendation JSON")
    args = parser.parse_args(argv)
    files, info, study = load_run(Path(args.run_dir))
    confirmation = files.read_json(CONFIRMATION_FILE)
    if confirmation is None:
        confirmation = rebuild_confirmation(files, info, study)
        files.write_json(CONFIRMATION_FILE, confirmation)
    write_trials_table(study, files)
    rec = build_recommendation(study, info, confirmation, files)
    write_reports(rec, study, files)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        from tuner.cli import print_summary

        print_summary(rec)
    return 0
