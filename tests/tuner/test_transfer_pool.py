"""`benchmarks/transfer_pool.py` on result files shaped as `transfer.py --json` writes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer_pool.py"
CONFIGS = [{"max_num_batched_tokens": b} for b in (256, 1024, 2048)]


def result(tmp: Path, name: str, ours: list[float], theirs: list[float], **over) -> Path:
    rows = [{"config": c, "engine_lite_rps": o, "vllm_rps": t, "vllm_sim_rps": t}
            for c, o, t in zip(CONFIGS, ours, theirs, strict=True)]  # fmt: skip
    run = {"slo": "tpot_p99=30ms", "workload": "mixed", "min_requests_per_level": 320,
           "dtype": "bfloat16", "configs": rows, "spearman": 0.5, **over}  # fmt: skip
    path = tmp / name
    path.write_text(json.dumps(run))
    return path


def pool(*args: str | Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_medians_rank_the_configs_and_vllm_is_scored_against_itself(tmp_path):
    a = result(tmp_path, "a.json", [9, 5, 4], [30, 20, 10])
    b = result(tmp_path, "b.json", [7, 6, 5], [20, 30, 10])  # one run that swaps the top two
    c = result(tmp_path, "c.json", [0, 0, 0], [28, 18, 12])  # older engine_lite: vLLM side only
    done = pool(a, b, "--vllm-only", c, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["engine_lite_median_rps"] for r in out["configs"]] == [8, 5.5, 4.5]
    assert [r["vllm_median_rps"] for r in out["configs"]] == [28, 20, 10]
    assert out["configs"][0]["vllm_range_rps"] == [20, 30]
    assert out["spearman_of_medians"] == 1.0  # the medians agree though run b alone does not
    assert out["spearman_of_relative_medians"] == 1.0
    assert out["engine_lite_pick"] == CONFIGS[0] and out["pick_vs_best_median"] == 1.0
    pairs = out["vllm_vs_vllm"]["pairs"]  # a-b, a-c, b-c
    assert [round(p, 2) for p in pairs] == [0.5, 1.0, 0.5]
    assert len(out["vllm_vs_vllm"]["each_vs_median_of_others"]) == 3
    text = pool(a, b, "--vllm-only", c)
    assert "Spearman of the medians: 1.00" in text.stdout


def test_a_run_on_a_slower_machine_does_not_pick_the_medians(tmp_path):
    # Run c is the same ranking as a, all at half speed; raw medians then take configs 0 and 1
    # from b, whose order is swapped; relative to each run's mean, a and c outvote b.
    a = result(tmp_path, "a.json", [10, 8, 4], [30, 20, 10])
    b = result(tmp_path, "b.json", [8, 10, 4], [30, 20, 10])
    c = result(tmp_path, "c.json", [5, 4, 2], [30, 20, 10])
    out = json.loads(pool(a, b, c, "--json").stdout)
    assert [r["engine_lite_median_rps"] for r in out["configs"]] == [8, 8, 4]
    assert out["spearman_of_medians"] < 1.0
    assert out["spearman_of_relative_medians"] == 1.0


def test_runs_of_different_settings_are_refused_in_one_line(tmp_path):
    a = result(tmp_path, "a.json", [9, 5, 4], [30, 20, 10])
    b = result(tmp_path, "b.json", [9, 5, 4], [30, 20, 10], min_requests_per_level=640)
    done = pool(a, b)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0
    assert "min_requests_per_level differs" in done.stderr and "640" in done.stderr
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    done = pool(junk)
    assert done.returncode != 0 and "not a transfer.py --json result" in done.stderr
