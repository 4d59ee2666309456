"""EngineConfig: vLLM's defaults, and every bad combination rejected with the knob's name."""

import dataclasses

import pytest

from engine_lite import EngineConfig, EngineLiteError, Policy, SamplingParams
from engine_lite.defaults import CPU_DEVICE, GIB, DeviceInfo, UsageContext, cpu_threads


def test_unset_limits_wait_for_the_device_and_the_rest_are_vllm_defaults():
    cfg = EngineConfig()
    assert cfg.scheduler_knobs() == {
        "max_num_batched_tokens": None,  # vLLM's device table decides, once the device is known
        "max_num_seqs": None,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "long_prefill_token_threshold_adaptive": False,
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


H200 = DeviceInfo("cuda", "NVIDIA H200", 141 * GIB)


@pytest.mark.parametrize(
    ("device", "usage", "row", "limits"),
    [
        (CPU_DEVICE, UsageContext.SERVER, "CPU", (2048, 128)),
        (CPU_DEVICE, UsageContext.OFFLINE, "CPU", (4096, 256)),
        (H200, UsageContext.SERVER, "H100/H200", (8192, 1024)),
        (
            DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 80 * GIB),
            UsageContext.SERVER,
            "H100/H200",
            (8192, 1024),
        ),
        (
            DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", 80 * GIB),
            UsageContext.SERVER,
            "A100",
            (2048, 256),
        ),
        (DeviceInfo("cuda", "NVIDIA L4", 23 * GIB), UsageContext.SERVER, "other GPU", (2048, 256)),
        (DeviceInfo("cuda", "NVIDIA B200", 180 * GIB), UsageContext.SERVER, "B200", (16384, 1024)),
    ],
)
def test_unset_limits_take_vllm_032s_row_for_the_device(device, usage, row, limits):
    cfg, defaults = EngineConfig().resolved(device, max_model_len=8192, usage=usage)
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == limits
    assert row in defaults.row
    assert "vLLM 0.32" in defaults.describe()


@pytest.mark.parametrize(
    "requested, usage, cores, half, threads",
    [
        (None, UsageContext.SERVER, 2, True, 1),  # vLLM 0.32 on 2 cores: reserved_cpus=[1]
        (None, UsageContext.SERVER, 16, True, 15),
        (None, UsageContext.SERVER, 1, True, 1),  # never fewer than one
        (None, UsageContext.SERVER, 2, False, None),  # float32: the prefill needs both cores
        (None, UsageContext.OFFLINE, 16, True, None),  # offline: the process's count stands
        (4, UsageContext.SERVER, 2, True, 4),  # what the user asked wins
        (3, UsageContext.OFFLINE, 16, False, 3),
    ],
)
def test_a_serving_cpu_engine_in_half_precision_leaves_a_core_to_the_serving_path(
    requested, usage, cores, half, threads
):
    assert cpu_threads(requested, usage, cores, half) == threads


def test_resolution_keeps_what_the_user_set_and_clamps_like_vllm():
    # A budget set alone pulls the default sequence limit down to it (vLLM arg_utils).
    cfg, _ = EngineConfig(max_num_batched_tokens=64).resolved(CPU_DEVICE, 8192)
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (64, 64)
    # Without chunking the default budget grows to cover max_model_len.
    cfg, _ = EngineConfig(enable_chunked_prefill=False).resolved(CPU_DEVICE, 8192)
    assert cfg.max_num_batched_tokens == 8192
    # A sequence limit above the default budget is an error naming both.
    with pytest.raises(EngineLiteError, match="max_num_seqs=4096"):
        EngineConfig(max_num_seqs=4096).resolved(CPU_DEVICE, 8192)


def test_policy_string_becomes_enum_and_replace_revalidates():
    cfg = EngineConfig(policy="prefill_first", max_num_seqs=128)
    assert cfg.policy is Policy.PREFILL_FIRST and not cfg.is_vllm_deployable()
    assert EngineConfig().is_vllm_deployable()
    trial = dataclasses.replace(cfg, **{**cfg.scheduler_knobs(), "max_num_batched_tokens": 512})
    assert trial.max_num_batched_tokens == 512 and trial.policy is Policy.PREFILL_FIRST
    with pytest.raises(EngineLiteError, match="max_num_batched_tokens=100"):
        dataclasses.replace(cfg, max_num_batched_tokens=100)


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"policy": "fastest"}, "policy='fastest'"),
        ({"max_num_batched_tokens": 128, "max_num_seqs": 256}, "max_num_seqs=256"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens=0"),
        ({"max_num_seqs": -1}, "max_num_seqs=-1"),
        (
            {"long_prefill_token_threshold": 9000, "max_model_len": 8192},
            "long_prefill_token_threshold=9000",
        ),
        ({"long_prefill_token_threshold": -5}, "long_prefill_token_threshold=-5"),
        ({"long_prefill_token_threshold_adaptive": 1}, "long_prefill_token_threshold_adaptive=1"),
        (
            {
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": 8192,
                "max_model_len": 16384,
            },
            "max_model_len=16384",
        ),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
        ({"kv_cache_memory_gb": 0}, "kv_cache_memory_gb=0"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"attention_backend": "xformers"}, "attention_backend='xformers'"),
        ({"cpu_threads": 0}, "cpu_threads=0"),
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


def test_vllm_partial_prefill_knobs_are_gone_as_in_vllm_032():
    with pytest.raises(TypeError):
        EngineConfig(max_num_partial_prefills=2)


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
