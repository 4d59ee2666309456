"""LLMEngine and LLM: stop conditions, stats, validation, and the real tiny model end to end."""

import pytest

from engine_lite import LLM, EngineConfig, EngineLiteError, SamplingParams
from engine_lite.engine import LLMEngine

VOCAB = 997


def _engine(fakes, clock=None, eos=None, max_model_len=1024, **knobs):
    runner = fakes.Runner(max_model_len=max_model_len, eos_token_id=eos, clock=clock)
    kwargs = {"clock": clock} if clock is not None else {}
    return LLMEngine(EngineConfig(**knobs), runner=runner, **kwargs), runner


def _run(engine):
    finished = {}
    while engine.has_unfinished():
        for stats in engine.step().finished:
            finished[stats.request_id] = stats
    return finished


def _first_tokens(fakes, prompt, n):
    out, _ = fakes.reference_generate(prompt, SamplingParams(max_tokens=n), VOCAB, None, 10**9)
    return out


# ---- stop conditions -------------------------------------------------------------------


def test_eos_stops_after_min_tokens_and_ignore_eos_runs_to_max_tokens(fakes):
    prompt = [5, 6, 7]
    ref = _first_tokens(fakes, prompt, 6)
    eos = ref[1]  # the 2nd generated token is EOS
    engine, _ = _engine(fakes, eos=eos)
    stop = engine.add_request(prompt, SamplingParams(max_tokens=6))
    late = engine.add_request(prompt, SamplingParams(max_tokens=6, min_tokens=3))
    ignore = engine.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    done = _run(engine)
    assert stop.output_token_ids == ref[:2] and done[stop.request_id].finish_reason == "stop"
    # EOS before min_tokens is just a token (the real sampler masks it; the fake does not).
    assert len(late.output_token_ids) >= 3
    assert ignore.output_token_ids == ref and done[ignore.request_id].finish_reason == "length"


def test_stop_token_ids_and_max_model_len(fakes):
    prompt = [9, 8, 7, 6]
    ref = _first_tokens(fakes, prompt, 5)
    engine, _ = _engine(fakes, max_model_len=8)
    a = engine.add_request(prompt, SamplingParams(max_tokens=4, stop_token_ids=[ref[2]]))
    b = engine.add_request(prompt, SamplingParams(max_tokens=4))
    done = _run(engine)
    assert a.output_token_ids == ref[:3] and done[a.request_id].finish_reason == "stop"
    assert b.output_token_ids == ref[:4] and done[b.request_id].finish_reason == "length"
    with pytest.raises(EngineLiteError, match="over max_model_len=8"):
        engine.add_request(prompt, SamplingParams(max_tokens=5))


@pytest.mark.parametrize(
    ("prompt", "match"),
    [([], "non-empty"), ([1, 2, VOCAB], "outside the vocabulary"), ([1, -1], "-1"), ("hi", "hi")],
)
def test_bad_prompts_are_refused_with_one_line(fakes, prompt, match):
    engine, _ = _engine(fakes)
    with pytest.raises(EngineLiteError, match=match):
        engine.add_request(prompt, SamplingParams())
    assert not engine.has_unfinished()


# ---- stats -----------------------------------------------------------------------------


def test_step_and_request_stats_follow_the_injected_clock(fakes):
    clock = fakes.Clock()
    engine, runner = _engine(
        fakes,
        clock=clock,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        long_prefill_token_threshold=8,
    )
    a = engine.add_request([1] * 4, SamplingParams(max_tokens=3))
    first = engine.step()  # a: prefill 4
    b = engine.add_request([2] * 20, SamplingParams(max_tokens=2))
    mixed = engine.step()  # a: decode 1, b: prefill chunk 8
    s = mixed.stats
    assert (s.num_decode_tokens, s.num_prefill_tokens) == (1, 8)
    assert (s.num_decode_reqs, s.num_prefill_reqs) == (1, 1)
    assert s.forward_duration_s == pytest.approx(0.001 + 0.0001 * 9)
    assert s.step_duration_s == pytest.approx(s.forward_duration_s)  # clock moves only in forward
    assert s.decode_stall_s == pytest.approx(s.step_duration_s * 8 / 9)
    assert first.stats.decode_stall_s == 0.0  # prefill only: no decode waited
    assert s.num_running == 2 and s.num_waiting == 0 and 0 < s.kv_cache_usage < 1
    done = _run(engine)
    sa = done[a.request_id]
    assert sa.arrival_time_s == 100.0 and sa.first_scheduled_time_s == 100.0
    assert sa.first_token_time_s == first.stats.time_s
    assert len(sa.token_times_s) == 3 and sa.token_times_s == sorted(sa.token_times_s)
    assert sa.finish_time_s == sa.token_times_s[-1]
    assert (sa.num_prompt_tokens, sa.num_output_tokens) == (4, 3)
    assert done[b.request_id].first_scheduled_time_s == mixed.stats.time_s - s.step_duration_s
    assert sorted(runner.released) == sorted([a.request_id, b.request_id])
    assert engine.stats().num_steps_total == len(runner.batches)


