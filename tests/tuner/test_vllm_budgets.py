"""`benchmarks/vllm_budgets.py`: its budget list and its summary of measured searches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from vllm_budgets import parse_budgets, summary


def test_budgets_vllm_would_refuse_end_in_one_line_naming_the_fix():
    assert parse_budgets("128,192,256", 128) == [128, 192, 256]
    with pytest.raises(SystemExit, match=r"--budgets: 64 is below max_num_seqs \(128\), which "
                       r"vLLM refuses; use 128 or more"):  # fmt: skip
        parse_budgets("64,256", 128)
    with pytest.raises(SystemExit, match=r"--budgets: '2k' is not a whole number"):
        parse_budgets("256,2k", 1)


def level(rate: float, failure: str | None) -> dict:
    return {"rate_rps": rate, "passed": failure is None, "tpot_p99_ms": 10.0,
            "served_fraction": 0.7 if failure == "queue" else 1.0, "failure": failure}  # fmt: skip


def test_the_summary_says_how_far_each_budget_beats_the_default_and_what_stopped_it():
    small = {
        "label": "128",
        "config": {"max_num_batched_tokens": 128},
        "capacities_rps": [17.0, 19.0, 18.0],
        "levels": [[level(15, None), level(19.5, "queue")], [level(19.5, "queue")], []],
    }
    default = {
        "label": "default",
        "config": {},
        "capacities_rps": [10.0, 12.0],
        "levels": [[level(11.5, "slo"), level(10.0, None)], [level(13.2, "slo")]],
    }
    out = summary([small, default])["configs"]
    assert [c["median_rps"] for c in out] == [18.0, 11.0]
    assert out[0]["vs_default"] == pytest.approx(18 / 11) and out[1]["vs_default"] == 1.0
    assert out[0]["failures"] == {"queue": 2}  # the machine's ceiling, not TPOT
    assert out[1]["failures"] == {"slo": 2}
