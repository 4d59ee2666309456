"""Arrival processes: seeded, exactly rate-scaled, with vLLM's burstiness convention."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from loadgen import LoadgenError, arrival_offsets, arrival_pattern


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_same_seed_same_list_and_rate_scales_one_pattern(kind):
    a = arrival_offsets(kind, 4.0, 100, seed=3, burstiness=1.0 if kind == "poisson" else 0.5)
    b = arrival_offsets(kind, 4.0, 100, seed=3, burstiness=1.0 if kind == "poisson" else 0.5)
    assert a == b
    pattern = arrival_pattern(kind, 100, seed=3, burstiness=1.0 if kind == "poisson" else 0.5)
    assert a == [t / 4.0 for t in pattern]  # every rate of a search replays the same pattern
    assert a[-1] == pytest.approx(100 / 4.0)  # vLLM rescales so the realized rate is exact
    assert all(y >= x for x, y in itertools.pairwise(a))


def test_other_seed_other_list():
    assert arrival_offsets("poisson", 2.0, 50, seed=0) != arrival_offsets(
        "poisson", 2.0, 50, seed=1
    )


def test_burstiness_sets_the_spread_of_gaps():
    def cv(b: float) -> float:
        gaps = np.diff([0.0, *arrival_offsets("gamma", 10.0, 4000, seed=0, burstiness=b)])
        return float(gaps.std() / gaps.mean())

    # Gamma with shape k has a coefficient of variation of 1/sqrt(k).
    assert cv(0.25) == pytest.approx(2.0, rel=0.15)
    assert cv(1.0) == pytest.approx(1.0, rel=0.1)
    assert cv(4.0) == pytest.approx(0.5, rel=0.1)


def test_constant_and_infinite_burstiness_are_evenly_spaced():
    assert arrival_offsets("constant", 2.0, 4) == [0.5, 1.0, 1.5, 2.0]
    assert arrival_offsets("gamma", 2.0, 4, burstiness=math.inf) == [0.5, 1.0, 1.5, 2.0]


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets("poisson", math.inf, 3) == [0.0, 0.0, 0.0]


def test_trace_keeps_its_shape_at_any_rate():
    ts = [0.0, 1.0, 1.5, 4.0]
    assert arrival_offsets("trace", None, 4, timestamps=ts) == ts
    assert arrival_offsets("trace", None, 4, timestamps=ts, time_scale=0.5) == [0, 0.5, 0.75, 2.0]
    fast = arrival_offsets("trace", 2.0, 4, timestamps=ts)
    assert fast == pytest.approx([0.0, 0.5, 0.75, 2.0])  # last at n / rate = 2 s


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        (("poisson", 0.0, 5), {}, "rate=0.0"),
        (("poisson", 2.0, 5), {"burstiness": 0.5}, "gamma"),
        (("gamma", 2.0, 5), {"burstiness": -1.0}, "burstiness=-1.0"),
        (("uniform", 2.0, 5), {}, "'uniform'"),
        (("trace", None, 5), {}, "5 timestamps"),
        (("trace", None, 2), {"timestamps": [1.0, 0.0]}, "backwards"),
        (("poisson", 2.0, 0), {}, "n=0"),
    ],
)
def test_bad_arrival_arguments(args, kwargs, named):
    with pytest.raises(LoadgenError, match=named):
        arrival_offsets(*args, **kwargs)
