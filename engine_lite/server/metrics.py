"""Prometheus metrics with vLLM V1's names, labels and buckets, plus engine_lite's own.

Names, label names (`model_name`, `engine`) and bucket edges follow vLLM's
`vllm/v1/metrics/loggers.py` (PrometheusStatLogger) so existing vLLM dashboards and alerts work
unchanged. Metrics vLLM lacks and a chunked-prefill tuner needs (per-step prefill/decode split,
step duration, decode time stalled behind prefill) use the `engine_lite:` prefix.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from engine_lite.outputs import EngineStats, RequestStats, StepStats

LABEL_NAMES = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort")

# vLLM V1 bucket edges, copied exactly so histogram_quantile agrees with a vLLM deployment.
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5),
    *(0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
# engine_lite's own: a step with no prefill (or no decode) lands in the 0 bucket.
STEP_TOKENS_BUCKETS = (0, *ITERATION_TOKENS_BUCKETS)
STEP_DURATION_BUCKETS = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1),
    *(0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0),
)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value`, as vLLM's `build_1_2_5_buckets`."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class ServerMetrics:
    """One server's metrics in its own registry, so several servers can share a process."""

    def __init__(self, model_name: str, max_model_len: int, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = (model_name, str(engine_index))
        self._build_vllm_gauges_and_counters(model_name)
        self._build_vllm_histograms(max_model_len)
        self._build_own()

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, LABEL_NAMES, registry=self.registry).labels(*self._labels)

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, LABEL_NAMES, registry=self.registry).labels(*self._labels)

    def _histogram(self, name: str, doc: str, buckets: Any) -> Any:
        hist = Histogram(name, doc, LABEL_NAMES, registry=self.registry, buckets=buckets)
        return hist.labels(*self._labels)

    def _build_vllm_gauges_and_counters(self, model_name: str) -> None:
        self.running = self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABEL_NAMES, "finished_reason"),
            registry=self.registry,
        )
        self.success = {r: success.labels(*self._labels, r) for r in FINISH_REASONS}

    def _build_vllm_histograms(self, max_model_len: int) -> None:
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = self._histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = self._histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        phases = {
            "e2e": ("vllm:e2e_request_latency_seconds", "e2e request latency in seconds."),
            "queue": ("vllm:request_queue_time_seconds", "time spent in WAITING phase"),
            "inference": ("vllm:request_inference_time_seconds", "time spent in RUNNING phase"),
            "prefill": ("vllm:request_prefill_time_seconds", "time spent in PREFILL phase"),
            "decode": ("vllm:request_decode_time_seconds", "time spent in DECODE phase"),
        }
        self.phase = {
            key: self._histogram(name, f"Histogram of {doc} for request.", REQUEST_LATENCY_BUCKETS)
            for key, (name, doc) in phases.items()
        }

    def _build_own(self) -> None:
        self.step_prefill_tokens = self._histogram(
            "engine_lite:step_prefill_tokens",
            "Prompt tokens (prefill chunks) scheduled in one engine step.",
            STEP_TOKENS_BUCKETS,
        )
        self.step_decode_tokens = self._histogram(
            "engine_lite:step_decode_tokens",
            "Decode tokens scheduled in one engine step.",
            STEP_TOKENS_BUCKETS,
        )
        self.prefill_tokens = self._counter(
            "engine_lite:prefill_tokens", "Prompt tokens computed, recomputation included."
        )
        self.decode_tokens = self._counter("engine_lite:decode_tokens", "Decode tokens computed.")
        self.steps = self._counter("engine_lite:steps", "Engine steps run.")
        self.step_duration = self._histogram(
            "engine_lite:step_duration_seconds",
            "Wall time of one engine step (schedule, forward, update).",
            STEP_DURATION_BUCKETS,
        )
        self.decode_stall = self._counter(
            "engine_lite:decode_stall_seconds",
            "Time running decodes waited for prefill work sharing their step.",
        )

    def on_step(self, step: StepStats) -> None:
        """Step listener: runs on the engine's step thread after every step."""
        self.steps.inc()
        self.iteration_tokens.observe(step.num_prefill_tokens + step.num_decode_tokens)
        self.step_prefill_tokens.observe(step.num_prefill_tokens)
        self.step_decode_tokens.observe(step.num_decode_tokens)
        self.prefill_tokens.inc(step.num_prefill_tokens)
        self.decode_tokens.inc(step.num_decode_tokens)
        self.step_duration.observe(step.step_duration_s)
        self.decode_stall.inc(step.decode_stall_s)
        if step.num_preemptions:
            self.preemptions.inc(step.num_preemptions)

    def on_finish(self, req: RequestStats) -> None:
        """Finish listener: the per-request histograms, with vLLM V1's phase boundaries."""
        reason = req.finish_reason if req.finish_reason in self.success else "abort"
        self.success[reason].inc()
        self.phase["e2e"].observe(req.finish_time_s - req.arrival_time_s)
        self.request_prompt_tokens.observe(req.num_prompt_tokens)
        self.request_generation_tokens.observe(req.num_output_tokens)
        scheduled = req.first_scheduled_time_s
        if scheduled is not None:
            self.phase["queue"].observe(scheduled - req.arrival_time_s)
            self.phase["inference"].observe(req.finish_time_s - scheduled)
        first = req.first_token_time_s
        if first is None:
            return
        self.ttft.observe(first - req.arrival_time_s)
        if scheduled is not None:
            self.phase["prefill"].observe(first - scheduled)
        times = req.token_times_s
        self.phase["decode"].observe((times[-1] if times else first) - first)
        for prev, cur in itertools.pairwise(times):
            self.itl.observe(cur - prev)

    def on_tokens(self, num_new_tokens: int, num_prompt_tokens: int, first: bool) -> None:
        """Per token event on the server loop: the token counters that drive throughput rates."""
        if first:
            self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_new_tokens)

    def render(self, stats: EngineStats) -> bytes:
        """The exposition text; gauges are read from the engine now, not from the last step.

        An abort frees its KV blocks without a step, so only a fresh read shows an idle
        server's KV usage at 0.
        """
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        return generate_latest(self.registry)
