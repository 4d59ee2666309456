"""`tune bench --mode sim` end to end on the real scheduler and the committed profile: exact
repeats, a perturbed scheduler caught, bad profiles and foreign baselines refused in one line."""

import json
import shutil
from pathlib import Path

import pytest

from engine_lite.scheduler import Scheduler
from tuner.bench.cli import EXIT_CANNOT_RUN, EXIT_OK, EXIT_REGRESSION, main
from tuner.bench.sim import load_profile
from tuner.bench.stats import Verdict, compare_exact
from tuner.bench.suite import load_suite

BASELINES = Path(__file__).resolve().parents[3] / "results" / "baselines"
PROFILE = BASELINES / "cpu-tiny.profile.json"

SUITE = """
name = "unit-sim"
mode = "sim"
figures = ["capacity_rps", "saturation_rps", "ttft_p99_ms", "tpot_p99_ms"]

[target]
profile = "{profile}"

[workload]
name = "mixed"
num_requests = 40
seed = 0

[measure]
slo = "tpot_p99=25ms,ttft_p99=2s"
rate_rps = 5.0

[[config]]
name = "default"

[[config]]
name = "budget-256"
max_num_batched_tokens = 256
"""


def _suite(folder: Path, profile: str = "cpu-tiny.profile.json") -> str:
    path = folder / f"suite-{Path(profile).stem}.toml"
    path.write_text(SUITE.format(profile=profile))
    return str(path)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The profile next to a suite naming it by a relative path, and a baseline recorded once."""
    tmp = tmp_path_factory.mktemp("sim")
    shutil.copy(PROFILE, tmp / PROFILE.name)
    baseline = tmp / "baseline.json"
    assert main(["--suite", _suite(tmp), "--baseline", str(baseline), "--update-baseline"]) == 0
    return tmp, baseline


def _run_json(capsys, *argv: str) -> tuple[int, dict, str]:
    """Exit code, the JSON result (stdout) and the table (stderr)."""
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_two_runs_give_identical_figures_and_pass(recorded, capsys):
    tmp, baseline = recorded
    args = ("--suite", _suite(tmp), "--baseline", str(baseline))
    (code1, first, _), (code2, second, _) = _run_json(capsys, *args), _run_json(capsys, *args)
    assert code1 == code2 == EXIT_OK
    recorded_configs = json.loads(baseline.read_text())["configs"]
    assert first["configs"] == second["configs"] == recorded_configs
    assert all(len(v) == 1 for c in first["configs"].values() for v in c["samples"].values())
    assert {r["comparison"]["change_frac"] for r in first["rows"]} == {0.0}
    env = first["environment"]
    assert (env["mode"], env["device"], env["profile"]) == ("sim", "sim:cpu", PROFILE.name)


def test_a_scheduler_with_a_5pct_smaller_budget_fails_naming_config_and_figure(
    recorded, capsys, monkeypatch
):
    tmp, baseline = recorded
    init = Scheduler.__init__

    def smaller_budget(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.token_budget = int(self.token_budget * 0.95)

    monkeypatch.setattr(Scheduler, "__init__", smaller_budget)
    monkeypatch.setenv("COLUMNS", "400")  # the summary line unwrapped
    code, result, table = _run_json(capsys, "--suite", _suite(tmp), "--baseline", str(baseline))
    assert code == EXIT_REGRESSION
    bad = [f"{r['config']}/{r['figure']}" for r in result["rows"]
           if r["comparison"]["verdict"] == "regression"]  # fmt: skip
    assert bad
    summary = table.strip().splitlines()[-1]
    assert "regression(s)" in summary and all(name in summary for name in bad)


def _one_error_line(capsys) -> str:
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.startswith("error:"), out
    return out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot be read"),
        ("{not json", "is not JSON"),
        ('{"format": "something else"}', "not a profile"),
        ("drop-coefficient", "malformed"),
    ],
)
def test_a_missing_or_malformed_profile_is_one_line(tmp_path, capsys, monkeypatch, content, needle):
    monkeypatch.setenv("COLUMNS", "400")
    name = "broken.profile.json"
    if content == "drop-coefficient":
        doc = json.loads(PROFILE.read_text())
        del doc["cost_model"]["coefficients"]["prefill_tokens"]
        content = json.dumps(doc)
    if content is not None:
        (tmp_path / name).write_text(content)
    suite = _suite(tmp_path, name)
    code = main(["--suite", suite, "--baseline", str(tmp_path / "b.json"), "--update-baseline"])
    assert code == EXIT_CANNOT_RUN
    out = _one_error_line(capsys)
    assert needle in out and name in out


def test_a_sim_suite_without_a_profile_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace('profile = "{profile}"', 'model = "tiny"'))
    code = main(["--suite", str(suite), "--baseline", str(tmp_path / "b.json")])
    assert code == EXIT_CANNOT_RUN
    assert "profile" in _one_error_line(capsys)


@pytest.mark.parametrize(("rename", "edit", "differs"), [
    (False, True, "profile_hash: baseline"), (True, False, "profile: baseline")
])  # fmt: skip
def test_a_baseline_from_another_profile_is_refused(
    recorded, tmp_path, capsys, monkeypatch, rename, edit, differs
):
    _, baseline = recorded
    monkeypatch.setenv("COLUMNS", "400")
    doc = json.loads(PROFILE.read_text())
    if edit:
        doc["cost_model"]["coefficients"]["step"] *= 1.01
    name = "other.profile.json" if rename else PROFILE.name
    (tmp_path / name).write_text(json.dumps(doc))
    code = main(["--suite", _suite(tmp_path, name), "--baseline", str(baseline)])
    assert code == EXIT_CANNOT_RUN
    out = _one_error_line(capsys)
    assert "another environment" in out and differs in out
    assert ("profile_hash" in out) == edit and ("profile: baseline" in out) == rename


def test_sim_mode_refuses_flags_about_noise_or_servers(recorded, capsys, monkeypatch):
    tmp, baseline = recorded
    monkeypatch.setenv("COLUMNS", "400")
    code = main(["--suite", _suite(tmp), "--baseline", str(baseline), "--repeats", "3"])
    assert code == EXIT_CANNOT_RUN
    assert "--repeats" in _one_error_line(capsys)


def test_the_committed_sim_suite_reads_its_profile():
    suite = load_suite(BASELINES / "cpu-tiny-sim.toml")
    sim = load_profile(suite)
    assert sim.path.name == PROFILE.name and sim.profile.model == "tiny"
    recorded = json.loads((BASELINES / "cpu-tiny-sim.json").read_text())["environment"]
    assert (recorded["profile"], recorded["profile_hash"]) == (PROFILE.name, sim.content_hash)


@pytest.mark.parametrize(
    ("base", "now", "higher_is_better", "verdict"),
    [
        (10.0, 10.0, True, Verdict.OK),
        (10.0, 10.0 * (1 + 1e-12), False, Verdict.OK),  # float rounding is forgiven
        (10.0, 10.0 * (1 + 1e-6), False, Verdict.REGRESSION),  # no noise floor: a latency up
        (10.0, 10.0 * (1 - 1e-6), True, Verdict.REGRESSION),  # a throughput down
        (10.0, 9.0, False, Verdict.IMPROVEMENT),
        (0.0, 0.0, True, Verdict.OK),
        (5.0, 0.0, True, Verdict.REGRESSION),  # nothing met the SLO any more
        (float("nan"), float("nan"), False, Verdict.OK),
        (float("nan"), 3.0, False, Verdict.REGRESSION),  # a figure that appeared or vanished
    ],
)
def test_exact_comparison(base, now, higher_is_better, verdict):
    c = compare_exact("f", base, now, higher_is_better=higher_is_better, tolerance=1e-9)
    assert c.verdict is verdict
