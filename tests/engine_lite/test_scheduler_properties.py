"""Property tests: random arrivals and knob values against the scheduler's promises.

Every example drives the real LLMEngine + Scheduler + BlockManager with the fake runner,
whose "KV cache" is addressed through the block tables, so any lost, stale or shared block
shows up as a wrong token.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine_lite import EngineConfig, SamplingParams
from engine_lite.engine import LLMEngine

VOCAB = 31  # small, so EOS and stop ids really occur
MAX_MODEL_LEN = 96


@dataclass(frozen=True)
class Arrival:
    step: int
    prompt: list[int]
    params: SamplingParams


@st.composite
def knobs(draw: st.DrawFn) -> dict:
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 12))
    low = MAX_MODEL_LEN if not chunked else max_num_seqs
    budget = draw(st.integers(low, max(low, 128)))
    out = {
        "max_num_batched_tokens": budget,
        "max_num_seqs": max_num_seqs,
        "enable_chunked_prefill": chunked,
        "policy": draw(st.sampled_from(["decode_first", "prefill_first"])),
    }
    threshold = draw(st.sampled_from([0, 1, 3, 8, 20, budget]))
    out["long_prefill_token_threshold"] = min(threshold, MAX_MODEL_LEN)
    out["long_prefill_token_threshold_adaptive"] = draw(st.booleans())
    return out


@st.composite
def arrivals(draw: st.DrawFn) -> list[Arrival]:
    n = draw(st.integers(1, 14))
    out = []
    for i in range(n):
        prompt_len = draw(st.integers(1, 48))
        max_tokens = draw(st.integers(1, min(24, MAX_MODEL_LEN - prompt_len)))
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(0, max_tokens)),
            ignore_eos=draw(st.booleans()),
            stop_token_ids=tuple(draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))),
        )
        prompt = [(i * 7 + j * 3) % VOCAB for j in range(prompt_len)]
        out.append(Arrival(draw(st.integers(0, 30)), prompt, params))
    return out


def _run(fakes, cfg_knobs, reqs, num_blocks, block_size, eos):
    runner = fakes.Runner(
        num_kv_blocks=num_blocks,
        block_size=block_size,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=VOCAB,
        eos_token_id=eos,
    )
    engine = LLMEngine(EngineConfig(**cfg_knobs), runner=runner)
    pending = sorted(enumerate(reqs), key=lambda p: p[1].step)
    requests = {}
    finished_at: dict[str, int] = {}
    total_tokens = sum(len(a.prompt) + a.params.max_tokens for a in reqs)
    step = 0
    # Generous bound: a livelock or a starved request runs into it and fails the test.
    limit = 40 * total_tokens + 100
    while pending or engine.has_unfinished():
        while pending and pending[0][1].step <= step:
            i, a = pending.pop(0)
            requests[str(i)] = engine.add_request(a.prompt, a.params, request_id=str(i))
        if engine.has_unfinished():
            num_batches = len(runner.batches)
            result = engine.step()
            # Progress: with requests in flight, every step runs something.
            assert len(runner.batches) == num_batches + 1, f"step {step} scheduled nothing"
            batch = runner.batches[-1]
            assert sum(n for _, _, n in batch) <= cfg_knobs["max_num_batched_tokens"]
            assert len(batch) <= cfg_knobs["max_num_seqs"]
            assert result.stats.num_running <= cfg_knobs["max_num_seqs"]
            assert all(n >= 1 for _, _, n in batch)
            for stats in result.finished:
                finished_at[stats.request_id] = step
        step += 1
        assert step < limit, f"no progress after {step} steps"
    return engine, runner, requests, finished_at


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg_knobs=knobs(),
    reqs=arrivals(),
    block_size=st.integers(1, 8),
    extra_blocks=st.integers(0, 40),
    eos=st.one_of(st.none(), st.integers(0, VOCAB - 1)),
)
def test_limits_hold_and_preemption_loses_no_tokens(
    fakes, cfg_knobs, reqs, block_size, extra_blocks, eos
):
    peak = max(len(a.prompt) + a.params.max_tokens - 1 for a in reqs)
    num_blocks = -(-peak // block_size) + extra_blocks  # the biggest request always fits
    engine, runner, requests, _ = _run(fakes, cfg_knobs, reqs, num_blocks, block_size, eos)
    preemptions = engine.stats().num_preemptions_total
    event("preempted" if preemptions else "no preemption")
    for rid, req in requests.items():
        a = reqs[int(rid)]
        want, reason = fakes.reference_generate(a.prompt, a.params, VOCAB, eos, MAX_MODEL_LEN)
        assert req.output_token_ids == want, f"request {rid} lost or changed tokens"
        assert req.status.finish_reason == reason
    assert engine.stats().kv_cache_usage == 0.0
    assert sorted(runner.released) == sorted(requests)


@settings(max_examples=200, deadline=None)
@given(
    short_every=st.integers(1, 3),
    short_len=st.integers(1, 6),
    long_len=st.integers(20, 80),
    budget=st.integers(8, 32),
    threshold=st.sampled_from([0, 4, 8]),
    adaptive=st.booleans(),
)
def test_decode_first_never_starves_a_long_prompt_under_a_stream_of_short_ones(
    fakes, short_every, short_len, long_len, budget, threshold, adaptive
):
    # An endless stream of short requests (one every `short_every` steps) around one long
    # prompt: under decode_first the long prompt must still finish, within a bound that does
    # not grow with the length of the stream.
    cfg = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=8,
        policy="decode_first",
        long_prefill_token_threshold=threshold,
        long_prefill_token_threshold_adaptive=adaptive,
    )
    runner = fakes.Runner(num_kv_blocks=512, block_size=4, max_model_len=128, vocab_size=VOCAB)
    engine = LLMEngine(cfg, runner=runner)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request([1] * short_len, params, request_id="s-first")
    long_req = engine.add_request([2] * long_len, params, request_id="long")
    # Short requests hold a slot at most short_len + 4 steps; 8 slots; the long one needs at
    # most long_len prefill steps plus 4 decodes once it runs.
    bound = 8 * (short_len + 4) + long_len + 8
    for step in range(bound):
        if step % short_every == 0:
            engine.add_request([3] * short_len, params, request_id=f"s{step}")
        engine.step()
        if long_req.status.is_finished:
            break
    assert long_req.status.is_finished, f"long prompt still {long_req.status} after {bound} steps"
