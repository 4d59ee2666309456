"""Focused tests of each scheduling policy and limit, read off the batches the runner saw."""

import pytest

from engine_lite import EngineConfig, EngineLiteError, SamplingParams
from engine_lite.engine import LLMEngine
from engine_lite.request import RequestStatus


def _engine(fakes, blocks=256, block_size=4, max_model_len=1024, **knobs):
    runner = fakes.Runner(num_kv_blocks=blocks, block_size=block_size, max_model_len=max_model_len)
    return LLMEngine(EngineConfig(**knobs), runner=runner), runner


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [(offset + i) % 997 for i in range(n)]


def _add(engine, rid, prompt_len, max_tokens=50, offset=0):
    params = SamplingParams(max_tokens=max_tokens)
    return engine.add_request(_prompt(prompt_len, offset), params, request_id=rid)


def _last_batch(runner):
    return [(rid, n) for rid, _, n in runner.batches[-1]]


def test_running_requests_go_first_in_admission_order_then_new_prompts(fakes):
    # vLLM V1: no decode/prefill phases; running requests (decodes and continuing chunks) in
    # admission order, then waiting prompts under what is left of the same budget.
    engine, runner = _engine(fakes, max_num_batched_tokens=8, max_num_seqs=4)
    _add(engine, "a", 3)
    _add(engine, "b", 3)
    engine.step()
    assert _last_batch(runner) == [("a", 3), ("b", 3)]
    _add(engine, "c", 20)
    engine.step()
    assert _last_batch(runner) == [("a", 1), ("b", 1), ("c", 6)]
    _add(engine, "d", 2)
    engine.step()  # c takes all that is left; d waits
    assert _last_batch(runner) == [("a", 1), ("b", 1), ("c", 6)]
    engine.step()
    assert _last_batch(runner) == [("a", 1), ("b", 1), ("c", 6)]
    engine.step()  # c's last chunk leaves room to admit d in the same step
    assert _last_batch(runner) == [("a", 1), ("b", 1), ("c", 2), ("d", 2)]


def test_prefill_first_extension_lets_prefill_take_the_budget_and_decodes_wait(fakes):
    engine, runner = _engine(
        fakes, max_num_batched_tokens=8, max_num_seqs=4, policy="prefill_first"
    )
    _add(engine, "a", 3)
    _add(engine, "b", 3)
    engine.step()
    _add(engine, "c", 20)
    engine.step()
    assert _last_batch(runner) == [("c", 8)]
    engine.step()
    assert _last_batch(runner) == [("c", 8)]
    engine.step()
    assert _last_batch(runner) == [("c", 4), ("a", 1), ("b", 1)]


def test_threshold_caps_each_request_but_not_one_alone(fakes):
    engine, runner = _engine(
        fakes, max_num_batched_tokens=16, max_num_seqs=4, long_prefill_token_threshold=4
    )
    _add(engine, "solo", 10, max_tokens=1)
    engine.step()  # alone in the engine: nobody to starve, so no cap
    assert _last_batch(runner) == [("solo", 10)]
    _add(engine, "a", 10)
    _add(engine, "b", 3)
    engine.step()
    assert _last_batch(runner) == [("a", 4), ("b", 3)]
    engine.step()
    assert _last_batch(runner) == [("a", 4), ("b", 1)]
    engine.step()
    assert _last_batch(runner) == [("a", 2), ("b", 1)]


def test_adaptive_threshold_is_floored_at_the_fair_share_of_the_budget(fakes):
    knobs = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "long_prefill_token_threshold": 2}
    fixed, fixed_runner = _engine(fakes, **knobs)
    adaptive, adaptive_runner = _engine(fakes, long_prefill_token_threshold_adaptive=True, **knobs)
    for engine in (fixed, adaptive):
        _add(engine, "a", 10)
        _add(engine, "b", 10)
        engine.step()
    assert _last_batch(fixed_runner) == [("a", 2), ("b", 2)]
    assert _last_batch(adaptive_runner) == [("a", 8), ("b", 8)]  # max(2, 16 // 2)


