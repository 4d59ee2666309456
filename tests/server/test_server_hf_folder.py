"""A Hugging Face model folder with tokenizer.json: text in, text out through its tokenizer."""

import json

import openai
import pytest

from engine_lite.config import EngineConfig
from engine_lite.server.state import ServerSettings

WORDS = ["<s>", "</s>", "<unk>", "hello", "world", "good", "day", "to", "you", "and",
         "the", "sun", "<|user|>", "<|assistant|>", "is", "up"]  # fmt: skip


def _write_llama_checkpoint(folder, hidden=32, layers=1, inter=64, heads=2, kv_heads=1):
    """A random Llama checkpoint in Hugging Face's layout (config.json + safetensors)."""
    import torch
    from safetensors.torch import save_file

    head_dim, vocab = hidden // heads, len(WORDS)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": inter,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "vocab_size": vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": 1,
              "tie_word_embeddings": False}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                   p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                   p + "mlp.gate_proj.weight": (inter, hidden),
                   p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter),
                   p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}  # fmt: skip
    tensors = {
        name: torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * 0.2
        for name, shape in shapes.items()
    }
    save_file(tensors, str(folder / "model.safetensors"))


def _write_folder(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _write_llama_checkpoint(folder)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}<|assistant|>"
    cfg = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory, server_thread):
    folder = tmp_path_factory.mktemp("hf-model")
    _write_folder(folder)
    config = EngineConfig(model=str(folder), kv_cache_memory_gb=0.01)
    srv = server_thread(config, ServerSettings("hf")).start()
    yield srv
    srv.stop()


def test_text_goes_through_the_folders_tokenizer(hf_server):
    client = openai.OpenAI(base_url=f"{hf_server.url}/v1", api_key="none", max_retries=0)
    kwargs = dict(model="hf", prompt="hello world and the sun", max_tokens=6, temperature=0,
                  extra_body={"ignore_eos": True})  # fmt: skip
    out = client.completions.create(**kwargs)
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 6
    words = out.choices[0].text.split()
    assert words and set(words) <= set(WORDS) - {"<s>", "</s>"}
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))
    assert streamed.split() == words


def test_chat_uses_the_folders_template(hf_server):
    client = openai.OpenAI(base_url=f"{hf_server.url}/v1", api_key="none", max_retries=0)
    out = client.chat.completions.create(
        model="hf", messages=[{"role": "user", "content": "good day"}], max_tokens=2
    )
    # "<|user|> good day <|assistant|>" is four words of the vocabulary, no special added.
    assert out.usage.prompt_tokens == 4
