"""Reads a local Hugging Face model folder: config.json plus (possibly sharded) safetensors.

Nothing here touches the network: a folder either holds the files or loading fails with a message
that names the missing file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine_lite.errors import EngineLiteError
from engine_lite.models.llama import LlamaForCausalLM
from engine_lite.models.model_config import ModelConfig, model_config_from_hf

INDEX_FILE = "model.safetensors.index.json"


def load_model_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise EngineLiteError(
            f"model folder {folder} has no config.json; point model= at a Hugging Face model "
            "folder (config.json + *.safetensors) or use a preset name"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise EngineLiteError(f"{path} is not valid JSON ({exc}); re-download the model") from None
    try:
        return model_config_from_hf(raw, str(path))
    except KeyError as exc:
        raise EngineLiteError(f"{path} lacks the field {exc}; re-download the model") from None


def weight_files(folder: Path) -> list[Path]:
    """The shards named by the index, else model.safetensors, else every *.safetensors."""
    index = folder / INDEX_FILE
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / name for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise EngineLiteError(
                f"{index} lists {missing[0]} but it does not exist; download every shard"
            )
        return files
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    # Mistral repos also ship `consolidated.safetensors` in Mistral's own naming: skip it.
    files = sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("consolidated"))
    if not files:
        raise EngineLiteError(
            f"model folder {folder} has no *.safetensors weights; save the model with "
            "save_pretrained(safe_serialization=True) or convert it to safetensors"
        )
    return files


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Copies every checkpoint tensor into its (possibly fused) parameter, on its device/dtype."""
    params = dict(model.named_parameters())
    rows_loaded: dict[str, int] = dict.fromkeys(params, 0)
    for file in weight_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                slot = model.checkpoint_slot(hf_name)
                if slot is None:
                    continue
                name, lo, hi = slot
                if name not in params:
                    raise EngineLiteError(
                        f"{file} holds {hf_name!r}, which a {model.cfg.model_type.value} model "
                        "does not have; check config.json matches the weights"
                    )
                target = params[name] if hi < 0 else params[name][lo:hi]
                tensor = f.get_tensor(hf_name)
                if tensor.shape != target.shape:
                    raise EngineLiteError(
                        f"{hf_name!r} in {file} has shape {tuple(tensor.shape)} but config.json "
                        f"implies {tuple(target.shape)}; the config and weights disagree"
                    )
                target.copy_(tensor)
                rows_loaded[name] += tensor.shape[0]
    missing = [n for n, p in params.items() if rows_loaded[n] != p.shape[0]]
    if missing:
        raise EngineLiteError(
            f"model folder {folder} lacks weights for {missing[0]}"
            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}; "
            "the checkpoint is incomplete or not a Llama/Qwen2/Mistral model"
        )
