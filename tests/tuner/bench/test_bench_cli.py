"""`tune bench` end to end on the real engine: record, compare, catch a slowdown, refuse misuse."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tuner.bench.cli import EXIT_CANNOT_RUN, EXIT_OK, EXIT_REGRESSION, main

SUITE = """
name = "unit"
mode = "{mode}"
reference = "base"
repeats = 3
tolerance = "{tolerance}"
figures = ["saturation_rps"]

[target]
model = "tiny"

[workload]
name = "random"
num_requests = 24
input_len = 64
output_len = 48
seed = 3

[measure]
slo = "tpot_p99=500ms"
rate_rps = 50.0

[[config]]
name = "base"

[[config]]
name = "candidate"
max_num_seqs = {candidate_seqs}
"""


def _suite(tmp_path, *, mode="ratio", tolerance="90%", candidate_seqs=64):
    path = tmp_path / f"suite-{mode}-{candidate_seqs}-{tolerance[:-1]}.toml"
    path.write_text(SUITE.format(mode=mode, tolerance=tolerance, candidate_seqs=candidate_seqs))
    return str(path)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A baseline recorded once for the module (ratio mode, candidate as fast as base)."""
    tmp = tmp_path_factory.mktemp("bench")
    suite = _suite(tmp)
    baseline = str(tmp / "baselines" / "unit.json")
    assert main(["--suite", suite, "--baseline", baseline, "--update-baseline"]) == EXIT_OK
    return tmp, baseline


def test_update_baseline_writes_samples_and_environment(recorded):
    _, baseline = recorded
    doc = json.loads(Path(baseline).read_text())
    assert doc["environment"]["model"] == "tiny"
    assert doc["environment"]["mode"] == "ratio"
    assert doc["configs"]["base"]["ratios"]["saturation_rps"] == [1.0, 1.0, 1.0]
    assert len(doc["configs"]["candidate"]["samples"]["saturation_rps"]) == 3
    assert all(v > 0 for v in doc["configs"]["base"]["samples"]["saturation_rps"])


def test_unchanged_tree_passes_and_writes_ci_reports(recorded, tmp_path):
    tmp, baseline = recorded
    md, junit = tmp_path / "summary.md", tmp_path / "bench.xml"
    code = main(
        [
            "--suite",
            _suite(tmp),
            "--baseline",
            baseline,
            "--markdown",
            str(md),
            "--junit",
            str(junit),
        ]
    )
    assert code == EXIT_OK
    assert "no regression" in md.read_text()
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert len(cases) == 2
    assert not ET.parse(junit).getroot().findall(".//failure")


@pytest.mark.slow
def test_a_real_slowdown_fails_the_job(recorded, tmp_path, capsys):
    tmp, baseline = recorded
    # One sequence at a time serialises every decode: 24 requests x 48 tokens in 1152 steps instead
    # of ~60, several times slower than batching, far beyond a 30% tolerance. (The unchanged-tree
    # tests use 90% so that a busy test machine cannot fail them; the benchmark measures 5%.)
    junit = tmp_path / "bench.xml"
    code = main(
        [
            "--suite",
            _suite(tmp, candidate_seqs=1, tolerance="30%"),
            "--baseline",
            baseline,
            "--junit",
            str(junit),
            "--json",
        ]
    )
    assert code == EXIT_REGRESSION
    result = json.loads(capsys.readouterr().out)
    assert result["regression"] is True
    bad = {
        (r["config"], r["figure"])
        for r in result["rows"]
        if r["comparison"] and r["comparison"]["verdict"] == "regression"
    }
    assert ("candidate", "saturation_rps") in bad
    assert ("base", "saturation_rps") not in bad  # the reference is the yardstick, not judged
    assert ET.parse(junit).getroot().findall(".//failure")


@pytest.mark.slow
def test_report_only_mode_never_fails_the_job(recorded):
    tmp, baseline = recorded
    suite = _suite(tmp, candidate_seqs=1, tolerance="30%")
    assert main(["--suite", suite, "--baseline", baseline, "--report-only"]) == EXIT_OK


def test_baseline_from_another_environment_is_refused(recorded, tmp_path, capsys):
    tmp, baseline = recorded
    doc = json.loads(Path(baseline).read_text())
    doc["environment"]["device"] = "cuda:NVIDIA H100 80GB HBM3"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    assert main(["--suite", _suite(tmp), "--baseline", str(other)]) == EXIT_CANNOT_RUN
    err = capsys.readouterr().out
    assert "another environment" in err and "H100" in err
    # Report-only (CI, on whatever machine it gets) prints its figures and says why it did
    # not compare them, and never fails the job.
    summary = tmp_path / "summary.md"
    code = main(["--suite", _suite(tmp), "--baseline", str(other), "--report-only",
                 "--markdown", str(summary)])  # fmt: skip
    assert code == EXIT_OK
    text = summary.read_text()
    assert "measured, not compared: the baseline was measured in another environment" in text
    assert "H100" in text and "| candidate | saturation_rps |" in text


def test_absolute_mode_against_ratio_baseline_is_refused(recorded, capsys):
    tmp, baseline = recorded
    code = main(["--suite", _suite(tmp, mode="absolute"), "--baseline", baseline])
    assert code == EXIT_CANNOT_RUN
    assert "mode" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("mode = 'fast'\n[[config]]\nname='a'\n[measure]\nslo='tpot_p99=1s'\nrate_rps=1", "mode"),
        ("[measure]\nslo='tpot_p99=1s'\nrate_rps=1", "[[config]]"),
        ("figures=['speed']\n[[config]]\nname='a'\n[measure]\nslo='x'\nrate_rps=1", "speed"),
        ("[[config]]\nname='a'\n[measure]\nslo='tpot_p99=1s'\nrate_rps=-2", "rate_rps"),
        ("not toml [", "TOML"),
    ],
)
def test_bad_suite_is_one_clear_line(tmp_path, capsys, text, needle):
    suite = tmp_path / "bad.toml"
    suite.write_text(text)
    code = main(
        ["--suite", str(suite), "--baseline", str(tmp_path / "b.json"), "--update-baseline"]
    )
    assert code == EXIT_CANNOT_RUN
    out = capsys.readouterr().out.strip()
    assert out.startswith("error:") and needle in out and "Traceback" not in out


def test_missing_baseline_says_how_to_record_one(tmp_path, capsys):
    code = main(["--suite", _suite(tmp_path), "--baseline", str(tmp_path / "none.json")])
    assert code == EXIT_CANNOT_RUN
    assert "--update-baseline" in capsys.readouterr().out
