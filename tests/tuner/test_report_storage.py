"""`tune report --storage URL --study-name NAME`: a shared study's report from any folder, the
same JSON its workers printed; and, when no worker got to confirm, the search's."""

from __future__ import annotations

import json

import optuna

from tuner.report.publish import UNCONFIRMED, report_main
from tuner.run import run_tune
from tuner.settings import TuneSettings


def settings(tmp_path, url: str) -> TuneSettings:
    return TuneSettings(slo="tpot_p99=30ms", num_requests=40, level_s=1.0, trials=6,
                        time_budget_s=600.0, top_k=1, run_dir=str(tmp_path / "worker"),
                        storage=url, study_name="shared")  # fmt: skip


async def test_any_folder_gets_the_report_the_workers_printed(tmp_path, sim_target, fake_clock,
                                                              capsys):  # fmt: skip
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    rec = await run_tune(settings(tmp_path, url), quiet=True, clock=fake_clock, target=sim_target)
    argv = [str(tmp_path / "elsewhere"), "--storage", url, "--study-name", "shared", "--json"]
    assert report_main(argv) == 0
    assert json.loads(capsys.readouterr().out) == rec
    assert (tmp_path / "elsewhere" / "recommendation.html").exists()
    assert rec["workers"][0]["confirmed_and_reported"] and rec["run_dir"].endswith("worker")


async def test_a_study_nobody_confirmed_reports_its_search(tmp_path, sim_target, fake_clock,
                                                           capsys):  # fmt: skip
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    rec = await run_tune(settings(tmp_path, url), quiet=True, clock=fake_clock, target=sim_target)
    optuna.delete_study(study_name="shared:confirmation", storage=url)  # as if every worker died
    argv = [str(tmp_path / "elsewhere"), "--storage", url, "--study-name", "shared", "--json"]
    assert report_main(argv) == 0
    searched = json.loads(capsys.readouterr().out)
    assert searched["search"]["stopped_by"] == UNCONFIRMED
    assert searched["best"]["config"] == rec["best"]["config"]
    assert searched["trials"] == rec["trials"]