def test_reconfigure_swaps_scheduler_only_when_idle(fakes):
    engine, runner = _engine(fakes, max_num_batched_tokens=64, max_num_seqs=4)
    engine.add_request([1] * 10, SamplingParams(max_tokens=2))
    new = engine.config.replace(max_num_batched_tokens=8, policy="prefill_first")
    with pytest.raises(EngineLiteError, match="idle"):
        engine.reconfigure(new)
    _run(engine)
    with pytest.raises(EngineLiteError, match="cannot change model"):
        engine.reconfigure(engine.config.replace(model="other"))
    engine.reconfigure(new)
    engine.add_request([1] * 10, SamplingParams(max_tokens=1))
    engine.step()
    assert [n for _, _, n in runner.batches[-1]] == [8]
    assert engine.runner is runner


# ---- LLM offline API -------------------------------------------------------------------


def test_llm_generate_keeps_prompt_order_and_accepts_per_prompt_params(fakes):
    llm = LLM(runner=fakes.Runner(), max_num_batched_tokens=16, max_num_seqs=2)
    prompts = [[i + 1] * (5 + 7 * i) for i in range(5)]
    params = [SamplingParams(max_tokens=1 + i) for i in range(5)]
    outs = llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outs] == prompts
    for i, out in enumerate(outs):
        assert out.outputs[0].token_ids == _first_tokens(fakes, prompts[i], 1 + i)
        assert out.outputs[0].finish_reason == "length" and out.finished
    single = llm.generate([3, 4, 5], SamplingParams(max_tokens=2))
    assert len(single) == 1 and single[0].prompt_token_ids == [3, 4, 5]


def test_llm_rejects_bad_batches_before_running_any(fakes):
    llm = LLM(runner=fakes.Runner(), max_num_batched_tokens=16, max_num_seqs=2)
    with pytest.raises(EngineLiteError, match="2 sampling params for 3 prompts"):
        llm.generate([[1], [2], [3]], [SamplingParams(), SamplingParams()])
    with pytest.raises(EngineLiteError, match="outside the vocabulary"):
        llm.generate([[1, 2], [5000]])
    assert not llm.engine.has_unfinished()
    with pytest.raises(EngineLiteError, match="max_batch_tokens"):
        LLM(runner=fakes.Runner(), max_batch_tokens=4)


# ---- the real tiny model (CPU) ----------------------------------------------------------

_TINY = {"device": "cpu", "max_model_len": 1024, "num_gpu_blocks_override": 256}
_PROMPTS = [
    [(17 * i + 3 * j) % 4000 + 1 for j in range(n)] for i, n in enumerate([5, 90, 300, 33, 160, 1])
]


def _greedy(llm, max_tokens=12):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return [o.outputs[0].token_ids for o in llm.generate(_PROMPTS, params)]


@pytest.fixture(scope="module")
def tiny_reference():
    llm = LLM("tiny", enable_chunked_prefill=False, max_num_batched_tokens=1024, **_TINY)
    return _greedy(llm)


def test_tiny_end_to_end(tiny_reference):
    assert [len(t) for t in tiny_reference] == [12] * len(_PROMPTS)
    assert len({tuple(t) for t in tiny_reference}) == len(_PROMPTS)  # prompts matter


@pytest.mark.parametrize(
    "knobs",
    [
        {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        {"max_num_batched_tokens": 64, "max_num_seqs": 8, "long_prefill_token_threshold": 17},
        {"max_num_batched_tokens": 48, "max_num_seqs": 4, "policy": "prefill_first"},
        {
            "max_num_batched_tokens": 96,
            "max_num_seqs": 8,
            "long_prefill_token_threshold": 40,
            "long_prefill_token_threshold_adaptive": True,
        },
    ],
)
def test_tiny_chunked_equals_unchunked_greedy(tiny_reference, knobs):
    llm = LLM("tiny", **_TINY, **knobs)
    assert _greedy(llm) == tiny_reference


def test_tiny_preemption_loses_no_tokens(tiny_reference):
    # 41 blocks of 16: prompts are admitted only when they fit whole, as in vLLM, but the
    # running decodes then outgrow the cache and are preempted and recomputed.
    knobs = {**_TINY, "num_gpu_blocks_override": 41}
    llm = LLM("tiny", max_num_batched_tokens=128, max_num_seqs=8, **knobs)
    assert _greedy(llm) == tiny_reference
    assert llm.engine.stats().num_preemptions_total > 0
    assert llm.engine.stats().kv_cache_usage == 0.0


def test_tiny_seeded_sampling_is_reproducible_across_chunking_and_preemption():
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=i) for i in range(6)]
    a = LLM("tiny", max_num_batched_tokens=1024, max_num_seqs=8, **_TINY).generate(_PROMPTS, params)
    small = {**_TINY, "num_gpu_blocks_override": 22}  # one running decode gets preempted
    chunked = LLM("tiny", max_num_batched_tokens=32, max_num_seqs=8, **small)
    b = chunked.generate(_PROMPTS, params)
    assert chunked.engine.stats().num_preemptions_total > 0
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
