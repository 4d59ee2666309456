"""One trace field at a time: token counts, timestamps and token ids, checked where they are read.

Every error names the file, the line and the field, quotes at most a short piece of the bad
value, and says what to write instead, so a trace from elsewhere fails in one clear line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError

_ECHO_CHARS = 40
MAX_TOKEN_COUNT = 2**31 - 1  # past any context window; 1e300 is a corrupt field
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,18}")  # CSV cells; longer is no token count


def echo(value: Any) -> str:
    """A bad value, quoted short: a trace line can be megabytes long."""
    text = repr(value)
    return text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."


def read_text(path: Path) -> str:
    """The file as text; a byte that is not UTF-8 names its line (a UTF-8 BOM is dropped)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LoadgenError(
            f"cannot read trace file {str(path)!r} ({exc.strerror or exc}); pass a readable file"
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise LoadgenError(
            f"{path.name}:{line} is not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "save the trace as UTF-8"
        ) from None


def token_count(value: Any, name: str, where: str) -> int:
    """A prompt or output length: an integer >= 1 (JSON number or CSV text).

    A length below 1 cannot be replayed (no prompt to send, no token to ask for); it is a
    broken row, so it is an error rather than silently turned into 1.
    """
    count = _integer(value)
    if count is None or not 1 <= count <= MAX_TOKEN_COUNT:
        raise LoadgenError(
            f"{where} {name}={echo(value)} is not a token count; use an integer from 1 to "
            f"{MAX_TOKEN_COUNT} (fix or drop the row)"
        )
    return count


def timestamp(value: Any, name: str, where: str, per_second: float = 1.0) -> float:
    """A finite, non-negative time in `name`'s unit, returned in seconds."""
    number = _real(value)
    if number is None or not math.isfinite(number) or number < 0:
        raise LoadgenError(f"{where} {name}={echo(value)} is not a time; use a finite number >= 0")
    return number / per_second


def token_ids(value: Any, name: str, where: str) -> list[int]:
    """A non-empty list of token ids, each an integer >= 0."""
    if not isinstance(value, list) or not value:
        raise LoadgenError(f"{where} {name}={echo(value)} is not a list of token ids")
    ids = []
    for item in value:
        tok = None if isinstance(item, str) else _integer(item)
        if tok is None or tok < 0:
            raise LoadgenError(f"{where} {name} holds {echo(item)}; token ids are integers >= 0")
        ids.append(tok)
    return ids


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value)
    return None


def _real(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
