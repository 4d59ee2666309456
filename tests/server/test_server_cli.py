"""`engine-lite` flags: vLLM names, EngineConfig defaults, one-line errors with exit code 2."""

import subprocess
import sys

import pytest

from engine_lite.cli import main
from engine_lite.config import EngineConfig, Policy
from engine_lite.server.args import build_serve_parser, config_from_args


def _config(*argv):
    return config_from_args(build_serve_parser().parse_args(list(argv)))


def test_unset_flags_keep_engine_config_defaults():
    assert _config() == EngineConfig()


def test_every_knob_maps_to_its_config_field():
    cfg = _config(
        "--model", "small", "--max-num-batched-tokens", "2048", "--max-num-seqs", "64",
        "--enable-chunked-prefill", "--long-prefill-token-threshold", "512",
        "--long-prefill-token-threshold-adaptive", "--policy", "prefill_first",
        "--block-size", "32", "--num-gpu-blocks-override", "100",
        "--gpu-memory-utilization", "0.5", "--kv-cache-memory-gb", "0.25",
        "--max-model-len", "2048", "--device", "cpu", "--dtype", "float32",
        "--attention-backend", "torch", "--seed", "7",
    )  # fmt: skip
    assert cfg == EngineConfig(
        model="small", max_num_batched_tokens=2048, max_num_seqs=64,
        enable_chunked_prefill=True, long_prefill_token_threshold=512,
        long_prefill_token_threshold_adaptive=True, policy=Policy.PREFILL_FIRST,
        block_size=32, num_gpu_blocks_override=100, gpu_memory_utilization=0.5,
        kv_cache_memory_gb=0.25, max_model_len=2048, device="cpu", dtype="float32",
        attention_backend="torch", seed=7,
    )  # fmt: skip


def test_no_enable_chunked_prefill_turns_it_off():
    cfg = _config("--no-enable-chunked-prefill", "--max-model-len", "4096")
    assert cfg.enable_chunked_prefill is False


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-num-seqs", "abc"], "--max-num-seqs"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--policy", "fastest"], "--policy"),
        (["--port", "70000"], "--port"),
        (["--max-num-seqs", "9000", "--max-num-batched-tokens", "8192"], "--max-num-seqs=9000"),
        (["--max-num-partial-prefills", "2"], "--max-num-partial-prefills"),  # gone in vLLM 0.32
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization=1.5"),
        (["--device", "tpu"], "--device='tpu'"),
        (
            ["--long-prefill-token-threshold", "9000", "--max-model-len", "4096"],
            "--long-prefill-token-threshold=9000",
        ),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_flags_are_one_line_errors_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["serve", *argv]))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err


def test_unknown_subcommand(capsys):
    assert main(["launch"]) == 2
    assert "serve, bench or export-hf" in capsys.readouterr().err


def test_console_script_reports_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "engine_lite.cli", "serve", "--max-num-seqs", "-4"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_model_that_cannot_load_exits_2_after_opening_the_port(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [sys.executable, "-m", "engine_lite.cli", "serve", "--model", str(missing), "--port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "listening on http://127.0.0.1:" in proc.stdout
    assert proc.stderr.startswith("error: --model=") and proc.stderr.count("\n") == 1
