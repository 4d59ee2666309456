"""`tune` end to end on the real engine, loadgen and slo: kill, resume, report, goodput mode."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from tuner.cli import main
from tuner.search.study import storage_url

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Small and fast: 8 mixed requests per level, few levels, a coarse bisection.
FAST = ["--num-requests", "8", "--start-rate", "4", "--max-levels", "3",
        "--rate-tolerance", "0.5", "--startup-trials", "2"]  # fmt: skip


def finished(run_dir: Path) -> tuple[list, list]:
    study = optuna.load_study(study_name="tune-mixed", storage=f"sqlite:///{run_dir}/study.db")
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return done, trials


@pytest.mark.slow
def test_a_killed_run_resumes_without_losing_a_trial_and_reports(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # A search on the target alone (the simulator's screening ends sooner than a kill can land).
    # On the CPU the default is 2048 and the rule of thumb 4096; 8192 is the range's other end.
    args = ["--slo", "tpot_p99=30ms", "--trials", "4", "--time-budget", "5m",
            "--param", "max_num_batched_tokens=2048..8192", "--run-dir", str(run_dir),
            "--fidelity", "real", "--quiet", *FAST]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            # run.json is written once the study exists: reading the study before that would
            # race its creation (both would set up the same fresh SQLite schema).
            if (run_dir / "run.json").exists():
                try:
                    done, trials = finished(run_dir)
                except (KeyError, sqlalchemy.exc.OperationalError):
                    continue  # the study is being created or written right now
                if len(done) >= 2 and any(t.state is TrialState.RUNNING for t in trials):
                    break
            time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)  # no chance to clean up
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    before, trials = finished(run_dir)
    cut = [t for t in trials if t.state is TrialState.RUNNING]
    assert len(before) >= 2 and len(cut) == 1

    assert main(["--resume", str(run_dir), "--json", "--trials", "4", "--time-budget", "5m"]) == 0
    rec = json.loads(capsys.readouterr().out)

    after, trials = finished(run_dir)
    assert len(after) == 4
    # Every trial finished before the kill is still there with the same outcome.
    for old in before:
        new = trials[old.number]
        assert (new.state, new.value, new.params) == (old.state, old.value, old.params)
    # The cut-off trial failed and its config was measured again.
    failed = trials[cut[0].number]
    assert failed.state is TrialState.FAIL
    assert any(t.params == cut[0].params and t.number > cut[0].number for t in after)

    assert {"slo", "workload", "best", "default", "ratio_vs_default", "flags", "trials"} <= set(rec)
    assert rec["slo"] == "tpot_p99=30ms" and rec["workload"]["name"] == "mixed"
    for key in ("best", "default"):
        assert set(rec[key]) >= {"config", "capacity_rps"}
        assert rec[key]["config"]["max_num_batched_tokens"] > 0
    # The default is the engine's own, as it declared it.
    assert rec["default"]["config"] == rec["target"]["default_config"]
    # On this CPU that is vLLM 0.32's CPU row (2048 / 128), and the report says so.
    assert rec["target"]["default_source"].startswith("vLLM 0.32's CPU default")
    assert rec["default"]["config"]["max_num_batched_tokens"] == 2048
    assert rec["default"]["config"]["max_num_seqs"] == 128
    if rec["default"]["capacity_rps"]:
        ratio = rec["best"]["capacity_rps"] / rec["default"]["capacity_rps"]
        assert math.isclose(rec["ratio_vs_default"], ratio)
    # The flags are the recommendation's, or the default's when the default held the SLO at the
    # recommendation's rate too (then the difference is within noise and nothing should change).
    kept = rec["headline"]["basis"] in ("within_noise", "default_best")
    assert kept == rec["summary"].startswith("keep the vLLM default")
    flagged = rec["default" if kept else "best"]["config"]["max_num_batched_tokens"]
    # `recommended` is what the summary says to run, whichever it is.
    assert rec["recommended"] == rec["default" if kept else "best"]
    assert f"--max-num-batched-tokens {flagged}" in rec["flags"]["vllm"]
    assert "--chunked-prefill-size" in rec["flags"]["sglang"]
    assert rec["flags"]["sglang_tested"] is False  # a translation, marked as such
    # Every trial is listed, the one the kill cut off too (failed, and measured again).
    assert [t["state"] for t in rec["trials"]].count("fail") == 1
    assert len([t for t in rec["trials"] if t["state"] != "fail"]) == 4
    # The default, measured at the recommendation's rate, unless it is the recommendation.
    same = rec["default_at_recommended_rate"]
    if rec["best"]["config"] != rec["default"]["config"]:
        assert same["rate_rps"] == rec["best"]["rate_rps"]
        assert (run_dir / "records_default_at_recommended_rate.jsonl").stat().st_size > 0
        # A miss is claimed only when the default missed on most draws alone (the headline's
        # rule); a pooled miss sunk by one draw's tail reads as within noise.
        if rec["headline"]["basis"] == "same_traffic":
            assert not same["default"]["meets_slo"]
            assert "at that rate the default misses the SLO" in rec["summary"]
        elif not same["default"]["meets_slo"]:
            assert kept and 2 * same["default"]["draws_missed"] <= same["default"]["draws"]

    html = (run_dir / "recommendation.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<script" not in html
    assert "--max-num-batched-tokens" in (run_dir / "recommendation.md").read_text()
    for name in ("trials.csv", "records_recommended.jsonl", "records_default.jsonl"):
        assert (run_dir / name).stat().st_size > 0
    table = (run_dir / "trials.csv").read_text().splitlines()
    assert len(table) - 1 >= sum(t["levels"] for t in rec["trials"])

    # `tune report` rebuilds the same recommendation from the folder alone.
    assert main(["report", str(run_dir), "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert rebuilt["best"] == rec["best"] and rebuilt["summary"] == rec["summary"]


def test_goodput_at_a_fixed_rate_reports_an_infeasible_slo_with_the_closest_config(
    tmp_path, capsys
):
    run_dir = tmp_path / "run"
    code = main(["--slo", "tpot_p99=0.01ms", "--rate", "6", "--trials", "2", "--repeats", "0",
                 "--run-dir", str(run_dir), "--json", *FAST])  # fmt: skip
    assert code == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["objective"]["mode"] == "goodput" and rec["objective"]["rate_rps"] == 6
    assert rec["feasible"] is False and rec["best"] is None and rec["flags"] is None
    assert rec["summary"].startswith("no config meets tpot_p99=0.01ms; the closest is trial")
    closest = rec["closest"]
    assert closest["metric"] == "tpot_p99" and closest["term"] == "tpot_p99=0.01ms"
    assert closest["value_ms"] > closest["limit_ms"] == pytest.approx(0.01)
    study = optuna.load_study(study_name="tune-mixed", storage=f"sqlite:///{run_dir}/study.db")
    # The SLO terms reached Optuna as constraints, all violated.
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == 2 and all(t.user_attrs["constraints"][0] > 0 for t in done)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--slo", "tpot_p99=fast"], "--slo"),
        (["--slo", "tpot_p99=30ms", "--param", "budget=1..2"], "unknown knob 'budget'"),
        (["--slo", "tpot_p99=30ms", "--time-budget", "soon"], "--time-budget 'soon'"),
        (["--slo", "tpot_p99=30ms", "--sampler", "tpe", "--repeats", "-1"], "--repeats -1"),
        (
            ["--slo", "tpot_p99=30ms", "--launch", "serve {nope}", "--served-model", "m"],
            "unknown placeholder {nope}",
        ),
        (["--resume", "/nonexistent/run"], "no run.json"),
        (
            [
                "--slo",
                "tpot_p99=30ms",
                "--url",
                "http://127.0.0.1:9",
                "--served-model",
                "m",
                "--quiet",
            ],
            "cannot reach http://127.0.0.1:9",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_value(argv, named, capsys, tmp_path):
    run_dir = [] if "--resume" in argv else ["--run-dir", str(tmp_path / "r")]
    assert main([*argv, *run_dir]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and named in err and "\n" not in err


@pytest.mark.slow
def test_two_workers_share_one_journal_study(tmp_path):
    journal = tmp_path / "shared.journal"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def worker(name: str) -> subprocess.Popen:
        args = ["--slo", "tpot_p99=30ms", "--trials", "5", "--storage", str(journal),
                "--study-name", "shared", "--run-dir", str(tmp_path / name), "--quiet",
                "--param", "max_num_batched_tokens=2048..8192", *FAST]  # fmt: skip
        cmd = [sys.executable, "-m", "tuner.cli", *args]
        out = subprocess.DEVNULL
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.PIPE)

    # Started together: the one that creates the study queues the references, the other joins.
    first, second = worker("a"), worker("b")
    for proc in (first, second):
        assert proc.wait(timeout=240) == 0, proc.stderr.read().decode()
    study = optuna.load_study(study_name="shared", storage=storage_url(str(journal), tmp_path))
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) >= 5
    assert len({t.user_attrs["worker"] for t in done}) == 2  # both measured trials
    roles = [t.user_attrs["role"] for t in study.trials]
    assert roles.count("default") == 1 and roles.count("rule_of_thumb") == 1
    # One worker confirmed; both wrote the same report.
    reports = [json.loads((tmp_path / name / "recommendation.json").read_text()) for name in "ab"]
    assert reports[0]["best"] and reports[0] == reports[1]


def test_the_simulator_screens_and_every_recommended_figure_is_measured(tmp_path, capsys):
    """--fidelity sim (the default) on the real engine: many configs screened in virtual time,
    a few verified for real, and the report's best is one of the measured trials."""
    run_dir = tmp_path / "run"
    code = main(["--slo", "tpot_p99=30ms", "--trials", "2", "--repeats", "0", "--time-budget",
                 "5m", "--robust", "--run-dir", str(run_dir), "--json", *FAST])  # fmt: skip
    assert code == 0
    rec = json.loads(capsys.readouterr().out)
    sim = rec["sim"]
    roles = [(t["role"], t["state"]) for t in rec["trials"]]
    # --trials counts the verified configs: the default and one verified, not a second.
    assert len([t for t in rec["trials"] if t["state"] != "fail"]) <= 2, roles
    assert sim["configs_screened"] >= 20 and sim["configs_verified"] >= 1, (roles, sim)
    assert sim["max_error"] >= 0 and sim["error_bound"] > 0
    # The run fell back only if even the simulator's best pick missed its promised gain.
    assert sim["min_gain_error"] <= sim["max_gain_error"]
    assert sim["fell_back"] == (sim["min_gain_error"] > sim["error_bound"])
    for verified in sim["verified"]:
        assert verified["simulated_rps"] > 0 and verified["capacity_err"] >= 0
    # A prefill chunk's cost was measured on the engine, not left to the fit.
    probe = sim["chunk_probe"]
    assert probe["chunk_ms"] > 0 and "measured apart" in sim["model_source"]
    assert probe["step_ms"]["512/16"] > probe["step_ms"]["512/1"]
    # Fitted on the burst and a small-budget level first, the simulator placed the default:
    # its search started a tolerance step above its simulated capacity, not at --start-rate.
    done, _ = finished(run_dir)
    default = next(t for t in done if t.user_attrs["role"] == "default")
    hint, first = default.user_attrs["start_hint_rps"], default.user_attrs["level_000"]
    assert hint > 0 and first["rate_rps"] == pytest.approx(hint * 1.5)  # --rate-tolerance 0.5
    assert rec["engine"]["name"] == "engine_lite" and rec["vllm_starts"] is None
    assert rec["elapsed_s"] > 0
    # Where the time went, phase by phase, adds up to it; the verification of a screened
    # config is told apart from the default's search.
    phases = rec["phases_s"]
    assert sum(phases.values()) == pytest.approx(rec["elapsed_s"], rel=1e-6), phases
    assert {
        "starting",
        "measuring on the target: default",
        "screening the space in virtual time",
    } <= set(phases), phases
    if sim["configs_verified"]:
        assert phases["measuring on the target: screened"] > 0, phases
    if rec["best"] is not None:
        measured = {t["trial"] for t in rec["trials"] if t["state"] == "complete"}
        assert rec["best"]["trial"] in measured
    # Screening measures only the default: the table's config (4096 for `mixed`) is reported as
    # not measured, with its capacity in virtual time, never with the default's figure.
    thumb = rec["rule_of_thumb"]
    if "rule_of_thumb" in {t["role"] for t in rec["trials"]}:  # a fall-back measured it
        assert thumb["measured"] and thumb["capacity_rps"] is not None
    else:
        assert thumb["measured"] is False and thumb["capacity_rps"] is None
        assert thumb["config"]["max_num_batched_tokens"] == 4096 and thumb["simulated_rps"] > 0
        assert rec["ratio_vs_rule_of_thumb"] is None
        md = (run_dir / "recommendation.md").read_text()
        assert "was not measured in this run" in md and "as vLLM's default here" not in md
    # The top configs and the default across the traffic band: 3 long-prompt fractions x 3
    # burstiness shapes, each cell a capacity; --robust chose by the worst cell.
    band = rec["robustness"]
    assert band["chosen_by"].startswith("best worst case") and band["configs"]
    for config in band["configs"]:
        cells = config["cells"]
        assert len(cells) == 9 and config["worst_rps"] == min(c["capacity_rps"] for c in cells)
        fractions = sorted({round(c["long_fraction"], 6) for c in cells})
        assert len(fractions) == 3 and fractions[0] < band["long_fraction"] < fractions[-1]
    worst = {c["trial"]: c["worst_rps"] for c in band["configs"]}
    clearing = [c["trial"] for c in rec["top"] if c["clears"] and c["trial"] in worst]
    if rec["best"] is not None and clearing:
        assert worst[rec["best"]["trial"]] == max(worst[t] for t in clearing)
