"""Server-sent events of OpenAI streaming responses, parsed into token-bearing chunks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:  # orjson parses a chunk several times faster; optional
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    loads = json.loads

DONE = b"[DONE]"


class SSEBuffer:
    """Splits a byte stream into the `data:` payloads of complete events."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Payloads of the events completed by `data`, in order (multi-line data joined)."""
        buf = self._buf + data
        if b"\r" in buf:  # SSE allows CRLF and CR line ends; keep a trailing CR for its LF
            keep_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if keep_cr:
                buf = buf[:-1] + b"\r"
        *events, self._buf = buf.split(b"\n\n")
        out = []
        for event in events:
            if event.startswith(b"data:") and b"\n" not in event:  # the common case
                out.append(event[5:].lstrip(b" "))
                continue
            lines = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines))
        return out

    @property
    def pending(self) -> bytes:
        return self._buf


class ChunkReader:
    """Turns parsed chunk objects into (tokens this chunk carried, usage) updates.

    A chunk bears tokens when the server's running usage count grew (vLLM's and engine-lite's
    `continuous_usage_stats`), or, without running usage, when it carries `token_ids`, text,
    or an empty text mid-stream (a token that decoded to nothing yet). A final chunk with only
    a finish reason, a chat role-only chunk and the closing usage chunk bear none.
    """

    __slots__ = ("chat", "completion_tokens", "error", "prompt_tokens")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.error: str | None = None

    def tokens_in(self, obj: Any) -> int:
        """Tokens carried by one parsed `data:` object (0 if none); records usage and errors."""
        if not isinstance(obj, dict):
            self.error = f"unexpected event {str(obj)[:80]!r}"
            return 0
        if "error" in obj:
            self.error = _error_text(obj["error"])
            return 0
        before = self.completion_tokens
        usage = obj.get("usage")
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or self.prompt_tokens)
            self.completion_tokens = int(usage.get("completion_tokens") or before)
        choices = obj.get("choices")
        if not choices:
            return 0
        if usage:  # running usage: the count's growth is exact
            return max(0, self.completion_tokens - before)
        return self._tokens_without_usage(choices[0])

    def _tokens_without_usage(self, choice: dict[str, Any]) -> int:
        ids = choice.get("token_ids")
        if ids:
            return len(ids)
        if self.chat:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            role_only = "role" in delta and not text
        else:
            text, role_only = choice.get("text"), False
        if text:
            return 1
        if text is not None and choice.get("finish_reason") is None and not role_only:
            return 1
        return 0


def _error_text(err: Any) -> str:
    msg = err.get("message", err) if isinstance(err, dict) else err
    return f"server error: {' '.join(str(msg).split())[:300]}"
