"""`tune --launch`: a real `engine-lite serve` per trial, Prometheus pulls into the trial table."""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest

from tuner.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def prometheus(tmp_path):
    """A real Prometheus scraping 127.0.0.1:PORT every second, or None without the binary."""
    if shutil.which("prometheus") is None:
        yield None, free_port()
        return
    server_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tune\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server_port}']\n"
    )
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url, server_port
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.slow
def test_launch_starts_a_server_per_trial_and_pulls_its_metrics(tmp_path, capsys, prometheus):
    prom_url, port = prometheus
    run_dir = tmp_path / "run"
    launch = (
        f"{sys.executable} -m engine_lite.cli serve --model tiny --port {{port}} "
        "--kv-cache-memory-gb 0.25 --max-num-batched-tokens {max_num_batched_tokens}"
    )
    argv = ["--slo", "tpot_p99=200ms", "--launch", launch, "--url", f"http://127.0.0.1:{port}",
            "--served-model", "tiny", "--trials", "2", "--repeats", "0", "--run-dir",
            str(run_dir), "--json", "--num-requests", "8", "--start-rate", "1",
            "--max-levels", "2", "--rate-tolerance", "0.5",
            # On the target alone: a simulator fitted on 8 requests' spans, when it fits at
            # all, may verify a third config; this test is about the servers, not screening.
            "--fidelity", "real"]  # fmt: skip
    if prom_url:
        argv += ["--prometheus-url", prom_url, "--prometheus-interval", "1"]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)

    assert rec["target"]["kind"] == "launch"
    budgets = sorted(t["config"]["max_num_batched_tokens"] for t in rec["trials"])
    default_budget = rec["target"]["default_config"]["max_num_batched_tokens"]
    # The rule of thumb and the default, each its own server (the command takes only the budget).
    assert budgets == sorted({4096, default_budget})
    assert rec["target"]["settable"] == ["max_num_batched_tokens"]
    # --repeats 0: nothing re-measured, so no server for the same-traffic check either.
    assert rec["default_at_recommended_rate"] is None
    assert len(list((run_dir / "server-logs").glob("server-*.log"))) == 2
    assert port_is_free(port)  # the last server's whole process group is gone
    assert rec["default"]["capacity_rps"] > 0
    if prom_url:
        table = pd.read_csv(run_dir / "trials.csv")
        # A value (not a gap) means Prometheus had the server's series for that level's window;
        # whether a 1 s scrape caught a short level busy is chance, so zeros are allowed.
        assert table["kv_cache_usage_max"].between(0, 1).all()
        assert table["kv_cache_usage_mean"].notna().all()
        assert (table["preemptions"] >= 0).all()
