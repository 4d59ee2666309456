"""Faults a hostile user meets, on real `tune` processes and real servers: signals, a port
already taken, a server that dies mid-level. Each ends in one clear line or the right
behaviour, and nothing measured is lost."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

STUB = Path(__file__).with_name("stub_server.py")
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; it holds no port
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until `path` exists; fail with tune's output if tune ends first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path.name} never appeared: {proc.communicate()[1]}")
        time.sleep(0.05)


@contextlib.contextmanager
def stub_group(tmp_path: Path) -> Iterator[None]:
    """Whatever a test asserts, no stub server outlives it."""
    try:
        yield
    finally:
        pidfile = tmp_path / "server.pid"
        if pidfile.exists() and alive(pid := int(pidfile.read_text())):
            os.killpg(pid, signal.SIGKILL)


def launch_command(tmp_path: Path, *faults: str) -> str:
    return (f"{sys.executable} {STUB} {{port}} --pid-file {tmp_path / 'server.pid'} "
            f"--budget {{max_num_batched_tokens}} {' '.join(faults)}")  # fmt: skip


def start_tune(tmp_path: Path, port: int, *faults: str, launch: bool = True,
               extra: Sequence[str] = ()) -> subprocess.Popen:  # fmt: skip
    """`tune` against a stub server on `port`: launched per config with `faults`, or (with
    launch=False) one the test started; `extra` flags at the end."""
    target = ["--launch", launch_command(tmp_path, *faults)] if launch else []
    args = ["--slo", "tpot_p99=200ms", *target, "--url", f"http://127.0.0.1:{port}",
            "--served-model", "stub", "--run-dir", str(tmp_path / "run"), "--start-rate", "4",
            "--num-requests", "8", "--quiet", *extra]  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "tuner.cli", *args], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)  # fmt: skip


def _default_sigint() -> None:
    # As from a terminal. A suite started in the background by a script inherits SIGINT
    # ignored (shells do that without job control); tune, like any program, keeps that, and a
    # Ctrl-C test would wait for nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_stub(port: int, *faults: str) -> subprocess.Popen:
    """A stub server the test owns (as a server someone else started), healthy on return."""
    stub = subprocess.Popen([sys.executable, str(STUB), str(port), *faults], env=ENV,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while port_is_free(port) and time.monotonic() < deadline and stub.poll() is None:
        time.sleep(0.05)
    return stub


STOPS = [
    (signal.SIGTERM, 143, "stopped by SIGTERM"),
    (signal.SIGHUP, 129, "stopped by SIGHUP"),
    (signal.SIGINT, 130, "interrupted"),
]


@pytest.mark.parametrize(("sig", "code", "said"), STOPS)
def test_a_signal_mid_level_stops_the_launched_server_and_names_the_run(tmp_path, sig, code, said):
    port = free_port()
    with stub_group(tmp_path):
        tune = start_tune(tmp_path, port, "--hang", "--seen", str(tmp_path / "seen"))
        try:
            wait_for(tmp_path / "seen", tune)  # the server is up and a level is being measured
            server = int((tmp_path / "server.pid").read_text())
            tune.send_signal(sig)
            _, err = tune.communicate(timeout=60)
        finally:
            tune.kill()
        assert tune.returncode == code, err
        assert not alive(server) and port_is_free(port)
    last = err.strip().splitlines()[-1]
    assert last == f"{said}; resume with tune --resume {tmp_path / 'run'}"


def test_a_killed_tune_leaves_no_load_generator_behind(tmp_path):
    """kill -9 mid-level: no `finally` runs, yet the load generator's process goes with tune.
    It holds tune's stderr; outliving tune, it kept that pipe open for as long as its hung level
    lasted (requests time out after 120 s) and went on sending the level's requests."""
    port, seen = free_port(), tmp_path / "seen"
    stub = start_stub(port, "--hang", "--seen", str(seen))  # a server someone else runs
    try:
        tune = start_tune(tmp_path, port, launch=False)
        try:
            wait_for(seen, tune)  # a level is being measured
            tune.kill()
            _, err = tune.communicate(timeout=20)  # stderr's end: every holder is gone
        finally:
            tune.kill()
    finally:
        stub.kill()
        stub.wait()
    assert tune.returncode == -signal.SIGKILL, err


def test_a_port_already_taken_is_refused_before_anything_is_measured_against_it(tmp_path):
    port, seen = free_port(), tmp_path / "seen"
    # A server left behind by an earlier run, answering /health where the next one must listen.
    stray = start_stub(port, "--seen", str(seen))
    try:
        with stub_group(tmp_path):
            tune = start_tune(tmp_path, port)
            _, err = tune.communicate(timeout=120)
    finally:
        stray.kill()
        stray.wait()
    assert tune.returncode == 2
    assert err.strip() == (
        f"error: something already listens on 127.0.0.1:{port}, where the --launch server "
        "must; stop it (a server left by an earlier run?) or give --url another port"
    )
    assert not seen.exists()  # not one request went to the stray server
    assert not (tmp_path / "server.pid").exists()  # and ours never started


@pytest.mark.slow
def test_a_url_server_that_dies_mid_level_is_named_and_what_was_measured_is_reported(tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    stub = start_stub(port, "--die-after", "8")  # the first level's 8 requests, then it dies
    try:
        tune = start_tune(tmp_path, port, launch=False)
        _, err = tune.communicate(timeout=120)
    finally:
        stub.kill()
        stub.wait()
    assert tune.returncode == 2, err
    line = err.strip()
    assert "\n" not in line and line.startswith("error: the server stopped answering: ")
    assert f"is reported in {run_dir / 'recommendation.html'}" in line
    # The level it died in is not judged, but its requests are kept, the failed ones too.
    lost = [json.loads(x) for x in (run_dir / "records").glob("*-server-lost.jsonl")
            for x in x.read_text().splitlines()]  # fmt: skip
    assert lost and not all(r["success"] for r in lost)

    rec = json.loads((run_dir / "recommendation.json").read_text())
    assert rec["search"]["levels_measured"] == 1  # the level before it died, in the report
    assert "nothing finished a load level" not in rec["summary"]
    assert len((run_dir / "trials.csv").read_text().splitlines()) == 2  # header + that level
    report = subprocess.run([sys.executable, "-m", "tuner.cli", "report", str(run_dir), "--json"],
                            env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0 and json.loads(report.stdout)["summary"] == rec["summary"]


@pytest.mark.slow
def test_a_launched_server_that_dies_mid_level_cuts_that_trial_and_the_next_starts_afresh(
    tmp_path,
):
    port, run_dir = free_port(), tmp_path / "run"
    with stub_group(tmp_path):  # every server it starts dies at its ninth request
        tune = start_tune(tmp_path, port, "--die-after", "8", extra=["--trials", "2",
                          "--repeats", "0", "--json"])  # fmt: skip
        out, err = tune.communicate(timeout=120)
    assert tune.returncode == 0, err
    rec = json.loads(out)
    # The default and the rule of thumb, each on a server of its own, each cut where it died.
    assert len(list((run_dir / "server-logs").glob("server-*.log"))) == 2
    assert [t["outcome"] for t in rec["trials"]] == ["server_lost", "server_lost"]
    assert port_is_free(port)
