"""Write a run's report from its folder and study (the trials table, the recommendation JSON,
its figures, Markdown and HTML): `tune` ends here, and `tune report RUN_DIR` rebuilds it, with
the intervals from the records on disk when the run ended before its confirmation."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.errors import TuneError
from tuner.report.plots import importance, report_figures
from tuner.report.recommendation import build_recommendation
from tuner.report.render import write_reports
from tuner.report.summary import print_summary
from tuner.search.confirm import build_candidate, candidate_rate, choose
from tuner.search.study import load_study, storage_url, top_trials
from tuner.store.codec import confirmation_json
from tuner.store.records import Confirmation, Role
from tuner.store.runfiles import (
    CONFIRMATION_FILE,
    DEFAULT_RECORDS,
    RECOMMENDED_RECORDS,
    RunFiles,
    RunView,
    write_trials_table,
)
from tuner.targets.base import ServerLost

REBUILT = "rebuilt from records (the run ended before its confirmation)"


def publish(files: RunFiles, study: optuna.Study) -> dict[str, Any]:
    """Every report file of the run, from what is on disk (confirmation.json included);
    returns the recommendation JSON."""
    view = RunView.read(files, study)
    conf = view.confirmation()
    if conf is None:
        raise TuneError(f"{files.root} has no {CONFIRMATION_FILE}; run `tune report` on it")
    write_trials_table(view.trials, files)
    _keep_records(view, conf)
    rec = build_recommendation(view, conf)
    if imp := importance(study):
        rec["importance"] = imp
    write_reports(rec, report_figures(rec, view.trials), files)
    return rec


def _keep_records(view: RunView, conf: Confirmation) -> None:
    """The recommended config's requests at its confirmed rate, and the default's at its
    capacity (its first level if it never passed), beside the report."""
    files = view.files
    if (chosen := conf.chosen) is not None:
        trial, rate = view.trial(chosen.trial), chosen.verdict.rate_rps
        runs = files.search_runs(trial) + files.confirm_runs(trial.number)
        records = [r for run in runs if run.rate_rps == rate for r in run.records]
        files.write_records(files.root / RECOMMENDED_RECORDS, records)
    default = view.with_role(Role.DEFAULT)
    if default is not None and default.state is TrialState.COMPLETE and default.levels:
        rates = [level.rate_rps for level in default.levels]
        index = rates.index(default.capacity_rps) if default.capacity_rps in rates else 0
        records = files.read_records(files.level_path(default.number, index))
        if records is not None:
            files.write_records(files.root / DEFAULT_RECORDS, records)


def open_run(run_dir: Path) -> tuple[RunFiles, optuna.Study]:
    """A run folder and its study (wherever its storage is)."""
    files = RunFiles(run_dir)
    info = files.read_run_info()
    storage = storage_url(info["settings"].get("storage"), files.root)
    return files, load_study(info["study_name"], storage)


def report_lost_server(files: RunFiles, study: optuna.Study, lost: ServerLost) -> TuneError:
    """Report what was measured before the server was lost (as `tune report` would), and the
    one-line error the run ends with."""
    view = RunView.read(files, study)
    levels = sum(len(t.levels) for t in view.trials)
    if levels == 0:
        return TuneError(str(lost))
    conf = rebuild_confirmation(view, stopped_by=f"the server was lost: {lost}")
    files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    publish(files, study)
    measured = "1 load level" if levels == 1 else f"{levels} load levels"
    return TuneError(
        f"the server stopped answering: {lost}; what was measured ({measured}) is reported in "
        f"{files.root / 'recommendation.html'}; tune --resume {files.root} goes on from there"
    )


def rebuild_confirmation(view: RunView, stopped_by: str = REBUILT) -> Confirmation:
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
    return Confirmation(candidates, chosen.trial if chosen else None, None, stopped_by, None)


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune report", description=__doc__)
    parser.add_argument("run_dir", help="a folder written by tune")
    parser.add_argument("--json", action="store_true", help="print the recommendation JSON")
    args = parser.parse_args(argv)
    files, study = open_run(Path(args.run_dir))
    files.check_writable()  # the report is written beside the run
    if files.read_json(CONFIRMATION_FILE) is None:
        conf = rebuild_confirmation(RunView.read(files, study))
        files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    rec = publish(files, study)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        print_summary(rec)
    return 0
