"""Run metrics against values computed by hand from the records in conftest.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slo import Stat, compute_metrics, percentile, stat_value

approx = pytest.approx


def test_counts_duration_and_throughputs(hand_records):
    m = compute_metrics(hand_records)
    assert (m.completed, m.failed) == (3, 1)
    assert m.error_rate == approx(0.25)
    # First send (10.0, the warm-up at 9.0 excluded) to the last end (the failure at 11.2).
    assert m.duration_s == approx(1.2)
    assert m.request_throughput == approx(3 / 1.2)
    assert m.total_output_tokens == 4 + 3 + 1
    assert m.output_throughput == approx(8 / 1.2)
    assert m.total_input_tokens == 100 + 2000 + 50
    assert m.total_token_throughput == approx((2150 + 8) / 1.2)


def test_ttft_e2el_per_successful_request(hand_records):
    m = compute_metrics(hand_records)
    assert m.ttft.count == 3
    assert m.mean_ttft_s == approx((0.1 + 0.2 + 0.05) / 3)
    assert m.median_ttft_s == approx(0.1)
    # numpy linear: sorted [0.05, 0.1, 0.2], rank 0.99 * 2 = 1.98 -> 0.1 + 0.98 * 0.1
    assert m.p99_ttft_s == approx(0.198)
    assert m.mean_e2el_s == approx((0.3 + 0.4 + 0.05) / 3)


def test_tpot_only_for_more_than_one_output_token(hand_records):
    m = compute_metrics(hand_records)
    assert m.tpot.count == 2  # the one-token request has no TPOT
    assert m.mean_tpot_s == approx((0.2 / 3 + 0.1) / 2)


def test_itl_pools_one_gap_per_chunk(hand_records):
    m = compute_metrics(hand_records)
    # Gaps 0.05, 0.10, 0.05 (request 0) and 0.2 (request 1, whose chunk carried 2 tokens).
    assert m.itl.count == 4
    assert m.median_itl_s == approx(0.075)
    assert m.itl.p90_s == approx(0.1 + 0.7 * 0.1)
    assert m.itl.max_s == approx(0.2)


def test_latency_from_scheduled_arrival_shows_client_queueing(hand_records):
    m = compute_metrics(hand_records)
    # Request 0 was sent 0.1 s late: its TTFT from the schedule is 0.2, not 0.1.
    assert m.ttft_from_scheduled.max_s == approx(0.2)
    assert m.send_lag.max_s == approx(0.1)


def test_per_class_breakdown_separates_long_prompts(hand_records):
    m = compute_metrics(hand_records)
    assert set(m.per_class) == {"short", "long"}
    long, short = m.per_class["long"], m.per_class["short"]
    assert (long.requests, long.completed, long.failed) == (1, 1, 0)
    assert (short.requests, short.completed, short.failed) == (3, 2, 1)
    assert long.ttft.mean_s == approx(0.2)
    assert short.ttft.mean_s == approx(0.075)
    assert short.error_rate == approx(1 / 3)


def test_vllm_dict_keys_are_in_ms(hand_records):
    d = compute_metrics(hand_records).to_vllm_dict()
    for key in ("completed", "failed", "duration", "request_throughput", "output_throughput"):
        assert key in d
    assert d["median_ttft_ms"] == approx(100.0)
    assert d["p99_ttft_ms"] == approx(198.0)
    assert d["p99.9_itl_ms"] == approx(percentile([0.05, 0.1, 0.05, 0.2], 99.9) * 1e3)
    assert d["request_goodput"] is None
    assert d["std_e2el_ms"] == approx(np.std([0.3, 0.4, 0.05]) * 1e3)


def test_empty_and_all_failed_runs_give_nan_latencies_not_zero(hand_records):
    m = compute_metrics([hand_records[-1]])
    assert (m.completed, m.failed, m.error_rate) == (0, 1, 1.0)
    assert math.isnan(m.p99_ttft_s)
    assert compute_metrics([]).duration_s == 0.0


def test_usage_missing_falls_back_to_chunk_token_counts(hand_records):
    rec = hand_records[2]
    rec.output_tokens = 0  # server sent no usage: count tokens the chunks carried (1 + 2)
    m = compute_metrics([rec])
    assert m.total_output_tokens == 3


def test_percentile_matches_numpy_linear():
    xs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for q in (0, 50, 90, 99, 99.9, 100):
        assert percentile(xs, q) == approx(float(np.percentile(xs, q)))
    assert stat_value(xs, Stat.MEAN) == approx(np.mean(xs))
    assert stat_value(xs, Stat.P999) == approx(float(np.percentile(xs, 99.9)))
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)
