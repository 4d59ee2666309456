"""Prometheus exposition: vLLM V1 names, labels and buckets, fed by the engine's stats types."""

import math

from prometheus_client.parser import text_string_to_metric_families

from engine_lite.outputs import EngineStats, RequestStats, StepStats
from engine_lite.server.metrics import ServerMetrics, build_1_2_5_buckets

IDLE = EngineStats(0, 0, 0.0, 0, 0)


def _step(prefill, decode, duration=0.01, preemptions=0):
    stall = duration * prefill / (prefill + decode) if prefill and decode else 0.0
    return StepStats(
        time_s=1.0, step_duration_s=duration, forward_duration_s=duration * 0.9,
        num_prefill_tokens=prefill, num_decode_tokens=decode, num_prefill_reqs=int(prefill > 0),
        num_decode_reqs=decode, decode_stall_s=stall, num_preemptions=preemptions,
        num_running=3, num_waiting=1, kv_cache_usage=0.5,
    )  # fmt: skip


def _request(reason="length", times=(10.2, 10.25, 10.3)):
    return RequestStats(
        request_id="r", arrival_time_s=10.0, first_scheduled_time_s=10.1,
        first_token_time_s=times[0] if times else None, finish_time_s=times[-1] if times else 10.3,
        num_prompt_tokens=7, num_output_tokens=len(times), finish_reason=reason,
        token_times_s=list(times),
    )  # fmt: skip


def _samples(metrics, stats=IDLE):
    text = metrics.render(stats).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples, name, **labels):
    labels = {"model_name": "m", "engine": "0", **labels}
    return samples[(name, tuple(sorted(labels.items())))]


def test_vllm_names_and_labels_are_exposed_from_the_start():
    s = _samples(ServerMetrics("m", max_model_len=2048))
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_count",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
        "engine_lite:step_duration_seconds_count",
        "engine_lite:decode_stall_seconds_total",
    ):
        assert _value(s, name) == 0, name
    for reason in ("stop", "length", "abort"):
        assert _value(s, "vllm:request_success_total", finished_reason=reason) == 0


def test_bucket_edges_are_vllms():
    s = _samples(ServerMetrics("m", max_model_len=2048))

    def edges(name):
        return [float(dict(k[1])["le"]) for k in s if k[0] == name + "_bucket"][:-1]

    assert edges("vllm:time_to_first_token_seconds")[:3] == [0.001, 0.005, 0.01]
    assert edges("vllm:time_to_first_token_seconds")[-1] == 2560.0
    assert edges("vllm:inter_token_latency_seconds")[0] == 0.01
    assert edges("vllm:e2e_request_latency_seconds")[-1] == 7680.0
    assert edges("vllm:iteration_tokens_total") == [1, 8, 16, 32, 64, 128, 256, 512, 1024,
                                                    2048, 4096, 8192, 16384]  # fmt: skip
    assert edges("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]


def test_steps_feed_iteration_and_prefill_decode_metrics():
    m = ServerMetrics("m", max_model_len=2048)
    m.on_step(_step(prefill=200, decode=56, duration=0.02, preemptions=2))
    m.on_step(_step(prefill=0, decode=8, duration=0.005))
    s = _samples(m, EngineStats(3, 1, 0.5, 2, 2))
    assert _value(s, "vllm:iteration_tokens_total_sum") == 264
    assert _value(s, "vllm:iteration_tokens_total_count") == 2
    assert _value(s, "vllm:num_preemptions_total") == 2
    assert _value(s, "engine_lite:prefill_tokens_total") == 200
    assert _value(s, "engine_lite:decode_tokens_total") == 64
    assert _value(s, "engine_lite:steps_total") == 2
    assert _value(s, "engine_lite:step_prefill_tokens_bucket", le="0.0") == 1
    assert math.isclose(_value(s, "engine_lite:decode_stall_seconds_total"), 0.02 * 200 / 256)
    assert _value(s, "vllm:num_requests_running") == 3
    assert _value(s, "vllm:kv_cache_usage_perc") == 0.5


def test_gauges_come_from_the_engine_at_scrape_time():
    m = ServerMetrics("m", max_model_len=2048)
    m.on_step(_step(prefill=10, decode=0))
    assert _value(_samples(m, IDLE), "vllm:kv_cache_usage_perc") == 0.0


def test_finished_requests_feed_vllm_phase_histograms():
    m = ServerMetrics("m", max_model_len=2048)
    m.on_finish(_request())
    m.on_finish(_request(reason="abort", times=()))
    s = _samples(m)
    assert _value(s, "vllm:request_success_total", finished_reason="length") == 1
    assert _value(s, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(s, "vllm:e2e_request_latency_seconds_count") == 2
    assert _value(s, "vllm:time_to_first_token_seconds_count") == 1  # the abort had no token
    assert math.isclose(_value(s, "vllm:time_to_first_token_seconds_sum"), 0.2)
    assert math.isclose(_value(s, "vllm:request_queue_time_seconds_sum"), 0.2)
    assert math.isclose(_value(s, "vllm:request_prefill_time_seconds_sum"), 0.1)
    assert math.isclose(_value(s, "vllm:request_decode_time_seconds_sum"), 0.1)
    assert _value(s, "vllm:inter_token_latency_seconds_count") == 2
    assert math.isclose(_value(s, "vllm:inter_token_latency_seconds_sum"), 0.1)
    assert _value(s, "vllm:request_generation_tokens_sum") == 3


def test_two_servers_in_one_process_keep_separate_registries():
    a, b = ServerMetrics("a", 2048), ServerMetrics("b", 2048)
    a.on_tokens(5, num_prompt_tokens=9, first=True)
    assert _value(_samples(a), "vllm:generation_tokens_total", model_name="a") == 5
    assert _value(_samples(a), "vllm:prompt_tokens_total", model_name="a") == 9
    assert _value(_samples(b), "vllm:generation_tokens_total", model_name="b") == 0
