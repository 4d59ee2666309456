"""What `tune` says about its run folder: unwritable or damaged folders are one line (exit 2)
before anything is measured, a resume keeps the run's own settings, the folder is named."""

import json
import os

import pytest

from tuner.cli import build_parser, main, settings_from_args
from tuner.errors import TuneError
from tuner.run import run_tune
from tuner.settings import TuneSettings


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_a_run_dir_under_a_file_is_refused_before_anything_is_measured(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    run_dir = tmp_path / "file" / "run"
    assert main(["--slo", "tpot_p99=30ms", "--run-dir", str(run_dir)]) == 2
    err = one_error_line(capsys)
    assert err == (f"error: cannot write the run folder {run_dir} (Not a directory); pass a "
                   "--run-dir you can write to")  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_run_dir_is_refused_before_anything_is_measured(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    try:
        assert main(["--slo", "tpot_p99=30ms", "--run-dir", str(run_dir)]) == 2
    finally:
        run_dir.chmod(0o755)
    assert "(Permission denied); pass a --run-dir you can write to" in one_error_line(capsys)


def test_a_journal_storage_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    journal = tmp_path / "file" / "study.journal"
    argv = ["--slo", "tpot_p99=30ms", "--storage", str(journal), "--run-dir", str(tmp_path / "r"),
            "--url", "http://127.0.0.1:9", "--served-model", "m"]  # fmt: skip
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(f"error: --storage {journal}: cannot write there")


DAMAGED = [
    ("[]", "holds a JSON list, not an object"),
    ('"run"', "holds a JSON str, not an object"),
    ("{", "is not valid JSON"),
    ("{}", "has no 'settings' dict"),
    ('{"settings": [], "slo": "tpot_p99=30ms", "study_name": "s"}', "has no 'settings' dict"),
    ('{"settings": {}, "slo": 30, "study_name": "s"}', "has no 'slo' str"),
]


@pytest.mark.parametrize("command", ["resume", "report"])
@pytest.mark.parametrize(("content", "what"), DAMAGED)
def test_a_damaged_run_json_names_the_file_and_what_is_wrong(tmp_path, capsys, command, content,
                                                             what):  # fmt: skip
    (tmp_path / "run.json").write_text(content)
    argv = ["--resume", str(tmp_path)] if command == "resume" else ["report", str(tmp_path)]
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(f"error: {tmp_path / 'run.json'} {what}")


def test_run_json_settings_a_resume_cannot_run_are_named_with_the_file(tmp_path, capsys):
    settings = {"slo": "tpot_p99=30ms", "trials": "many"}
    info = {"settings": settings, "slo": "tpot_p99=30ms", "study_name": "tune-mixed"}
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert main(["--resume", str(tmp_path)]) == 2
    assert one_error_line(capsys) == (
        f"error: {tmp_path / 'run.json'} holds invalid settings "
        "(--trials 'many' is invalid; use a whole number >= 1)"
    )


def saved_run(tmp_path) -> str:
    saved = TuneSettings(slo="tpot_p99=30ms", trials=7, time_budget_s=120.0)
    info = {"settings": saved.to_json(), "slo": saved.slo, "study_name": "tune-mixed"}
    (tmp_path / "run.json").write_text(json.dumps(info))
    return str(tmp_path)


def test_a_resume_keeps_the_runs_budget_and_trials_unless_given_again(tmp_path):
    def resumed(*flags: str) -> TuneSettings:
        return settings_from_args(build_parser().parse_args(["--resume", run, *flags]))

    run = saved_run(tmp_path)
    assert (resumed().time_budget_s, resumed().trials) == (120.0, 7)  # not a fresh 9 minutes
    again = resumed("--time-budget", "1m", "--trials", "9")
    assert (again.time_budget_s, again.trials, again.run_dir) == (60.0, 9, run)


def test_a_resume_refuses_flags_that_would_change_the_run(tmp_path, capsys):
    run = saved_run(tmp_path)
    assert main(["--resume", run, "--workload", "chat"]) == 2
    assert one_error_line(capsys) == (
        "error: --workload cannot change on --resume: the run keeps the settings it was "
        "started with; only --trials and --time-budget may be given again"
    )


def test_a_resume_of_a_folder_without_a_run_says_so_before_any_flag(tmp_path, capsys):
    # Told about --slo first, a user would drop it and only then learn the folder is wrong.
    assert main(["--resume", str(tmp_path / "gone"), "--slo", "tpot_p99=20ms"]) == 2
    assert one_error_line(capsys) == (
        f"error: {tmp_path / 'gone'} has no run.json; pass the folder a tune run wrote"
    )


async def test_the_progress_names_the_run_folder_first(tmp_path, sim_target, fake_clock, capsys):
    settings = TuneSettings(slo="tpot_p99=30ms", num_requests=40, level_s=1.0, trials=3,
                            start_rps=4.0, top_k=1, run_dir=str(tmp_path / "run"),
                            storage=str(tmp_path / "study.journal"))  # fmt: skip
    await run_tune(settings, quiet=False, clock=fake_clock, target=sim_target)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith(f"] run folder: {tmp_path / 'run'}")


def test_against_vllm_levels_hold_more_requests_and_the_run_more_time():
    def parsed(*flags: str) -> TuneSettings:
        return settings_from_args(build_parser().parse_args(["--slo", "tpot_p99=30ms", *flags]))

    builtin, vllm = parsed(), parsed("--engine", "vllm", "--model", "/models/tiny")
    assert (builtin.resolved_min_requests(), builtin.time_budget_s) == (20, 540.0)
    # A p99 over 640 requests, not over the few dozen an 8 s level at a CPU rate holds; and
    # room in the request list for disjoint draws of such a level: the search's, two
    # re-measurements and two steps down.
    assert (vllm.resolved_min_requests(), vllm.time_budget_s) == (640, 1200.0)
    assert vllm.resolved_num_requests("cpu") == 3200
    given = parsed("--engine", "vllm", "--min-requests", "100", "--time-budget", "5m")
    assert (given.resolved_min_requests(), given.time_budget_s) == (100, 300.0)


def test_the_built_in_engine_aims_to_recommend_within_two_minutes_and_a_server_run_does_not(
    capsys,
):
    def parsed(*flags: str) -> TuneSettings:
        return settings_from_args(build_parser().parse_args(["--slo", "tpot_p99=30ms", *flags]))

    assert parsed().resolved_goal_s() == 120.0
    assert parsed("--goal", "3m").resolved_goal_s() == 180.0
    assert parsed("--goal", "0").resolved_goal_s() is None
    assert parsed("--engine", "vllm", "--model", "/models/tiny").resolved_goal_s() is None
    assert parsed("--url", "http://127.0.0.1:8000").resolved_goal_s() is None
    assert main(["--slo", "tpot_p99=30ms", "--goal", "soon"]) == 2
    assert one_error_line(capsys) == (
        "error: --goal 'soon' is not a duration; write e.g. 10m, 90s or 1h"
    )


def test_a_level_floor_below_one_request_is_one_line(capsys):
    assert main(["--slo", "tpot_p99=30ms", "--min-requests", "0"]) == 2
    assert one_error_line(capsys) == "error: --min-requests 0 is invalid; use a positive number"


def test_levels_draw_by_stratum_and_a_run_saved_before_resumes_with_its_stretches(tmp_path):
    def resumed() -> TuneSettings:
        return settings_from_args(build_parser().parse_args(["--resume", str(tmp_path)]))

    parsed = settings_from_args(build_parser().parse_args(["--slo", "tpot_p99=30ms"]))
    assert parsed.level_mix == "stratified"
    saved_run(tmp_path)
    assert resumed().level_mix == "stratified"
    info = json.loads((tmp_path / "run.json").read_text())
    del info["settings"]["level_mix"]  # as runs saved before the setting was
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert resumed().level_mix == "contiguous"


def test_an_unknown_level_mix_is_one_line():
    with pytest.raises(TuneError, match=r"^--level-mix 'random' is invalid; use stratified, "):
        TuneSettings(slo="tpot_p99=30ms", level_mix="random")
