"""Each target declares its knob space: what it has, what it runs untouched, what it can set."""

import pytest

from engine_lite import EngineConfig, Policy
from tuner.errors import TuneError
from tuner.report.summary import flag_notes, sglang_flags, vllm_flags
from tuner.search.space import SpaceFacts, build_space, parse_param
from tuner.targets.builtin import BuiltinTarget, engine_defaults
from tuner.targets.http import LaunchTarget, UrlTarget
from tuner.targets.knobs import KnobSpace, knobs_from_json, knobs_to_json
from tuner.targets.launch import LaunchSpec

FACTS = SpaceFacts(block_size=16, max_model_len=8192, longest_prompt=7000)


@pytest.fixture(scope="module")
def builtin():
    return BuiltinTarget(EngineConfig(kv_cache_memory_gb=0.25))


async def test_the_built_in_engine_declares_its_own_defaults_and_block_size(builtin):
    engine = builtin.engine
    assert builtin.knobs.defaults == engine.config.scheduler_knobs()
    assert builtin.knobs.settable == set(builtin.knobs.defaults)
    # On this CPU: vLLM 0.32's CPU row, and the report says so.
    assert builtin.knobs.defaults["max_num_batched_tokens"] == 2048
    assert builtin.knobs.defaults["max_num_seqs"] == 128
    assert builtin.knobs.default_source.startswith("vLLM 0.32's CPU default")
    assert builtin.facts.block_size == engine.block_size == 16
    assert (
        builtin.facts.max_model_len == engine.max_model_len and not builtin.facts.require_schedule
    )


async def test_knobs_a_config_leaves_out_mean_the_defaults_not_the_last_trials(builtin):
    try:
        await builtin.apply({"max_num_batched_tokens": 512, "max_num_seqs": 64})
        assert builtin.engine.config.max_num_batched_tokens == 512
        await builtin.apply({"max_num_seqs": 32})
        config = builtin.engine.config
        assert config.max_num_seqs == 32
        assert config.max_num_batched_tokens == builtin.knobs.defaults["max_num_batched_tokens"]
    finally:
        await builtin.close()


def launch(template: str) -> LaunchTarget:
    return LaunchTarget(LaunchSpec(template, url="http://127.0.0.1:1", model="m"))


async def test_a_launched_server_sets_exactly_the_knobs_its_command_names():
    target = launch("serve --port {port} --max-num-batched-tokens {max_num_batched_tokens}")
    assert target.knobs.settable == {"max_num_batched_tokens"}
    assert target.knobs.defaults == engine_defaults()[0]
    assert target.knobs.default_source.startswith("vLLM 0.32's CPU default")
    # A config that changes a knob the command cannot pass is refused before any server starts.
    with pytest.raises(TuneError, match=r"max_num_seqs=64: the --launch command has no \{max_"):
        await target.apply({"max_num_seqs": 64})
    space = build_space(target.knobs, FACTS)
    assert list(space.domains) == ["max_num_batched_tokens"]
    with pytest.raises(TuneError, match=r"--param policy: the --launch command has no \{policy\}"):
        build_space(target.knobs, FACTS, params=dict([parse_param("policy=prefill_first")]))


def test_a_launch_command_without_a_knob_placeholder_is_refused():
    with pytest.raises(TuneError, match="no knob placeholder"):
        launch("serve --port {port}")


async def test_a_server_someone_else_started_can_change_no_knob():
    target = UrlTarget("http://127.0.0.1:1", "m")
    assert target.knobs.settable == frozenset()
    await target.apply(target.knobs.defaults)  # its own defaults are fine
    with pytest.raises(TuneError, match="cannot change it; use --launch"):
        await target.apply({"max_num_batched_tokens": 512})
    assert build_space(target.knobs, FACTS).domains == {}


def test_a_knob_space_names_only_known_knobs_with_defaults():
    with pytest.raises(ValueError, match="unknown"):
        KnobSpace({"max_num_batched_tokens": 1, "speed": 2}, frozenset(), "x")
    with pytest.raises(ValueError):
        KnobSpace({"max_num_batched_tokens": 1}, frozenset({"max_num_seqs"}), "x")


def test_flags_name_only_the_knobs_a_config_has():
    # A vLLM 0.32 target has no policy knob (and vLLM 0.32 no partial-prefill limits at all).
    vllm = {"max_num_batched_tokens": 512, "max_num_seqs": 128, "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 128,
            "long_prefill_token_threshold_adaptive": True}  # fmt: skip
    assert vllm_flags(vllm) == (
        "--max-num-batched-tokens 512 --max-num-seqs 128 --enable-chunked-prefill "
        "--long-prefill-token-threshold 128 --long-prefill-token-threshold-adaptive"
    )
    assert "partial" not in vllm_flags(vllm)
    assert flag_notes(vllm) == [
        "SGLang has no equivalent of --long-prefill-token-threshold-adaptive"
    ]
    assert sglang_flags(vllm) == (
        "--chunked-prefill-size 128 --max-prefill-tokens 512 --max-running-requests 128 "
        "--enable-mixed-chunk"
    )
    engine = {**engine_defaults()[0], "policy": Policy.PREFILL_FIRST}
    assert "policy" not in vllm_flags(engine) and "prefill_first" not in vllm_flags(engine)
    assert len(flag_notes(engine)) == 1
    unchunked = {**vllm, "enable_chunked_prefill": False}
    assert vllm_flags(unchunked).endswith("--no-enable-chunked-prefill")


def test_a_config_round_trips_through_json():
    knobs = {**engine_defaults()[0], "policy": Policy.PREFILL_FIRST}
    assert knobs_from_json(knobs_to_json(knobs)) == knobs
    assert knobs_to_json(knobs)["policy"] == "prefill_first"
