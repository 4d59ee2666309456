"""Search space: every suggested config is valid, known configs round-trip, bad flags explain."""

import optuna
import pytest
from optuna.trial import FixedTrial

from engine_lite import EngineConfig, Policy
from engine_lite.defaults import CPU_DEVICE
from tuner.errors import TuneError
from tuner.search.space import (
    Choices,
    IntRange,
    SpaceFacts,
    build_space,
    parse_fix,
    parse_param,
)
from tuner.targets.knobs import KnobSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)
# vLLM 0.32's CPU defaults (2048 / 128), as a built-in engine on this machine runs them.
DEFAULTS = EngineConfig().resolved(CPU_DEVICE, max_model_len=4096)[0].scheduler_knobs()
ENGINE = KnobSpace(DEFAULTS, frozenset(DEFAULTS), "vLLM 0.32's CPU default")
# A target with vLLM 0.32's knobs only: no policy.
VLLM_KNOBS = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
              "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive")  # fmt: skip
VLLM_LIKE = {k: DEFAULTS[k] for k in VLLM_KNOBS}
FACTS = SpaceFacts(block_size=16, max_model_len=4096, longest_prompt=3000)


def space(knob_space=ENGINE, **kw):
    return build_space(knob_space, FACTS, **kw)


def sampled_configs(sp, n=60):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(sp.suggest(trial))
        study.tell(trial, 0.0)
    return out


def test_default_space_covers_the_vllm_default_and_every_sample_is_a_valid_engine_config():
    sp = space()
    default = dict(DEFAULTS)
    assert (default["max_num_batched_tokens"], default["max_num_seqs"]) == (2048, 128)
    assert sp.expressible(default)
    for name, domain in sp.domains.items():  # the default lies inside every searched range
        if isinstance(domain, IntRange):
            assert domain.low <= default[name] <= domain.high
    budgets = set()
    for knobs in sampled_configs(sp):
        cfg = EngineConfig(**knobs)  # raises on any invalid combination
        assert cfg.max_num_batched_tokens % 16 == 0
        assert 256 <= cfg.max_num_batched_tokens <= 16384
        assert cfg.long_prefill_token_threshold <= cfg.max_num_batched_tokens
        budgets.add(cfg.max_num_batched_tokens)
    assert len(budgets) > 20  # a log-integer range, not a handful of values


@pytest.mark.parametrize(
    "knobs",
    [
        dict(DEFAULTS),
        {
            **DEFAULTS,
            "max_num_batched_tokens": 1024,
            "long_prefill_token_threshold": 256,
            "long_prefill_token_threshold_adaptive": True,
            "policy": Policy.PREFILL_FIRST,
        },
    ],
)
def test_known_configs_round_trip_through_optuna_params(knobs):
    sp = space()
    assert sp.suggest(FixedTrial(sp.to_params(knobs))) == knobs


def test_param_narrows_and_fix_pins():
    sp = space(
        params=dict(
            [parse_param("max_num_batched_tokens=512..2048"), parse_param("policy=prefill_first")]
        ),
        fixed=dict([parse_fix("long_prefill_token_threshold_adaptive=true")]),
    )
    for knobs in sampled_configs(sp, 30):
        assert 512 <= knobs["max_num_batched_tokens"] <= 2048
        assert knobs["policy"] is Policy.PREFILL_FIRST
        # pinned on, it stays on wherever a threshold is on (it only floors a threshold)
        assert knobs["long_prefill_token_threshold_adaptive"] == bool(
            knobs["long_prefill_token_threshold"]
        )
    assert "long_prefill_token_threshold_adaptive" not in sp.domains


def test_param_adds_max_num_seqs_and_budget_stays_above_it():
    sp = space(params=dict([parse_param("max_num_seqs=32,512")]))
    for knobs in sampled_configs(sp, 30):
        assert knobs["max_num_batched_tokens"] >= knobs["max_num_seqs"]
        EngineConfig(**knobs)


def test_chunking_off_forces_a_budget_that_fits_the_longest_sequence():
    sp = space(fixed={"enable_chunked_prefill": False})
    for knobs in sampled_configs(sp, 20):
        assert knobs["max_num_batched_tokens"] >= 4096
        EngineConfig(**knobs).check_max_model_len(4096)


