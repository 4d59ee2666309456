"""--launch: argument lists without a shell, /health wait, and the whole process group stopped."""

import os
import socket
import sys
import textwrap

import pytest

from engine_lite import Policy
from tuner.errors import TuneError
from tuner.targets.launch import LaunchedServer, LaunchSpec

# A server that forks a worker (as vLLM and SGLang do) and answers /health after a delay.
SERVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from aiohttp import web
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "w").write(str(worker.pid))
    time.sleep(float(sys.argv[3]))
    app = web.Application()
    app.router.add_get("/health", lambda request: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited, so it does not count.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_placeholders_fill_single_arguments_without_a_shell():
    spec = LaunchSpec(
        "serve 'my model' --port {port} --max-num-batched-tokens {max_num_batched_tokens} "
        "--policy {policy} --x '{max_num_seqs}; rm -rf /'",
        url="http://127.0.0.1:8123",
        model="m",
    )
    argv = spec.argv(
        {"max_num_batched_tokens": 2048, "policy": Policy.PREFILL_FIRST, "max_num_seqs": 8}
    )
    assert argv == [
        "serve",
        "my model",
        "--port",
        "8123",
        "--max-num-batched-tokens",
        "2048",
        "--policy",
        "prefill_first",
        "--x",
        "8; rm -rf /",
    ]
    assert spec.fields() == {"port", "max_num_batched_tokens", "policy", "max_num_seqs"}


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("serve {max_num_batchd_tokens}", "unknown placeholder {max_num_batchd_tokens}"),
        ("serve 'unclosed", "does not parse"),
        ("", "empty"),
    ],
)
def test_bad_templates_say_what_to_fix(template, named):
    with pytest.raises(TuneError, match=named):
        LaunchSpec(template, url="http://127.0.0.1:1", model="m")


async def test_waits_for_health_then_stops_the_whole_group(tmp_path):
    port, pidfile = free_port(), tmp_path / "worker.pid"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = LaunchedServer(
        [sys.executable, str(script), str(port), str(pidfile), "0.5"],
        f"http://127.0.0.1:{port}",
        health_timeout_s=30,
        log_path=tmp_path / "server.log",
    )
    await server.start()
    leader, worker = server.proc.pid, int(pidfile.read_text())
    assert alive(leader) and alive(worker)
    await server.stop()
    assert not alive(leader) and not alive(worker)


async def test_a_server_that_exits_is_reported_with_its_status(tmp_path):
    server = LaunchedServer(
        [sys.executable, "-c", "import sys; sys.exit(3)"], "http://127.0.0.1:1", health_timeout_s=30
    )
    with pytest.raises(TuneError, match="exited with status 3"):
        await server.start()


async def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(tmp_path):
    port, pidfile = free_port(), tmp_path / "worker.pid"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = LaunchedServer(
        [sys.executable, str(script), str(port), str(pidfile), "60"],
        f"http://127.0.0.1:{port}",
        health_timeout_s=1.0,
        stop_grace_s=2.0,
    )
    with pytest.raises(TuneError, match="/health within 1s"):
        await server.start()
    assert not alive(int(pidfile.read_text()))


async def test_a_missing_command_is_one_line():
    server = LaunchedServer(["no-such-server-binary-x"], "http://127.0.0.1:1")
    with pytest.raises(TuneError, match="could not start 'no-such-server-binary-x'"):
        await server.start()
