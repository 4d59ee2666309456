"""Presets have the published shapes, seeded weights are reproducible, and a broken model folder
fails with a message that says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine_lite.errors import EngineLiteError
from engine_lite.models import PRESETS, resolve_model
from engine_lite.models.model_config import RopeType, model_config_from_hf
from engine_lite.models.rope import inverse_frequencies

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("name", "params_b"),
    # parameter counts published on the models' cards (tied embeddings counted once)
    [("llama-3.2-1b", 1.24), ("llama-3.1-8b", 8.03), ("qwen2.5-7b", 7.62)],
)
def test_real_shape_presets_have_published_sizes(name: str, params_b: float) -> None:
    assert PRESETS[name].num_params() / 1e9 == pytest.approx(params_b, abs=0.01)


def test_tiny_is_the_anchor_shape() -> None:
    tiny = PRESETS["tiny"]
    assert (tiny.hidden_size, tiny.num_layers, tiny.intermediate_size) == (128, 2, 352)
    assert (tiny.num_heads, tiny.num_kv_heads, tiny.vocab_size) == (4, 2, 4096)
    assert tiny.num_params() / 1e6 == pytest.approx(1.4, abs=0.05)
    assert tiny.eos_token_id is None  # random weights: every request runs to max_tokens


def test_llama3_rope_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ours = PRESETS["llama-3.1-8b"]
    hf = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        head_dim=128,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    torch.testing.assert_close(inverse_frequencies(ours), expected.float())


def test_v4_and_v5_config_formats_read_alike() -> None:
    base = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "eos_token_id": [7, 8],
    }
    scaling = {"factor": 2.0}
    v4 = model_config_from_hf(
        {**base, "rope_theta": 1e6, "rope_scaling": {"type": "linear", **scaling}}, "v4"
    )
    v5 = model_config_from_hf(
        {**base, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, **scaling}}, "v5"
    )
    assert v4 == v5
    assert v4.rope_scaling is not None and v4.rope_scaling.rope_type is RopeType.LINEAR
    assert v4.num_kv_heads == 4 and v4.head_dim == 16 and v4.eos_token_id == 7


def test_unsupported_rope_type_is_named() -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    with pytest.raises(EngineLiteError, match="'yarn'"):
        model_config_from_hf(cfg, "config.json")


def test_unknown_model_name_lists_presets() -> None:
    with pytest.raises(EngineLiteError, match="tiny"):
        resolve_model("no-such-model")


def test_folder_without_config_is_explained(tmp_path: Path) -> None:
    with pytest.raises(EngineLiteError, match=r"config\.json"):
        resolve_model(str(tmp_path))


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(EngineLiteError, match="gpt2"):
        resolve_model(str(tmp_path))


def _save_tiny_llama(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)


def test_missing_weights_are_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from engine_lite import EngineConfig
    from engine_lite.runner import ModelRunner

    _save_tiny_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(EngineLiteError, match="gate_up_proj"):
        ModelRunner(EngineConfig(model=str(tmp_path), num_gpu_blocks_override=8))


def test_folder_without_weights_is_explained(tmp_path: Path) -> None:
    from engine_lite import EngineConfig
    from engine_lite.runner import ModelRunner

    _save_tiny_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(EngineLiteError, match="safetensors"):
        ModelRunner(EngineConfig(model=str(tmp_path), num_gpu_blocks_override=8))
