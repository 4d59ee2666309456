"""`tune report RUN_DIR`: rebuild a run's recommendation from its study and records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import optuna

from tuner.confirm.candidates import build_candidate, candidate_rate, choose
from tuner.errors import TuneError
from tuner.report.publish import publish
from tuner.report.summary import print_summary
from tuner.search.study import storage_url, top_trials
from tuner.store.codec import confirmation_json
from tuner.store.records import Confirmation
from tuner.store.runfiles import CONFIRMATION_FILE, RUN_FILE, RunFiles
from tuner.store.view import RunView

REBUILT = "rebuilt from records (the run ended before its confirmation)"


def open_run(run_dir: Path) -> tuple[RunFiles, optuna.Study]:
    """A run folder and its study (wherever its storage is)."""
    files = RunFiles(run_dir)
    info = files.read_json(RUN_FILE)
    if not isinstance(info, dict) or "settings" not in info:
        raise TuneError(f"{run_dir} has no {RUN_FILE}; pass the folder a tune run wrote")
    storage = storage_url(info["settings"].get("storage"), files.root)
    try:
        study = optuna.load_study(study_name=info["study_name"], storage=storage)
    except KeyError:
        raise TuneError(f"study {info['study_name']!r} is not in {storage}") from None
    return files, study


def rebuild_confirmation(view: RunView) -> Confirmation:
    """Intervals from the records on disk, for a run that ended before its confirmation."""
    settings = view.settings
    rate = settings.get("rate_rps")
    candidates = []
    for frozen in top_trials(view.study, settings.get("top_k", 3), view.mode):
        trial = view.trial(frozen.number)
        runs = view.files.search_runs(trial) + view.files.confirm_runs(trial.number)
        if runs:
            candidates.append(build_candidate(
                trial, runs, candidate_rate(trial, view.mode, rate), 0, view.slo, view.rules,
                view.mode, settings.get("seed", 0),
            ))  # fmt: skip
    chosen = choose(candidates)
    return Confirmation(candidates, chosen.trial if chosen else None, None, REBUILT, None)


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune report", description=__doc__)
    parser.add_argument("run_dir", help="a folder written by tune")
    parser.add_argument("--json", action="store_true", help="print the recommendation JSON")
    args = parser.parse_args(argv)
    files, study = open_run(Path(args.run_dir))
    if files.read_json(CONFIRMATION_FILE) is None:
        conf = rebuild_confirmation(RunView.read(files, study))
        files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    rec = publish(files, study)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        print_summary(rec)
    return 0
