"""Write a run's report from its folder and study: the trials table, the recommendation JSON,
its figures, Markdown and HTML. `tune` and `tune report` both end here."""

from __future__ import annotations

from typing import Any

import optuna

from tuner.errors import TuneError
from tuner.report.figures import importance, report_figures
from tuner.report.recommendation import build_recommendation
from tuner.report.render import write_reports
from tuner.store.runfiles import CONFIRMATION_FILE, RunFiles, write_trials_table
from tuner.store.view import RunView


def publish(files: RunFiles, study: optuna.Study) -> dict[str, Any]:
    """Every report file of the run, from what is on disk (confirmation.json included);
    returns the recommendation JSON."""
    view = RunView.read(files, study)
    conf = view.confirmation()
    if conf is None:
        raise TuneError(f"{files.root} has no {CONFIRMATION_FILE}; run `tune report` on it")
    write_trials_table(view.trials, files)
    rec = build_recommendation(view, conf)
    if imp := importance(study):
        rec["importance"] = imp
    write_reports(rec, report_figures(rec, view.trials), files)
    return rec
