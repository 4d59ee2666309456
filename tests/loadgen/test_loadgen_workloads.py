"""Workload presets, `random` and the bundled trace: reproducible, sized to the model, realistic."""

from __future__ import annotations

import re

import numpy as np
import pytest

from loadgen import LoadgenError, build_workload
from loadgen.workloads import FIRST_PROMPT_TOKEN_ID

PRESETS = ("chat", "code", "rag", "summarize", "agent", "mixed")


def _lens(wl):
    return np.array([r.prompt_len for r in wl.requests]), np.array(
        [r.output_len for r in wl.requests]
    )


@pytest.mark.parametrize("name", [*PRESETS, "random"])
def test_same_seed_same_requests_other_seed_other_requests(name):
    a = build_workload(name, num_requests=50, seed=7)
    b = build_workload(name, num_requests=50, seed=7)
    c = build_workload(name, num_requests=50, seed=8, range_ratio=0.5)
    assert a.fingerprint() == b.fingerprint()
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert a.fingerprint() != c.fingerprint()


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize(("max_model_len", "vocab"), [(8192, 4096), (2048, 32000)])
def test_requests_fit_the_model_and_its_vocabulary(name, max_model_len, vocab):
    wl = build_workload(
        name, num_requests=120, seed=1, max_model_len=max_model_len, vocab_size=vocab
    )
    assert len(wl.requests) == 120
    assert [r.index for r in wl.requests] == list(range(120))
    for r in wl.requests:
        assert r.prompt_len + r.output_len <= max_model_len
        assert r.output_len >= 1
        assert min(r.prompt_token_ids) >= FIRST_PROMPT_TOKEN_ID
        assert max(r.prompt_token_ids) < vocab
        assert r.class_name == ("long" if r.prompt_len > max_model_len // 8 else "short")


def test_presets_differ_the_way_their_traffic_does():
    mean = {n: [x.mean() for x in _lens(build_workload(n, 300, seed=0))] for n in PRESETS}
    assert mean["rag"][0] > 4 * mean["chat"][0]  # long context in
    assert mean["summarize"][1] > 2 * mean["rag"][1]  # long summaries out
    assert mean["code"][1] < mean["chat"][1] / 2  # short completions
    assert mean["chat"][0] < 600


def test_mixed_puts_short_answers_beside_a_minority_of_long_prompts():
    wl = build_workload("mixed", num_requests=600, seed=3)
    prompts, outputs = _lens(wl)
    assert 0.05 < (prompts >= 4096).mean() < 0.15  # the long-context minority
    assert prompts.max() > 6000  # long enough that one unchunked prefill stalls every decode
    assert np.median(prompts) < 600
    # Code completions: answers of a few tokens, which no stall can be averaged over.
    assert 0.2 < (outputs <= 32).mean() < 0.4
    assert np.median(outputs) > 64  # while most requests are chat


def test_smaller_context_shrinks_presets_larger_keeps_them():
    small = _lens(build_workload("summarize", 200, seed=0, max_model_len=2048))[0].mean()
    ref = _lens(build_workload("summarize", 200, seed=0, max_model_len=8192))[0].mean()
    big = _lens(build_workload("summarize", 200, seed=0, max_model_len=131072))[0].mean()
    assert small < ref / 3
    assert big == ref
    stretched = build_workload("summarize", 200, seed=0, max_model_len=131072, length_scale=4.0)
    assert _lens(stretched)[0].mean() > 3 * ref


def test_agent_turns_extend_their_sessions_context():
    wl = build_workload("agent", num_requests=80, seed=2)
    prompts = [tuple(r.prompt_token_ids) for r in wl.requests]
    extends = 0
    for i, p in enumerate(prompts):
        if any(len(q) < len(p) and p[: len(q)] == q for q in prompts[:i]):
            extends += 1
    sessions = wl.params["sessions"]
    assert sessions < 40
    assert extends >= 80 - sessions  # every turn after a session's first grows its context


def test_random_follows_vllm_range_ratio_convention():
    wl = build_workload("random", 500, seed=0, input_len=1000, output_len=100, range_ratio=0.5)
    prompts, outputs = _lens(wl)
    assert prompts.min() >= 500 and prompts.max() <= 1500
    assert outputs.min() >= 50 and outputs.max() <= 150
    assert prompts.min() < 600 and prompts.max() > 1400  # uniform over the whole range
    exact = build_workload("random", 20, seed=0, input_len=333, output_len=7)
    assert set(_lens(exact)[0]) == {333} and set(_lens(exact)[1]) == {7}


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"name": "chatty"}, "'chatty'"),
        ({"name": "random", "range_ratio": 1.0}, "range_ratio=1.0"),
        ({"name": "random", "input_len": 0}, "input_len=0"),
        ({"name": "chat", "num_requests": 0}, "num_requests=0"),
        ({"name": "chat", "vocab_size": 3}, "vocab_size=3"),
        ({"name": "chat", "length_scale": -1.0}, "length_scale=-1.0"),
    ],
)
def test_bad_arguments_raise_loadgen_error_naming_the_value(kwargs, named):
    with pytest.raises(LoadgenError, match=named.replace("(", r"\(")):
        build_workload(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"seed": -1}, "seed=-1"),
        ({"length_scale": 1e300}, "length_scale=1e+300"),  # lengths overflowed to negative
        ({"length_scale": float("nan")}, "length_scale=nan"),
    ],
)
def test_bad_seed_or_scale_is_one_clear_error(kwargs, named):
    with pytest.raises(LoadgenError, match=re.escape(named)):
        build_workload("agent", num_requests=3, **kwargs)
