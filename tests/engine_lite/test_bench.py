"""`engine-lite bench` prints one JSON object whose counts match the workload it ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from engine_lite.bench import main, mixed_workload

SMALL = ["--num-requests", "6", "--num-long", "2", "--short-len", "8", "24"]
SMALL += ["--long-len", "200", "300", "--output-len", "4", "--max-num-batched-tokens", "256"]
SMALL += ["--num-gpu-blocks-override", "256"]  # a small cache keeps the test light


def test_mixed_run_reports_its_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    workload = mixed_workload(6, 2, (8, 24), (200, 300), 4, vocab_size=4096, seed=0)
    assert result["preset"] == "tiny"
    assert result["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert result["mode"] == "mixed" and result["max_num_batched_tokens"] == 256
    assert result["num_output_tokens"] == 6 * 4
    assert result["num_prompt_tokens"] == sum(len(r.prompt_token_ids) for r in workload)
    # two long prompts of >= 200 tokens cannot share one 256-token step: chunking happened
    assert result["steps"] >= 2 + 3
    assert 0 < result["sched_overhead_frac"] < 1
    expected_tps = (result["num_prompt_tokens"] + 24) / result["wall_s"]
    assert result["total_tokens_per_s"] == pytest.approx(expected_tps, rel=0.01)


def test_decode_only_counts_pure_decode_steps(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--decode-only", "8", "--prompt-len", "16", "--output-len", "5", "--json"]
    argv += ["--num-gpu-blocks-override", "64"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    # the prefill step makes each request's first token; 4 steps of 8 decodes follow
    assert result["mode"] == "decode_only"
    assert result["steps"] == 4
    assert result["num_output_tokens"] == 8 * 4


def test_workload_is_seeded() -> None:
    a = mixed_workload(10, 2, seed=3)
    assert a == mixed_workload(10, 2, seed=3)
    assert a != mixed_workload(10, 2, seed=4)
    assert sum(len(r.prompt_token_ids) >= 2048 for r in a) == 2


def test_module_entry_point_reports_bad_input_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "engine_lite.bench", "--num-requests", "2", "--num-long", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --num-long=3 exceeds --num-requests=2; use at most --num-requests long prompts"
    ]
