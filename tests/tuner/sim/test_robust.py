"""The traffic band: request lists with more or fewer long prompts, and --robust's choice."""

from loadgen import build_workload
from tuner.search.choice import choose_robust
from tuner.sim.robust import long_fraction, reshaped
from tuner.store.records import Candidate, Role


def test_a_reshaped_list_moves_only_the_long_prompt_fraction():
    requests = build_workload("mixed", num_requests=200, seed=0).requests
    base = long_fraction(requests)
    assert 0 < base < 1
    originals = {tuple(r.prompt_token_ids) for r in requests}
    for factor in (0.5, 1.5):
        cell = reshaped(requests, factor, seed=0)
        assert len(cell) == len(requests) and [r.index for r in cell] == list(range(200))
        assert abs(long_fraction(cell) - base * factor) <= 1 / 200
        assert {tuple(r.prompt_token_ids) for r in cell} <= originals  # the workload's own
    assert reshaped(requests, 1.5, seed=0) == reshaped(requests, 1.5, seed=0)  # seeded
    assert reshaped(requests, 1.0, seed=0) == list(requests)


def _candidate(trial: int, confirmed_rps: float, search_value: float = 0.0) -> Candidate:
    return Candidate(trial, Role.SCREENED, {}, search_value, None, 1, confirmed_rps)  # type: ignore[arg-type]


def test_robust_picks_the_best_worst_case_among_configs_that_clear():
    fast_but_fragile = _candidate(1, 9.0)
    steady = _candidate(2, 7.0)
    best_worst_but_unconfirmed = _candidate(3, 0.0, 8.0)
    band = {"configs": [{"trial": 1, "worst_rps": 3.0}, {"trial": 2, "worst_rps": 5.0},
                        {"trial": 3, "worst_rps": 6.0}]}  # fmt: skip
    candidates = [fast_but_fragile, steady, best_worst_but_unconfirmed]
    assert choose_robust(candidates, band) is steady
    # Without a band there is nothing to be robust by: the fastest confirmed config.
    assert choose_robust(candidates, None) is fast_but_fragile
