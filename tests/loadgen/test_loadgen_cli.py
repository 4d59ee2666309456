"""The `loadgen` command end to end against a scripted server in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from loadgen.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server_url():
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen.scripted_server", *("--port", "0"), *("--itl-ms", "1")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield line.split()[-1]
    proc.terminate()
    proc.wait(timeout=10)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_vllm_keys_slo_verdict_and_margins(server_url, capsys, tmp_path):
    code, out, _ = _run(
        capsys,
        *("--url", server_url, "--workload", "random", "--input-len", "64", "--output-len", "8"),
        *("--num-requests", "12", "--rate", "200", "--warmup", "2", "--seed", "3"),
        *("--slo", "tpot_p99=500ms,ttft_p99=2s", "--json", "--out", str(tmp_path / "run")),
    )
    assert code == 0
    result = json.loads(out)
    for key in ("completed", "failed", "duration", "request_throughput", "output_throughput"):
        assert key in result
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p99"):
            assert isinstance(result[f"{stat}_{metric}_ms"], float)
    assert (result["completed"], result["failed"], result["num_prompts"]) == (12, 0, 12)
    assert result["total_output_tokens"] == 12 * 8
    assert result["slo_met"] is True
    assert 0 < result["slo_margin_tpot_p99"] <= 1
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert result["model_id"] == "scripted" and result["backend"] == "openai"
    # --out: the same object, plus every request (warm-up included) readable by pandas.
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == result
    df = pd.read_json(tmp_path / "run" / "records.jsonl", lines=True)
    assert len(df) == 14 and df["warmup"].sum() == 2
    assert df.loc[~df["warmup"], "ttft_ms"].between(5, 2000).all()


def test_tables_show_metrics_classes_and_the_verdict(server_url, capsys):
    code, out, _ = _run(
        capsys,
        *("--url", server_url, "--workload", "mixed", "--num-requests", "10", "--rate", "100"),
        *("--max-model-len", "1024", "--slo", "itl_p99=1ms"),
    )
    assert code == 0
    assert "TTFT" in out and "per class" in out
    assert "SLO itl_p99=1ms: not met" in out


def test_trace_slice_replays_with_its_own_timing(server_url, capsys):
    code, out, _ = _run(
        capsys,
        *("--url", server_url, "--workload", "trace", "--slice", "0:6", "--time-scale", "0.01"),
        *("--max-model-len", "512", "--json"),
    )
    result = json.loads(out)
    assert code == 0 and result["completed"] == 6
    assert result["arrival"] == "trace" and result["request_rate"] == "trace"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--slo", "tpot_p98=30ms"], "unknown statistic 'p98'"),
        (["--slice", "9:3"], "--slice '9:3'"),
        (["--num-requests", "0"], "--num-requests 0"),
        (["--arrival", "trace", "--workload", "chat"], "trace arrivals need"),
        (["--rate", "-1"], "rate=-1.0"),
        (["--out", ""], "--out '' is empty"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(server_url, capsys, argv, named):
    code, out, err = _run(capsys, "--url", server_url, "--num-requests", "3", *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and named in err and err.count("\n") == 1


def test_unreachable_server_and_bad_flags(capsys, unused_tcp_port):
    code, _, err = _run(capsys, "--url", f"http://127.0.0.1:{unused_tcp_port}")
    assert code == 2 and err.startswith("error: cannot reach") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main(["--url", "http://x:1", "--workload", "poetry"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    code, _, err = _run(capsys, "--builtin", "--workers", "2")
    assert code == 2 and "--workers needs --url" in err


def test_builtin_engine_with_knobs(capsys):
    code, out, _ = _run(
        capsys,
        *("--builtin", "--workload", "random", "--input-len", "40", "--output-len", "3"),
        *("--num-requests", "4", "--max-model-len", "256", "--num-gpu-blocks-override", "64"),
        *("--max-num-batched-tokens", "32", "--max-num-seqs", "4", "--device", "cpu"),
        *("--json", "--no-progress"),
    )
    assert code == 0
    result = json.loads(out)
    assert result["backend"] == "engine-lite-inprocess" and result["model_id"] == "tiny"
    assert result["completed"] == 4 and result["total_output_tokens"] == 12
    code, _, err = _run(
        capsys,
        "--builtin",
        "--max-num-batched-tokens",
        "8",
        "--max-num-seqs",
        "16",
        "--device",
        "cpu",
    )
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: --max-num-batched-tokens=8 is smaller than --max-num-seqs")


def test_a_fresh_process_prints_one_error_line_and_exits_2():
    code = "from loadgen.cli import main; raise SystemExit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--url", "http://127.0.0.1:1", "--slo", "ttft=1s"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: SLO term 'ttft=1s'") and proc.stdout == ""


def test_a_fresh_process_against_a_dead_url_prints_exactly_one_line(unused_tcp_port):
    code = "from loadgen.cli import main; raise SystemExit(main())"
    url = f"http://127.0.0.1:{unused_tcp_port}"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: cannot reach {url}") and proc.stderr.count("\n") == 1


def _fresh_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """The `loadgen` command in its own interpreter, bounded in time."""
    code = "from loadgen.cli import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("slo", ["", "   "])
def test_an_empty_slo_is_an_error_not_no_slo(server_url, slo):
    proc = _fresh_process("--url", server_url, "--num-requests", "2", "--slo", slo)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: SLO ") and "is empty" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_an_unwritable_out_fails_before_measuring(server_url, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out in (blocker / "sub", blocker):
        proc = _fresh_process("--url", server_url, "--num-requests", "2", "--out", str(out))
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"error: --out '{out}' is not writable")
        assert proc.stderr.count("\n") == 1
    taken = tmp_path / "run"
    (taken / "result.json").mkdir(parents=True)
    proc = _fresh_process("--url", server_url, "--num-requests", "2", "--out", str(taken))
    assert proc.returncode == 2 and "is not writable" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_fails_before_measuring(server_url, tmp_path):
    out = tmp_path / "ro"
    out.mkdir(mode=0o555)
    proc = _fresh_process("--url", server_url, "--num-requests", "2", "--out", str(out))
    assert proc.returncode == 2 and "is not writable (Permission denied" in proc.stderr


def test_a_corrupt_trace_timestamp_fails_at_once_instead_of_hanging(server_url, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp_s": 0, "input_len": 5, "output_len": 2}\n'
        '{"timestamp_s": 1e300, "input_len": 5, "output_len": 2}\n'
    )
    proc = _fresh_process("--url", server_url, "--workload", "trace", "--trace-file", str(trace))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: t.jsonl:2 is 1e+300 s after the first row")


def test_long_trace_rows_are_counted_and_on_long_is_honoured(server_url, tmp_path):
    trace = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": 10 * i, "input_length": 900 if i else 300, "output_length": 4}
        for i in range(3)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ("--url", server_url, "--workload", "trace", "--trace-file", str(trace))
    base += ("--max-model-len", "512", "--json")
    proc = _fresh_process(*base)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("loadgen: 2 of 3 trace rows are longer than max_model_len 512")
    result = json.loads(proc.stdout)
    assert result["completed"] == 3 and "had their prompts cut" in result["workload_notes"][0]
    proc = _fresh_process(*base, "--on-long", "skip")
    assert proc.returncode == 0 and json.loads(proc.stdout)["completed"] == 1
    proc = _fresh_process(*base, "--on-long", "error")
    assert proc.returncode == 2 and proc.stderr.startswith("error: mc.jsonl:2 has prompt 900")
