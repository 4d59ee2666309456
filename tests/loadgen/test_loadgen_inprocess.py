"""The in-process driver against the real `tiny` engine: the same records as over HTTP."""

from __future__ import annotations

import pytest

from engine_lite import EngineConfig
from engine_lite.async_engine import AsyncEngine
from loadgen import (
    InProcessTarget,
    LoadgenError,
    RequestSpec,
    arrival_offsets,
    build_workload,
    replay,
)
from slo import compute_metrics, evaluate, parse_slo

_TINY = {"device": "cpu", "max_model_len": 512, "num_gpu_blocks_override": 96}


@pytest.fixture
async def engine():
    eng = AsyncEngine(EngineConfig(max_num_batched_tokens=128, max_num_seqs=8, **_TINY))
    await eng.start()
    yield eng
    await eng.shutdown()


async def test_replay_records_every_token_with_the_engines_timestamps(engine):
    finished = []
    engine.add_finish_listener(finished.append)
    wl = build_workload("mixed", num_requests=8, seed=0, max_model_len=512)
    for spec in wl.requests:
        spec.output_len = min(spec.output_len, 6)
    offsets = arrival_offsets("poisson", 50.0, 8, seed=0)
    res = await replay(InProcessTarget(engine), wl.requests, offsets, warmup=1)
    assert [r.index for r in res.records] == list(range(8))
    for rec, spec in zip(res.records, wl.requests, strict=True):
        assert rec.success, rec.error
        assert rec.output_tokens == sum(rec.chunk_tokens) == spec.output_len
        assert rec.prompt_tokens == spec.prompt_len
        assert rec.sent_s <= rec.chunk_times_s[0]
        assert rec.chunk_times_s == sorted(rec.chunk_times_s)
    # The records' chunk times are the engine's own per-token times.
    by_index = {int(s.request_id.rsplit("-", 1)[1]): s for s in finished}
    for rec in res.records:
        assert by_index[rec.index].token_times_s == rec.chunk_times_s
    m = compute_metrics(res.records)
    assert (m.completed, m.failed) == (7, 0)
    assert set(m.per_class) <= {"short", "long"}
    assert evaluate(res.records, parse_slo("ttft_p99=60s")).met


async def test_engine_rejections_and_timeouts_are_failed_records(engine):
    too_long = RequestSpec(0, [5] * 500, 100, "long")  # 600 tokens > max_model_len 512
    slow = RequestSpec(1, [5] * 64, 440, "short")  # 440 steps cannot fit in 0.1 s
    ok = RequestSpec(2, [6] * 16, 2, "short")
    res = await replay(
        InProcessTarget(engine), [too_long, slow, ok], [0.0, 0.0, 0.0], timeout_s=0.1
    )
    first, second, third = res.records
    assert first.error.startswith("engine rejected the request: ") and "\n" not in first.error
    assert second.error.startswith("timeout after 0.1 s")
    assert not second.success and second.output_tokens < 440
    assert third.success
    assert engine.stats().num_running == 0  # the timed-out request was aborted, KV freed


async def test_the_same_engine_serves_replay_after_replay(engine):
    target = InProcessTarget(engine)
    specs = [RequestSpec(i, [7 + i] * 8, 2, "short") for i in range(3)]
    for _ in range(2):  # request ids stay unique across replays
        res = await replay(target, specs, [0.0, 0.0, 0.0])
        assert all(r.success for r in res.records)


async def test_in_process_target_cannot_use_worker_processes(engine):
    with pytest.raises(LoadgenError, match="use workers=1"):
        await replay(
            InProcessTarget(engine), [RequestSpec(0, [5], 1, "short")] * 2, [0, 0], workers=2
        )
