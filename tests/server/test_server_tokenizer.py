"""Byte tokenizer for presets, tokenizer.json folders, and incremental detokenizing."""

import json

import pytest

from engine_lite.errors import EngineLiteError
from engine_lite.server.tokenizer import (
    NUM_SPECIAL_IDS,
    ByteTokenizer,
    ChatMessage,
    HFTokenizer,
    load_tokenizer,
)


def test_byte_round_trip_with_multibyte_text_streamed_one_token_at_a_time():
    tok = ByteTokenizer(4096)
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode()) and min(ids) >= NUM_SPECIAL_IDS and max(ids) < 4096
    detok = tok.detokenizer()
    pieces = [detok.step([i]) for i in ids]
    assert "".join(pieces) + detok.flush() == text
    # A 3-byte character appears whole, on its last byte, never as replacement characters.
    assert "\ufffd" not in "".join(pieces) and pieces[-1] == "✓"


def test_ids_past_the_byte_range_decode_to_one_printable_character_each():
    tok = ByteTokenizer(4096)
    text = tok.decode([300, 4095, 1000])
    assert len(text) == 3 and text.isprintable()
    assert tok.decode([0, 1, 2]) == ""  # specials are skipped


def test_byte_tokenizer_needs_room_for_all_bytes():
    with pytest.raises(EngineLiteError, match="vocab_size=100"):
        ByteTokenizer(100)


def test_role_tagged_chat_for_presets():
    tok = ByteTokenizer(4096)
    ids = tok.encode_chat([ChatMessage("system", "s"), ChatMessage("user", "u")])
    assert tok.decode(ids) == "<|system|>\ns\n<|user|>\nu\n<|assistant|>\n"


def _write_wordlevel_folder(folder, chat_template=None):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<s>", "</s>", "<unk>", "hello", "world", "[", "]", "user", ":", "!"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    if chat_template is not None:
        cfg = {"chat_template": chat_template, "bos_token": "<s>", "eos_token": "</s>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def test_folder_with_tokenizer_json_uses_it(tmp_path):
    _write_wordlevel_folder(tmp_path)
    tok = load_tokenizer(str(tmp_path), vocab_size=10, eos_token_id=1)
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode("hello world !")
    assert ids == [3, 4, 9]
    detok = tok.detokenizer()
    streamed = "".join(detok.step([i]) for i in ids) + detok.flush()
    assert streamed.split() == ["hello", "world", "!"]


def test_folder_chat_template_is_rendered(tmp_path):
    template = "{{ bos_token }}{% for m in messages %}[ {{ m.role }} ] {{ m.content }} {% endfor %}"
    _write_wordlevel_folder(tmp_path, template)
    tok = load_tokenizer(str(tmp_path), vocab_size=10, eos_token_id=1)
    assert tok.encode_chat([ChatMessage("user", "hello")]) == [0, 5, 7, 6, 3]


def test_broken_tokenizer_json_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(EngineLiteError, match=r"tokenizer\.json"):
        load_tokenizer(str(tmp_path), vocab_size=10, eos_token_id=None)


def test_preset_name_gets_the_byte_tokenizer():
    assert isinstance(load_tokenizer("tiny", 4096, None), ByteTokenizer)
