"""Text <-> token ids for the server: a model folder's tokenizer.json, or a byte tokenizer."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine_lite.errors import EngineLiteError

# Byte tokenizer layout: ids 0..2 are specials, byte b is id b + NUM_SPECIAL_IDS, so the 256 byte
# ids fit any vocabulary of at least 259 (the presets have 4096).
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
NUM_SPECIAL_IDS = 3
_FIRST_UNUSED_ID = NUM_SPECIAL_IDS + 256
# Ids past the byte range carry no text in a byte vocabulary, but a preset with random weights
# samples them all the time; each decodes to one printable ASCII character so that output text
# is as long as the token count says, instead of silently empty.
_PRINTABLE = "".join(chr(c) for c in range(33, 127))


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat turn after validation."""

    role: str
    content: str


class Detokenizer(Protocol):
    """Turns one request's output ids into text pieces, one call per token event."""

    def step(self, token_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    name: str

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def detokenizer(self) -> Detokenizer: ...

    def encode_chat(self, messages: list[ChatMessage]) -> list[int]: ...


def role_tagged_chat(messages: list[ChatMessage]) -> str:
    """The presets' chat template: each turn as `<|role|>` then its text, then the reply tag."""
    parts = [f"<|{m.role}|>\n{m.content}\n" for m in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


class ByteTokenizer:
    """UTF-8 bytes as token ids, offset past the special ids (for shape presets)."""

    name = "byte"

    def __init__(self, vocab_size: int, eos_token_id: int | None = EOS_ID) -> None:
        if vocab_size < _FIRST_UNUSED_ID:
            raise EngineLiteError(
                f"vocab_size={vocab_size} is too small for the byte tokenizer; the model needs "
                f"at least {_FIRST_UNUSED_ID} token ids, or a folder with tokenizer.json"
            )
        self.vocab_size = vocab_size
        self._skip = {PAD_ID, BOS_ID, EOS_ID}
        if eos_token_id is not None:
            self._skip.add(eos_token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + NUM_SPECIAL_IDS for b in text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        detok = self.detokenizer()
        return detok.step(token_ids) + detok.flush()

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer(self._skip)

    def encode_chat(self, messages: list[ChatMessage]) -> list[int]:
        return self.encode(role_tagged_chat(messages))


class ByteDetokenizer:
    """Incremental UTF-8 decoding: a multi-byte character appears once all its bytes are in."""

    __slots__ = ("_decoder", "_skip")

    def __init__(self, skip: set[int]) -> None:
        self._skip = skip
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_ids: list[int]) -> str:
        out = []
        for tok in token_ids:
            if tok in self._skip:
                continue
            if NUM_SPECIAL_IDS <= tok < _FIRST_UNUSED_ID:
                out.append(self._decoder.decode(bytes((tok - NUM_SPECIAL_IDS,))))
            else:
                out.append(self._decoder.decode(b"", final=True))
                out.append(_PRINTABLE[tok % len(_PRINTABLE)])
        return "".join(out)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` package."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.name = str(folder)
        try:
            self._tok = RustTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the Rust side raises a bare Exception for bad files
            raise EngineLiteError(
                f"cannot read {folder / 'tokenizer.json'} ({exc}); fix or remove the file"
            ) from None
        self._config = _read_tokenizer_config(folder)
        self._template = _chat_template(self._config)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=True))

    def detokenizer(self) -> HFDetokenizer:
        return HFDetokenizer(self)

    def encode_chat(self, messages: list[ChatMessage]) -> list[int]:
        if self._template is None:
            return self.encode(role_tagged_chat(messages))
        # The template writes the special tokens itself (vLLM tokenizes its output the same way).
        text = _render_jinja(self._template, messages, self._config)
        return self.encode(text, add_special_tokens=False)


class HFDetokenizer:
    """Incremental detokenizing with prefix/read offsets, as vLLM's `detokenize_incrementally`.

    Decoding ids one at a time breaks merged pieces (leading spaces, multi-token characters),
    so each step decodes a short window and emits only the text past what was already emitted.
    """

    __slots__ = ("_ids", "_prefix", "_read", "_tok")

    def __init__(self, tok: HFTokenizer) -> None:
        self._tok = tok
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def step(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        full_text = self._tok.decode(self._ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._prefix = self._read
            self._read = len(self._ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        full_text = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]


def load_tokenizer(model: str, vocab_size: int, eos_token_id: int | None) -> Tokenizer:
    """The folder's tokenizer.json when `model` is a folder that has one, else the byte one."""
    folder = Path(model)
    if folder.is_dir() and (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder)
    return ByteTokenizer(vocab_size, eos_token_id)


def _read_tokenizer_config(folder: Path) -> dict[str, object]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineLiteError(f"cannot read {path} ({exc}); fix or remove the file") from None
    return data if isinstance(data, dict) else {}


def _chat_template(config: dict[str, object]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _token_text(config: dict[str, object], key: str) -> str:
    value = config.get(key)
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _render_jinja(template: str, messages: list[ChatMessage], config: dict[str, object]) -> str:
    # Sandboxed like transformers' apply_chat_template: a template is data from the folder.
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            bos_token=_token_text(config, "bos_token"),
            eos_token=_token_text(config, "eos_token"),
        )
    except TemplateError as exc:
        raise EngineLiteError(f"the model's chat template rejected the messages: {exc}") from None