def test_parse_forms():
    assert parse_param("max_num_seqs=64..256") == ("max_num_seqs", IntRange(64, 256, log=True))
    assert parse_param("policy=decode_first,prefill_first")[1] == Choices(
        (Policy.DECODE_FIRST, Policy.PREFILL_FIRST)
    )
    assert parse_fix("enable_chunked_prefill=false") == ("enable_chunked_prefill", False)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("max_num_batchd_tokens=512", "unknown knob 'max_num_batchd_tokens'"),
        ("policy=fastest", "policy='fastest' is invalid"),
        ("max_num_seqs=lots", "max_num_seqs='lots' is invalid"),
        ("max_num_seqs=256..64", "256 > 64"),
        ("policy=a..b", "not an integer knob"),
        ("max_num_seqs", "malformed"),
    ],
)
def test_bad_flags_name_the_value_and_the_fix(text, named):
    with pytest.raises(TuneError, match=named):
        parse_param(text)


def test_same_knob_searched_and_pinned_is_an_error():
    with pytest.raises(TuneError, match="both searched"):
        space(
            params=dict([parse_param("policy=decode_first")]), fixed={"policy": Policy.DECODE_FIRST}
        )


def test_a_target_searches_only_the_knobs_it_has():
    vllm = KnobSpace(VLLM_LIKE, frozenset(VLLM_LIKE), "vLLM 0.32's CPU row")
    sp = space(vllm)
    assert set(sp.domains) == {
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "long_prefill_token_threshold_adaptive",
    }
    for knobs in sampled_configs(sp, 20):
        assert set(knobs) == set(VLLM_LIKE)
        assert 0 <= knobs["long_prefill_token_threshold"] <= knobs["max_num_batched_tokens"]
    assert sp.default_config() == VLLM_LIKE


@pytest.mark.parametrize(
    ("settable", "kw", "named"),
    [
        (frozenset(VLLM_LIKE), {"params": dict([parse_param("policy=prefill_first")])},
         "--param policy: launched without it"),
        (frozenset({"max_num_batched_tokens"}), {"fixed": {"max_num_seqs": 64}},
         "--fix max_num_seqs: launched without it"),
    ],
)  # fmt: skip
def test_a_knob_the_target_cannot_set_is_refused_in_one_line(settable, kw, named):
    target = KnobSpace(VLLM_LIKE, settable & set(VLLM_LIKE), "x", refusal="launched without it")
    with pytest.raises(TuneError, match=named):
        space(target, **kw)


def test_a_narrowed_integer_range_still_runs_the_default_but_excluded_choices_cannot():
    sp = space(params=dict([parse_param("max_num_batched_tokens=256..1024")]))
    default = dict(DEFAULTS)
    assert default["max_num_batched_tokens"] > sp.domains["max_num_batched_tokens"].high
    assert sp.expressible(default)
    with pytest.warns(UserWarning, match="out of the range"):
        assert sp.suggest(FixedTrial(sp.to_params(default))) == default
    only_prefill = space(params=dict([parse_param("policy=prefill_first")]))
    assert not only_prefill.expressible(default)


def test_every_screened_config_is_the_one_a_queued_trial_runs():
    # A grid threshold of 1/16 of budget 432 came to 27, which a trial enqueued with it ran
    # as 32: the screened config was never matched as measured and was queued again, as a
    # duplicate, in every round of verification.
    from tuner.sim.screen import THRESHOLD_FRACTIONS, grid

    sp = space()
    configs = grid(sp, [256, 432, 752, 2048], thresholds=True)
    assert len(configs) > 4 * len(THRESHOLD_FRACTIONS)
    for knobs in configs:
        assert sp.as_queued(knobs) == knobs
        assert knobs["long_prefill_token_threshold"] % 16 == 0


def test_the_simulator_does_not_queue_a_config_measured_already():
    from tuner.search.fidelity import Simulator
    from tuner.sim.screen import Screened, grid

    sp = space()
    first, second = [k for k in grid(sp, [432], thresholds=True)
                     if k["long_prefill_token_threshold"]][:2]  # fmt: skip
    sim = Simulator(target=None, steps=None, profile=None)
    sim.ranked = [Screened(first, 9.0, 3), Screened(second, 8.0, 3)]
    study = optuna.create_study()
    sim.queue(study, sp, sim.next_unmeasured(sp, [first]))
    assert sp.suggest(study.ask()) == second  # the enqueued trial, as it runs
