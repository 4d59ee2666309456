"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a packed varlen batch and a paged KV cache.

q/k/v and gate/up are fused into one matmul each (as nano-vllm and vLLM do); `checkpoint_slot`
maps Hugging Face's separate weights onto row ranges of the fused parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_lite.attention.base import AttentionBackend, AttentionMetadata
from engine_lite.models.model_config import ModelConfig
from engine_lite.models.rope import RotaryEmbedding, apply_rotary

KVCache = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), computed in fp32 like transformers' LlamaRMSNorm."""

    def __init__(self, size: int, eps: float, **factory: object) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, **factory))  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, **factory: object) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        out = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, out, bias=cfg.qkv_bias, **factory)  # type: ignore[arg-type]
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias, **factory)  # type: ignore[arg-type]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cfg = self.cfg
        heads = self.qkv_proj(x).view(-1, cfg.num_heads + 2 * cfg.num_kv_heads, cfg.head_dim)
        num_qk = cfg.num_heads + cfg.num_kv_heads
        # q and k heads sit side by side in the fused output: rotate them in one pass.
        q, k = apply_rotary(heads[:, :num_qk], cos, sin).split(
            [cfg.num_heads, cfg.num_kv_heads], dim=1
        )
        v = heads[:, num_qk:]
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta)
        return self.o_proj(out.view(-1, cfg.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020)."""

    def __init__(self, cfg: ModelConfig, **factory: object) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * i, bias=cfg.mlp_bias, **factory)  # type: ignore[arg-type]
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias, **factory)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, **factory: object) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.self_attn = LlamaAttention(cfg, backend, **factory)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.mlp = LlamaMLP(cfg, **factory)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, **factory: object) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)  # type: ignore[arg-type]
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, backend, **factory) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)


class LlamaForCausalLM(nn.Module):
    """Packed tokens in, final hidden states out; logits only for the rows asked for."""

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        dtype: torch.dtype,
        device: torch.device | str = "meta",
    ) -> None:
        super().__init__()
        self.cfg = cfg
        factory: dict[str, object] = {"dtype": dtype, "device": device}
        self.model = LlamaModel(cfg, backend, **factory)
        # Tied checkpoints reuse the embedding matrix in `compute_logits`, so no second Parameter
        # exists to drift out of sync when the module is moved or loaded.
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)  # type: ignore[arg-type]
        )
        self.rope: RotaryEmbedding | None = None

    def init_rope(self, max_positions: int) -> None:
        """Builds the cos/sin tables on the model's device (after weights are placed)."""
        weight = self.model.embed_tokens.weight
        self.rope = RotaryEmbedding(self.cfg, max_positions, weight.device, weight.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """Hidden states [T, hidden] before the final norm (norm only the rows that need logits)."""
        assert self.rope is not None, "call init_rope() before the first forward"
        cos, sin = self.rope.lookup(positions)
        x = self.model.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.model.norm(hidden), weight)

    def checkpoint_slot(self, hf_name: str) -> tuple[str, int, int] | None:
        """(our parameter, first row, end row) for a Hugging Face tensor name; None to skip."""
        if "rotary_emb.inv_freq" in hf_name:
            return None  # recomputed, never loaded (old checkpoints saved it)
        cfg = self.cfg
        qkv = {
            "q_proj": (0, cfg.q_size),
            "k_proj": (cfg.q_size, cfg.q_size + cfg.kv_size),
            "v_proj": (cfg.q_size + cfg.kv_size, cfg.q_size + 2 * cfg.kv_size),
        }
        for part, (lo, hi) in qkv.items():
            if f".{part}." in hf_name:
                return hf_name.replace(part, "qkv_proj"), lo, hi
        i = cfg.intermediate_size
        for part, (lo, hi) in {"gate_proj": (0, i), "up_proj": (i, 2 * i)}.items():
            if f".{part}." in hf_name:
                return hf_name.replace(part, "gate_up_proj"), lo, hi
        if hf_name == "lm_head.weight" and self.lm_head is None:
            return None  # some tied checkpoints still store the copy
        return hf_name, 0, -1