def test_a_prompt_is_admitted_only_when_all_of_it_fits_in_free_blocks(fakes):
    # 6 blocks of 4 tokens. a's 12-token prompt takes 3; b's 16 need 4, so b waits although
    # its first 4-token chunk would fit (vLLM's scheduler_reserve_full_isl).
    engine, runner = _engine(fakes, blocks=6, max_num_batched_tokens=16, max_num_seqs=4)
    _add(engine, "a", 12, max_tokens=2)
    _add(engine, "b", 16, max_tokens=2, offset=40)
    engine.step()
    assert _last_batch(runner) == [("a", 12)]
    engine.step()  # a's decode takes a 4th block; b still does not fit
    assert _last_batch(runner) == [("a", 1)]
    engine.step()  # a finished and freed its blocks
    assert _last_batch(runner) == [("b", 16)]
    assert engine.stats().num_preemptions_total == 0


def test_max_num_seqs_bounds_running_requests(fakes):
    engine, runner = _engine(fakes, max_num_batched_tokens=64, max_num_seqs=2)
    _add(engine, "a", 4, max_tokens=2)
    _add(engine, "b", 4, max_tokens=5)
    _add(engine, "c", 4, max_tokens=2)
    engine.step()
    assert _last_batch(runner) == [("a", 4), ("b", 4)]
    engine.step()  # a gets its 2nd token and finishes
    assert engine.scheduler.num_running == 1
    engine.step()
    assert _last_batch(runner) == [("b", 1), ("c", 4)]


def test_unchunked_prompt_is_scheduled_whole_or_waits_in_order(fakes):
    engine, runner = _engine(
        fakes,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        enable_chunked_prefill=False,
    )
    _add(engine, "a", 40, max_tokens=8)
    _add(engine, "b", 30, max_tokens=8)  # 40 + 30 > 64: waits whole, not chunked
    _add(engine, "c", 5, max_tokens=8)  # FCFS: does not jump over b
    engine.step()
    assert _last_batch(runner) == [("a", 40)]
    engine.step()
    assert _last_batch(runner) == [("a", 1), ("b", 30), ("c", 5)]


def test_unchunked_budget_below_max_model_len_is_rejected(fakes):
    runner = fakes.Runner(max_model_len=4096)
    cfg = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048)
    with pytest.raises(EngineLiteError, match="max_num_batched_tokens=2048"):
        LLMEngine(cfg, runner=runner)


def test_kv_exhaustion_preempts_the_newest_request_to_the_front_of_the_queue(fakes):
    # 6 blocks of 4 tokens: a and b take 3 blocks each after their prompts.
    engine, runner = _engine(fakes, blocks=6, max_num_batched_tokens=32, max_num_seqs=4)
    a = _add(engine, "a", 12, max_tokens=6)
    b = _add(engine, "b", 12, max_tokens=6, offset=50)
    c = _add(engine, "c", 2, max_tokens=2, offset=90)
    result = engine.step()
    assert _last_batch(runner) == [("a", 12), ("b", 12)]  # no block left for c
    assert [r.request_id for r in engine.scheduler.waiting] == ["c"]
    b_first = list(b.output_token_ids)
    result = engine.step()  # a's decode needs a 4th block: b, the newest, is preempted
    assert result.stats.num_preemptions == 1
    # c would fit now, but a step that preempted admits nothing.
    assert _last_batch(runner) == [("a", 1)]
    assert [r.request_id for r in engine.scheduler.waiting] == ["b", "c"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.block_table == [] and b.output_token_ids == b_first
    while engine.has_unfinished():
        engine.step()
    for req in (a, b, c):
        want, _ = fakes.reference_generate(
            req.prompt_token_ids, req.sampling_params, 997, None, 1024
        )
        assert req.output_token_ids == want
    assert engine.stats().num_preemptions_total >= 1


def test_request_larger_than_the_whole_cache_is_refused_at_add(fakes):
    engine, _ = _engine(fakes, blocks=4, block_size=4, max_num_batched_tokens=32, max_num_seqs=4)
    with pytest.raises(EngineLiteError, match="whole cache holds 16"):
        _add(engine, "big", 10, max_tokens=8)
    _add(engine, "fits", 10, max_tokens=7)  # 16 positions: exactly the cache


def test_abort_frees_blocks_at_once(fakes):
    engine, _ = _engine(fakes, blocks=16, max_num_batched_tokens=32, max_num_seqs=4)
    _add(engine, "a", 10, max_tokens=4)
    _add(engine, "b", 30, max_tokens=4)
    engine.step()
    assert engine.stats().kv_cache_usage > 0.5
    stats = engine.abort_request("a")
    assert stats is not None and stats.finish_reason == "abort"
    assert engine.abort_request("a") is None
    engine.abort_request("b")
    assert engine.stats().kv_cache_usage == 0.0
    assert not engine.has_unfinished()
