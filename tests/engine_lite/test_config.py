"""EngineConfig: vLLM's defaults, and every bad combination rejected with the knob's name."""

import dataclasses

import pytest

from engine_lite import EngineConfig, EngineLiteError, Policy, SamplingParams


def test_defaults_are_vllm_serve_defaults():
    cfg = EngineConfig()
    assert cfg.scheduler_knobs() == {
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "max_num_partial_prefills": 1,
        "max_long_partial_prefills": 1,
        "policy": Policy.DECODE_FIRST,
    }
    assert (cfg.model, cfg.device, cfg.dtype, cfg.attention_backend) == (
        "tiny",
        "auto",
        "auto",
        "auto",
    )
    assert cfg.gpu_memory_utilization == 0.9
    assert cfg.block_size is None and cfg.max_model_len is None


def test_policy_string_becomes_enum_and_replace_revalidates():
    cfg = EngineConfig(policy="prefill_first")
    assert cfg.policy is Policy.PREFILL_FIRST
    trial = dataclasses.replace(cfg, **{**cfg.scheduler_knobs(), "max_num_batched_tokens": 512})
    assert trial.max_num_batched_tokens == 512 and trial.policy is Policy.PREFILL_FIRST
    with pytest.raises(EngineLiteError, match="max_num_batched_tokens=100"):
        dataclasses.replace(cfg, max_num_batched_tokens=100)


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"policy": "fastest"}, "policy='fastest'"),
        ({"max_num_batched_tokens": 128}, "max_num_seqs=256"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens=0"),
        ({"max_num_seqs": -1}, "max_num_seqs=-1"),
        ({"long_prefill_token_threshold": 9000}, "long_prefill_token_threshold=9000"),
        ({"long_prefill_token_threshold": -5}, "long_prefill_token_threshold=-5"),
        (
            {"max_num_partial_prefills": 2, "max_long_partial_prefills": 3},
            "max_long_partial_prefills=3",
        ),
        ({"max_long_partial_prefills": 2}, "max_num_partial_prefills=1"),
        (
            {"max_num_partial_prefills": 4, "enable_chunked_prefill": False},
            "enable_chunked_prefill",
        ),
        ({"enable_chunked_prefill": False, "max_model_len": 16384}, "max_model_len=16384"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
        ({"kv_cache_memory_gb": 0}, "kv_cache_memory_gb=0"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"attention_backend": "xformers"}, "attention_backend='xformers'"),
        ({"block_size": 0}, "block_size=0"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override=0"),
        ({"max_num_seqs": True}, "max_num_seqs=True"),
    ],
)
def test_bad_values_name_the_knob(knobs, named):
    with pytest.raises(EngineLiteError) as err:
        EngineConfig(**knobs)
    msg = str(err.value)
    assert named in msg
    assert "\n" not in msg


def test_unchunked_budget_is_checked_once_max_model_len_is_known():
    cfg = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048)
    cfg.check_max_model_len(2048)
    with pytest.raises(EngineLiteError, match="max_model_len=4096"):
        cfg.check_max_model_len(4096)


def test_replace_rejects_unknown_option():
    with pytest.raises(EngineLiteError, match="'max_batch'"):
        EngineConfig().replace(max_batch=4)
    assert EngineConfig().replace(max_num_seqs=8).max_num_seqs == 8


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens=5"),
        ({"temperature": -1.0}, "temperature=-1.0"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"seed": -3}, "seed=-3"),
        ({"stop_token_ids": [1, -2]}, "-2"),
    ],
)
def test_sampling_params_validation(kwargs, named):
    with pytest.raises(EngineLiteError, match=named):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_stop_ids_tuple():
    p = SamplingParams(stop_token_ids=[3, 4])
    assert p.stop_token_ids == (3, 4)
    assert (p.max_tokens, p.min_tokens, p.temperature, p.top_p) == (16, 0, 1.0, 1.0)
