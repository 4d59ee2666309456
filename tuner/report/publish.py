"""Write a run's report from its folder and study (the trials table, the recommendation JSON,
its figures, Markdown and HTML): `tune` ends here, and `tune report RUN_DIR` rebuilds it, with
the intervals from the records on disk when the run ended before its confirmation."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from loadgen.stop import measured_part
from tuner.errors import TuneError
from tuner.report.plots import importance, report_figures
from tuner.report.recommendation import build_recommendation
from tuner.report.render import write_reports
from tuner.report.summary import print_summary
from tuner.search.choice import choose
from tuner.search.claim import StoredReport, latest_report, load_jobs
from tuner.search.confirm import build_candidate, candidate_rate, search_candidate
from tuner.search.storage import masked, open_storage
from tuner.search.study import load_study, top_trials
from tuner.store import attrs
from tuner.store.codec import confirmation_from_json, confirmation_json
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
UNCONFIRMED = ("not confirmed: the study's workers stopped before confirming; figures from "
               "the search, with intervals where this folder holds the records")  # fmt: skip


def publish(
    files: RunFiles, study: optuna.Study, stored: StoredReport | None = None
) -> dict[str, Any]:
    """Every report file of the run, into `files`; returns the recommendation JSON. Built from
    the study and the confirmation its confirming worker stored there, so every worker (and
    `tune report` on any machine) writes the same; without one, from confirmation.json."""
    view = RunView.read(files, study, stored.run_info if stored else None)
    if stored is not None:
        conf = confirmation_from_json(stored.confirmation, view.slo, view.rules)
    else:
        conf = view.confirmation()
    if conf is None:
        raise TuneError(f"{files.root} has no {CONFIRMATION_FILE}; run `tune report` on it")
    write_trials_table(view.trials, files)
    _keep_records(view, conf)
    rec = build_recommendation(view, conf, workers_json(view, attrs.workers(study), stored))
    if imp := importance(study):
        rec["importance"] = imp
    write_reports(rec, report_figures(rec, view.trials), files)
    return rec


def workers_json(view: RunView, registry: dict[str, dict[str, Any]],
                 stored: StoredReport | None) -> list[dict[str, Any]]:  # fmt: skip
    """Who did what: set the study up, measured which trials, confirmed and reported."""
    measured: dict[str, list[int]] = {}
    for t in view.trials:
        if t.worker and t.state is not TrialState.WAITING:
            measured.setdefault(t.worker, []).append(t.number)
    confirmer = stored.worker if stored else None
    names = sorted(set(registry) | set(measured) | ({confirmer} if confirmer else set()))
    return [{"worker": name, "joined": registry.get(name, {}).get("role"),
             "trials": measured.get(name, []), "confirmed_and_reported": name == confirmer}
            for name in names]  # fmt: skip


def _keep_records(view: RunView, conf: Confirmation) -> None:
    """The recommended config's requests at its confirmed rate, and the default's at its
    capacity (its first level if it never passed), beside the report."""
    files = view.files
    if (chosen := conf.chosen) is not None:
        trial, rate = view.trial(chosen.trial), chosen.verdict.rate_rps
        runs = files.search_runs(trial) + files.confirm_runs(trial.number)
        records = [r for run in runs if run.rate_rps == rate for r in run.records]
        if records:  # none here when another worker measured and confirmed it
            files.write_records(files.root / RECOMMENDED_RECORDS, records)
    default = view.with_role(Role.DEFAULT)
    if default is not None and default.state is TrialState.COMPLETE and default.search_levels:
        at = [p for p in default.search_positions if p[2].rate_rps == default.capacity_rps]
        number, index, _ = (at or default.search_positions)[0]
        records = files.read_records(files.level_path(number, index))
        if records is not None:  # a level stopped early: what it measured (all stay beside it)
            files.write_records(files.root / DEFAULT_RECORDS, measured_part(records))


def open_run(run_dir: Path) -> tuple[RunFiles, optuna.Study, StoredReport | None]:
    """A run folder, its study (wherever its storage is) and the confirmation stored there."""
    files = RunFiles(run_dir)
    info = files.read_run_info()
    storage = open_storage(info["settings"].get("storage"), files.root, None).storage
    study = load_study(info["study_name"], storage)
    return files, study, stored_report(storage, info["study_name"])


def report_lost_server(files: RunFiles, study: optuna.Study, lost: ServerLost) -> TuneError:
    """Report what was measured before the server was lost (as `tune report` would), and the
    one-line error the run ends with."""
    view = RunView.read(files, study)
    levels = sum(len(t.levels) for t in view.trials)
    if levels == 0:
        return TuneError(str(lost))
    conf = rebuild_confirmation(view, note=f"the server was lost: {lost}")
    files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    publish(files, study)
    measured = "1 load level" if levels == 1 else f"{levels} load levels"
    return TuneError(
        f"the server stopped answering: {lost}; what was measured ({measured}) is reported in "
        f"{files.root / 'recommendation.html'}; tune --resume {files.root} goes on from there"
    )


def stored_report(storage: BaseStorage, study_name: str) -> StoredReport | None:
    jobs = load_jobs(storage, study_name)
    return latest_report(jobs) if jobs is not None else None


def open_shared(storage: str, study_name: str | None,
                out_dir: Path) -> tuple[RunFiles, optuna.Study, StoredReport]:  # fmt: skip
    """A study that workers shared, its stored report inputs, and a folder for the files."""
    if not study_name:
        raise TuneError("tune report --storage needs --study-name: the study the workers shared")
    opened = open_storage(storage, out_dir, None).storage
    try:
        study = optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        raise TuneError(f"there is no study {study_name!r} in {masked(storage)}; check "
                        "--study-name") from None  # fmt: skip
    files = RunFiles(out_dir)
    stored = stored_report(opened, study_name)
    if stored is None:  # every worker stopped before confirming: report on the search alone
        info = attrs.run_info(study)
        if info is None:
            raise TuneError(f"study {study_name!r} was not made by tune; check --study-name")
        conf = rebuild_confirmation(RunView.read(files, study, info), UNCONFIRMED)
        stored = StoredReport(info, confirmation_json(conf), "", -1)
    return files, study, stored


def rebuild_confirmation(view: RunView, note: str = REBUILT) -> Confirmation:
    """Intervals from the records on disk, for a run that ended before its confirmation; a
    top config whose records are not here (another worker measured it) by its search level."""
    settings = view.settings
    candidates = []
    for frozen in top_trials(view.study, settings.get("top_k", 3), view.mode):
        trial = view.trial(frozen.number)
        rate = candidate_rate(trial, view.mode, settings.get("rate_rps"))
        runs = view.files.search_runs(trial) + view.files.confirm_runs(trial.number)
        if any(run.rate_rps == rate for run in runs):
            candidates.append(build_candidate(trial, runs, rate, 0, view.slo, view.rules,
                                              view.mode, settings.get("seed", 0)))  # fmt: skip
        elif trial.search_levels:
            candidates.append(search_candidate(trial, rate))
    chosen = choose(candidates)
    return Confirmation(candidates, chosen.trial if chosen else None, None, note, None)


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune report", description=__doc__)
    parser.add_argument(
        "run_dir",
        nargs="?",
        help="a folder written by tune; with --storage, "
        "where to write the report (default results/STUDY_NAME)",
    )
    parser.add_argument("--storage", help="the storage URL of a study several workers shared")
    parser.add_argument("--study-name", help="with --storage: the study")
    parser.add_argument("--json", action="store_true", help="print the recommendation JSON")
    args = parser.parse_args(argv)
    if args.storage:
        out = Path(args.run_dir or Path("results") / str(args.study_name))
        files, study, stored = open_shared(args.storage, args.study_name, out)
        rec = publish(files, study, stored)
    elif args.run_dir:
        rec = report_folder(Path(args.run_dir))
    else:
        raise TuneError("tune report needs a run folder, or --storage URL --study-name NAME")
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        print_summary(rec)
    return 0


def report_folder(run_dir: Path) -> dict[str, Any]:
    """A run folder's report: from the confirmation stored in its study, else the folder's,
    else rebuilt from its records."""
    files, study, stored = open_run(run_dir)
    files.check_writable()  # the report is written beside the run
    if stored is None and files.read_json(CONFIRMATION_FILE) is None:
        conf = rebuild_confirmation(RunView.read(files, study))
        files.write_json(CONFIRMATION_FILE, confirmation_json(conf))
    return publish(files, study, stored)
