"""AsyncEngine: streaming, abort (KV freed at once), early exit, reconfigure, listeners,
idle behaviour and failure, with the fake runner and with the real tiny model."""

import asyncio
import contextlib
import os
import threading

import pytest

from engine_lite import LLM, AsyncEngine, EngineConfig, EngineLiteError, SamplingParams

VOCAB = 997


def _engine(fakes, sleep_s=0.001, **knobs):
    knobs = {"max_num_batched_tokens": 64, "max_num_seqs": 8, **knobs}
    return AsyncEngine(EngineConfig(**knobs), runner=fakes.Runner(sleep_s=sleep_s))


async def _collect(gen):
    return [ev async for ev in gen]


async def _wait_for(predicate, what):
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


async def test_streams_every_token_in_order_with_step_end_times(fakes):
    engine = _engine(fakes)
    steps, finished = [], []
    engine.add_step_listener(steps.append)
    engine.add_finish_listener(finished.append)
    await engine.start()
    prompts = [[i + 1] * (3 + 20 * i) for i in range(5)]
    params = SamplingParams(max_tokens=6)
    streams = [engine.generate(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(_collect(s) for s in streams))
    for prompt, events in zip(prompts, results, strict=True):
        want, _ = fakes.reference_generate(prompt, params, VOCAB, None, 10**9)
        assert [t for ev in events for t in ev.token_ids] == want
        assert [ev.num_output_tokens for ev in events] == list(range(1, 7))
        assert [ev.finished for ev in events] == [False] * 5 + [True]
        assert events[-1].finish_reason == "length" and events[0].num_prompt_tokens == len(prompt)
        times = [ev.time_s for ev in events]
        assert times == sorted(times) and len(set(times)) == len(times)
    await _wait_for(lambda: len(finished) == 5, "finish listeners")
    assert sorted(s.request_id for s in finished) == [f"r{i}" for i in range(5)]
    step_times = {s.time_s for s in steps}
    assert all(ev.time_s in step_times for events in results for ev in events)
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
    assert stats.num_steps_total == len(steps)
    await engine.shutdown()


async def test_generate_refuses_bad_input_at_the_call(fakes):
    engine = _engine(fakes)
    with pytest.raises(EngineLiteError, match="non-empty"):
        engine.generate([], SamplingParams())
    with pytest.raises(EngineLiteError, match="outside the vocabulary"):
        engine.generate([VOCAB + 5], SamplingParams())
    with pytest.raises(EngineLiteError, match="max_model_len=1024"):
        engine.generate([1] * 1000, SamplingParams(max_tokens=100))
    await engine.shutdown()


async def _until_kv_free(engine, timeout_s: float = 5.0) -> None:
    """An abort frees blocks when the step in flight ends (milliseconds here), never mid-step."""
    async with asyncio.timeout(timeout_s):
        while engine.stats().kv_cache_usage:
            await asyncio.sleep(0.001)


async def test_abort_ends_the_stream_at_once_and_frees_kv_blocks_by_the_step_end(fakes):
    engine = _engine(fakes, sleep_s=0.003)
    aborted = asyncio.Event()
    loop = asyncio.get_running_loop()
    engine.add_finish_listener(
        lambda s: s.finish_reason == "abort" and loop.call_soon_threadsafe(aborted.set)
    )
    gen = engine.generate([7] * 40, SamplingParams(max_tokens=500), request_id="victim")
    events = []
    async for ev in gen:
        events.append(ev)
        if len(events) == 3:
            assert engine.stats().kv_cache_usage > 0
            await engine.abort("victim")
            assert engine.stats().num_running == 0
    await _until_kv_free(engine)
    assert events[-1].finished and events[-1].finish_reason == "abort"
    assert events[-1].token_ids == [] and len(events) < 20
    await asyncio.wait_for(aborted.wait(), 5)
    await engine.abort("victim")  # already gone: ignored
    await engine.shutdown()


async def test_leaving_the_stream_early_aborts_the_request(fakes):
    engine = _engine(fakes, sleep_s=0.002)
    async with contextlib.aclosing(engine.generate([3] * 10, SamplingParams(max_tokens=400))) as g:
        async for _ in g:
            break
    assert engine.stats().num_running == 0
    await _until_kv_free(engine)

    first = asyncio.Event()

    async def consume():
        async for _ in engine.generate([4] * 10, SamplingParams(max_tokens=400)):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    await _until_kv_free(engine)
    await engine.shutdown()


async def test_reconfigure_waits_for_idle_then_applies_new_knobs(fakes):
    engine = _engine(fakes, sleep_s=0.002, max_num_batched_tokens=64)
    runner = engine._engine.runner
    await engine.start()
    busy = asyncio.create_task(_collect(engine.generate([1] * 50, SamplingParams(max_tokens=20))))
    await _wait_for(lambda: engine.stats().num_running == 1, "request running")
    reconf = asyncio.create_task(
        engine.reconfigure(max_num_batched_tokens=8, policy="prefill_first")
    )
    await asyncio.sleep(0.01)
    # A request arriving now waits until the swap, then runs under the new budget.
    late = asyncio.create_task(_collect(engine.generate([2] * 30, SamplingParams(max_tokens=2))))
    await asyncio.sleep(0.01)
    assert not reconf.done() and engine.config.max_num_batched_tokens == 64
    await reconf
    assert busy.done() and len(busy.result()) == 20
    assert engine.config.max_num_batched_tokens == 8
    assert engine.config.policy.value == "prefill_first"
    assert len(await late) == 2
    assert max(n for batch in runner.batches[-6:] for _, _, n in batch) <= 8
    assert engine._engine.runner is runner  # same weights and KV tensors
    with pytest.raises(EngineLiteError, match="'device'"):
        await engine.reconfigure(device="cpu")
    with pytest.raises(EngineLiteError, match="max_num_seqs=64"):
        await engine.reconfigure(max_num_seqs=64)
    await engine.shutdown()


def _thread_cpu_ticks(thread: threading.Thread) -> int | None:
    path = f"/proc/self/task/{thread.native_id}/stat"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def test_idle_step_thread_sleeps_instead_of_spinning(fakes):
    engine = _engine(fakes)
    await engine.start()
    await _collect(engine.generate([1, 2, 3], SamplingParams(max_tokens=3)))
    steps = engine.stats().num_steps_total
    before = _thread_cpu_ticks(engine._thread)
    await asyncio.sleep(0.3)
    assert engine.stats().num_steps_total == steps
    if before is not None:
        assert _thread_cpu_ticks(engine._thread) - before <= 2  # clock ticks, 10 ms each
    await engine.shutdown()
    assert not engine._thread.is_alive()


async def test_shutdown_ends_streams_in_flight_with_abort(fakes):
    engine = _engine(fakes, sleep_s=0.002)
    first = asyncio.Event()
    events = []

    async def consume():
        async for ev in engine.generate([5] * 8, SamplingParams(max_tokens=1000)):
            events.append(ev)
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    await engine.shutdown()
    await asyncio.wait_for(task, 5)
    assert events[-1].finish_reason == "abort"


async def test_a_failing_forward_fails_the_streams_instead_of_hanging(fakes):
    class BrokenRunner(fakes.Runner):
        def execute(self, batch):
            raise RuntimeError("device lost")

    engine = AsyncEngine(EngineConfig(max_num_batched_tokens=64, max_num_seqs=8), BrokenRunner())
    with pytest.raises(RuntimeError, match="device lost"):
        await asyncio.wait_for(_collect(engine.generate([1, 2], SamplingParams())), 5)
    with pytest.raises(EngineLiteError, match="stopped after an error"):
        await _collect(engine.generate([1, 2], SamplingParams()))
    await engine.shutdown()


# ---- the real tiny model ------------------------------------------------------------------

_TINY = {"device": "cpu", "max_model_len": 1024, "num_gpu_blocks_override": 128}


async def test_tiny_streams_match_offline_greedy_and_abort_empties_the_cache():
    prompts = [[(11 * i + j) % 4000 + 1 for j in range(20 + 60 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    engine = AsyncEngine(EngineConfig(max_num_batched_tokens=32, max_num_seqs=4, **_TINY))
    runner = engine._engine.runner
    kv_ids = [id(t) for t in runner.kv_caches] if hasattr(runner, "kv_caches") else []
    await engine.start()
    streamed = await asyncio.gather(*(_collect(engine.generate(p, params)) for p in prompts))
    offline = await asyncio.to_thread(
        lambda: LLM(
            "tiny", enable_chunked_prefill=False, max_num_batched_tokens=1024, **_TINY
        ).generate(prompts, params)
    )
    assert [[t for ev in evs for t in ev.token_ids] for evs in streamed] == [
        o.outputs[0].token_ids for o in offline
    ]

    gen = engine.generate(prompts[2], SamplingParams(max_tokens=800), request_id="long")
    async for ev in gen:
        if ev.num_output_tokens == 2:
            await engine.abort("long")
    assert ev.finish_reason == "abort"
    await _until_kv_free(engine)

    await engine.reconfigure(max_num_batched_tokens=16, long_prefill_token_threshold=8)
    again = await asyncio.gather(*(_collect(engine.generate(p, params)) for p in prompts))
    assert [[t for ev in evs for t in ev.token_ids] for evs in again] == [
        [t for ev in evs for t in ev.token_ids] for evs in streamed
    ]
    assert engine._engine.runner is runner
    assert [id(t) for t in getattr(runner, "kv_caches", [])] == kv_ids
    await engine.shutdown()
