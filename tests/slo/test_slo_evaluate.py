"""SLO verdicts, margins, attainment, and goodput equal to vLLM's formula on the same records."""

from __future__ import annotations

import math
import random

import pytest
from slo_records import Rec

from slo import evaluate, parse_slo

approx = pytest.approx


def test_terms_values_margins_and_binding(hand_records):
    rep = evaluate(hand_records, parse_slo("ttft_p99=150ms,tpot_p50=80ms,e2el_mean=1s"))
    ttft, tpot, e2el = rep.terms
    assert ttft.value_s == approx(0.198)
    assert ttft.margin_frac == approx((0.15 - 0.198) / 0.15)
    assert not ttft.met
    assert tpot.value_s == approx((0.2 / 3 + 0.1) / 2)  # median of two TPOTs
    assert not tpot.met
    assert e2el.met
    assert e2el.margin_frac == approx(1 - 0.25)
    assert rep.binding is ttft
    assert not rep.met


def test_met_when_every_term_holds(hand_records):
    rep = evaluate(hand_records, parse_slo("ttft_p99=250ms,itl_p99=250ms"))
    assert rep.met
    assert rep.binding.term.name in {"ttft_p99", "itl_p99"}


def test_goodput_and_attainment_count_per_request_bounds(hand_records):
    rep = evaluate(hand_records, parse_slo("ttft_p99=150ms,tpot_p99=80ms"))
    # Good: request 0 (TTFT 0.1, TPOT 0.067) and request 2 (TTFT 0.05, TPOT 0 with one token).
    # Request 1 misses TTFT; request 3 failed. Duration 1.2 s.
    assert rep.goodput_rps == approx(2 / 1.2)
    assert rep.attainment == approx(2 / 4)
    assert rep.class_attainment == {"long": 0.0, "short": approx(2 / 3)}


def test_itl_bound_uses_each_requests_largest_gap(hand_records):
    # Request 0's largest gap is 0.10, request 1's 0.2, request 2 has none.
    assert evaluate(hand_records, parse_slo("itl_p99=150ms")).attainment == approx(2 / 4)
    assert evaluate(hand_records, parse_slo("itl_p99=90ms")).attainment == approx(1 / 4)


def test_per_class_terms_show_the_long_requests_pain(hand_records):
    rep = evaluate(hand_records, parse_slo("ttft_p99=150ms"))
    assert rep.class_terms["long"][0].value_s == approx(0.2)
    assert not rep.class_terms["long"][0].met
    assert rep.class_terms["short"][0].met


def test_a_run_with_no_successes_never_meets_the_slo(hand_records):
    rep = evaluate([hand_records[-1]], parse_slo("ttft_p99=10s"))
    assert not rep.met
    assert rep.terms[0].value_s == math.inf
    assert rep.attainment == 0.0


def test_missing_samples_with_successes_count_as_zero_like_vllm(hand_records):
    # Only the one-token request: no TPOT samples; vLLM treats its TPOT as 0.
    rep = evaluate([hand_records[3]], parse_slo("tpot_p99=1ms,itl_p99=1ms"))
    assert rep.met


def test_vllm_dict_carries_verdict_and_margins(hand_records):
    d = evaluate(hand_records, parse_slo("ttft_p99=150ms,e2el_mean=1s")).to_vllm_dict()
    assert d["request_goodput"] == approx(2 / 1.2)
    assert d["slo_met"] is False
    assert d["slo_margin_e2el_mean"] == approx(1 - 0.25)  # mean E2EL 0.25 s
    assert d["slo_binding_term"] == "ttft_p99"
    assert d["slo_terms"][0]["value_ms"] == approx(198.0)


def _vllm_goodput(records: list[Rec], goodput_config_dict: dict[str, float]) -> float:
    """vLLM's goodput, re-implemented from vllm/benchmarks/serve.py `calculate_metrics`."""
    milliseconds_to_seconds = 1000
    ttfts, all_tpots, e2els = [], [], []
    for r in records:
        if not r.success:
            continue
        ttft = r.chunk_times_s[0] - r.sent_s
        latency = r.chunk_times_s[-1] - r.sent_s
        output_len = r.output_tokens
        tpot = 0
        if output_len > 1:
            tpot = (latency - ttft) / (output_len - 1)
        all_tpots.append(tpot)
        ttfts.append(ttft)
        e2els.append(latency)
    valid_metrics, slo_values = [], []
    for name, values in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
        if name in goodput_config_dict:
            valid_metrics.append(values)
            slo_values.append(goodput_config_dict[name] / milliseconds_to_seconds)
    good_completed = 0
    for req_metric in zip(*valid_metrics, strict=True):
        if all(s >= r for s, r in zip(slo_values, req_metric, strict=True)):
            good_completed += 1
    dur_s = max(r.chunk_times_s[-1] if r.chunk_times_s else r.sent_s for r in records) - min(
        r.sent_s for r in records
    )
    return good_completed / dur_s


def _random_records(rng: random.Random, n: int) -> list[Rec]:
    recs = []
    for i in range(n):
        sent = rng.uniform(0, 5)
        if rng.random() < 0.1:
            recs.append(Rec(i, sent, [], 0, success=False, error="timeout"))
            continue
        out = rng.choice([1, 2, rng.randint(3, 60)])
        t = sent + rng.expovariate(1 / 0.3)
        times = [t]
        for _ in range(out - 1):
            t += rng.expovariate(1 / 0.03)
            times.append(t)
        recs.append(Rec(i, sent, times, out))
    return recs


@pytest.mark.parametrize("seed", range(5))
def test_goodput_equals_vllm_formula(seed):
    rng = random.Random(seed)
    records = _random_records(rng, 300)
    config = {"ttft": 400.0, "tpot": 35.0, "e2el": 2000.0}
    for keys in (("ttft",), ("tpot",), ("ttft", "tpot"), ("ttft", "tpot", "e2el")):
        sub = {k: config[k] for k in keys}
        slo = parse_slo(",".join(f"{k}_p99={v}ms" for k, v in sub.items()))
        assert evaluate(records, slo).goodput_rps == approx(_vllm_goodput(records, sub))
