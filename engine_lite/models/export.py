"""Writes a preset's seeded random weights as a Hugging Face folder that vLLM can load.

So engine_lite and vLLM run the *same* weights: `engine-lite export-hf --model tiny DIR`, then
`--model DIR` for both. The folder holds config.json, model.safetensors, and a word-level
`tokenizer.json` (token `t{i}` is id i; enough for vLLM's tokenizer loading and for our server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine_lite.errors import EngineLiteError
from engine_lite.models.model_config import ModelConfig, ModelType

# Special tokens of the exported word-level tokenizer: unknown, beginning, end of text.
UNK, BOS, EOS = "[UNK]", "t1", "t2"


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """transformers' config.json for this shape (the reverse of `model_config_from_hf`)."""
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope = {"rope_theta": cfg.rope_theta, "rope_type": s.rope_type.value, "factor": s.factor}
        if s.rope_type.value == "llama3":
            rope |= {
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
    arch = {ModelType.LLAMA: "LlamaForCausalLM", ModelType.MISTRAL: "MistralForCausalLM",
            ModelType.QWEN2: "Qwen2ForCausalLM"}[cfg.model_type]  # fmt: skip
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": cfg.model_type.value,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.num_layers,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4.x and vLLM read these two keys
        "rope_scaling": None if cfg.rope_scaling is None else rope,
        "rope_parameters": rope,  # transformers >= 5
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": cfg.eos_token_id,
    }
    if cfg.model_type is ModelType.LLAMA:
        out |= {"attention_bias": cfg.qkv_bias, "mlp_bias": cfg.mlp_bias}
    if cfg.model_type is ModelType.MISTRAL:
        out["sliding_window"] = cfg.sliding_window
    return out


def hf_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our fused parameters split back into the checkpoint's q/k/v and gate/up tensors."""
    cfg: ModelConfig = model.cfg  # type: ignore[assignment]
    q, kv, i = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    out: dict[str, torch.Tensor] = {}
    for name, p in model.state_dict().items():
        t = p.detach().to("cpu", torch.float32).contiguous()
        if ".qkv_proj." in name:
            for part, (lo, hi) in {"q_proj": (0, q), "k_proj": (q, q + kv),
                                   "v_proj": (q + kv, q + 2 * kv)}.items():  # fmt: skip
                out[name.replace("qkv_proj", part)] = t[lo:hi].clone()
        elif ".gate_up_proj." in name:
            out[name.replace("gate_up_proj", "gate_proj")] = t[:i].clone()
            out[name.replace("gate_up_proj", "up_proj")] = t[i:].clone()
        else:
            out[name] = t
    return out


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab[UNK] = 0
    specials = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, tok in ((0, UNK), (1, BOS), (2, EOS))
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK},
    }  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK, "bos_token": BOS,
              "eos_token": EOS, "model_max_length": 1 << 30}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def export_hf_folder(model: str, folder: Path, seed: int = 0) -> Path:
    """The preset's weights, seeded as `EngineConfig(model=model, seed=seed)` seeds them."""
    from engine_lite.attention import create_backend
    from engine_lite.models import build_model, resolve_model

    source = resolve_model(model)
    if source.folder is not None:
        raise EngineLiteError(f"model={model!r} is already a folder; export takes a preset name")
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise EngineLiteError(f"{folder} is not empty; export into a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    cfg, cpu = source.config, torch.device("cpu")
    backend = create_backend("torch", cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16, cpu,
                             cfg.sliding_window, torch.float32)  # fmt: skip
    built = build_model(source, backend, cpu, torch.float32, seed)
    save_file(hf_tensors(built), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))
    write_tokenizer(folder, cfg.vocab_size)
    return folder
