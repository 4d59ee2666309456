"""OpenAI request bodies: type checks and limits, turned into one `GenerationRequest`."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any

from engine_lite.server.tokenizer import ChatMessage

_MAX_SEED = 2**63 - 1
_CHAT_ROLES = ("system", "developer", "user", "assistant")
# Parameters we do not implement, with the values that mean "not used". Anything else is a 400
# naming the parameter, rather than a silently different answer.
_UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "stop": (None, [], ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "suffix": (None, ""),
    "tools": (None, []),
    "logit_bias": (None, {}),
}


class Endpoint(enum.StrEnum):
    """The two generation endpoints, named by their response `object` prefix."""

    COMPLETIONS = "text_completion"
    CHAT = "chat.completion"


class APIError(Exception):
    """An error answered to the client as OpenAI's `{"error": {...}}` JSON."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.err_type = err_type or _default_type(status)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.code,
            }
        }


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 503:
        return "service_unavailable_error"
    return "invalid_request_error" if status < 500 else "server_error"


@dataclass(slots=True)
class GenerationRequest:
    """One validated completion or chat request, before tokenizing."""

    endpoint: Endpoint
    model: str | None
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise APIError(f"the request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise APIError(
            f"the request body is a JSON {type(body).__name__}, not an object; send a JSON object"
        )
    return body


def parse_completion(body: dict[str, Any]) -> GenerationRequest:
    """Validates a `/v1/completions` body."""
    req = GenerationRequest(Endpoint.COMPLETIONS, _model(body))
    prompt = _unwrap_single_prompt(body.get("prompt"))
    if isinstance(prompt, str):
        if not prompt:
            raise APIError("prompt is empty; send at least one character", param="prompt")
        req.prompt_text = _unicode_text(prompt, "prompt", "prompt")
    else:
        req.prompt_token_ids = _token_ids(prompt, "prompt")
    req.max_tokens = _opt_int(body, "max_tokens", minimum=1)
    _fill_common(req, body)
    return req


def parse_chat(body: dict[str, Any]) -> GenerationRequest:
    """Validates a `/v1/chat/completions` body."""
    req = GenerationRequest(Endpoint.CHAT, _model(body))
    req.messages = _messages(body.get("messages"))
    # OpenAI renamed max_tokens to max_completion_tokens for chat; both are accepted.
    newer = _opt_int(body, "max_completion_tokens", minimum=1)
    req.max_tokens = newer if newer is not None else _opt_int(body, "max_tokens", minimum=1)
    _fill_common(req, body)
    return req


def _fill_common(req: GenerationRequest, body: dict[str, Any]) -> None:
    for name, allowed in _UNSUPPORTED_DEFAULTS.items():
        value = body.get(name)
        if not _is_unset(value, allowed):
            hint = " (use stop_token_ids)" if name == "stop" else ""
            raise APIError(
                f"{name}={json.dumps(value)[:80]} is not supported by engine-lite; "
                f"omit {name}{hint}",
                param=name,
            )
    req.min_tokens = _opt_int(body, "min_tokens", minimum=0) or 0
    req.temperature = _number(body, "temperature", 1.0, lo=0.0, lo_open=False)
    req.top_p = _number(body, "top_p", 1.0, lo=0.0, lo_open=True, hi=1.0)
    req.seed = _opt_int(body, "seed", minimum=0, maximum=_MAX_SEED)
    req.ignore_eos = _bool(body, "ignore_eos")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        req.stop_token_ids = tuple(_token_ids(stop_ids, "stop_token_ids", allow_empty=True))
    req.stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise APIError(
                'stream_options must be an object like {"include_usage": true}',
                param="stream_options",
            )
        if not req.stream:
            raise APIError("stream_options needs stream=true", param="stream_options")
        req.include_usage = _bool(opts, "include_usage", "stream_options.include_usage")
        req.continuous_usage_stats = _bool(
            opts, "continuous_usage_stats", "stream_options.continuous_usage_stats"
        )


def _is_unset(value: Any, allowed: tuple[Any, ...]) -> bool:
    # `True == 1` in Python; a bool is only "unset" where the default itself is a bool.
    return value is None or any(
        value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed
    )


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(f"model must be a string, got {json.dumps(model)[:80]}", param="model")
    return model


def _unwrap_single_prompt(prompt: Any) -> Any:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(
                f"prompt holds {len(prompt)} prompts; engine-lite takes one prompt per request",
                param="prompt",
            )
        return prompt[0]
    if prompt is None:
        raise APIError("prompt is missing; send a string or a list of token ids", param="prompt")
    return prompt


def _token_ids(value: Any, param: str, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise APIError(
            f"{param} must be a string or a non-empty list of token ids, got "
            f"{json.dumps(value)[:80]}",
            param=param,
        )
    for tok in value:
        if type(tok) is not int or tok < 0:
            raise APIError(
                f"{param} holds {json.dumps(tok)[:40]}; token ids are integers >= 0", param=param
            )
    return value


def _messages(value: Any) -> list[ChatMessage]:
    if not isinstance(value, list) or not value:
        raise APIError("messages must be a non-empty list of messages", param="messages")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise APIError(
                f"messages[{i}] must be an object with role and content", param="messages"
            )
        role = msg.get("role")
        if role not in _CHAT_ROLES:
            raise APIError(
                f"messages[{i}].role={json.dumps(role)[:40]} is invalid; use one of "
                + ", ".join(_CHAT_ROLES),
                param="messages",
            )
        out.append(ChatMessage(role, _content(msg.get("content"), i)))
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return _unicode_text(content, f"messages[{i}].content", "messages")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise APIError(
                    f"messages[{i}].content has a non-text part; engine-lite takes text only",
                    param="messages",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise APIError(f"messages[{i}].content text must be a string", param="messages")
            texts.append(_unicode_text(text, f"messages[{i}].content", "messages"))
        return "".join(texts)
    raise APIError(
        f"messages[{i}].content must be a string or a list of text parts", param="messages"
    )


def _unicode_text(text: str, where: str, param: str) -> str:
    # JSON can escape a lone UTF-16 surrogate ("\ud800"): valid JSON, but no character, so
    # no tokenizer can encode it. vLLM answers 400 too.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(
            f"{where} holds a lone surrogate {text[exc.start]!r} at character {exc.start}, "
            "which is not valid Unicode; send UTF-8 text (pair the surrogate or drop it)",
            param=param,
        ) from None
    return text


def _opt_int(
    body: dict[str, Any], name: str, minimum: int, maximum: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise APIError(
            f"{name}={json.dumps(value)[:40]} is invalid; use an integer >= {minimum}{upper}",
            param=name,
        )
    return value


def _number(
    body: dict[str, Any], name: str, default: float, lo: float, lo_open: bool, hi: float = math.inf
) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = type(value) in (int, float) and math.isfinite(value) and value <= hi
    ok = ok and (value > lo if lo_open else value >= lo)
    if not ok:
        span = f"in ({lo:g}, {hi:g}]" if lo_open else f">= {lo:g}"
        raise APIError(
            f"{name}={json.dumps(value)[:40]} is invalid; use a number {span}", param=name
        )
    return float(value)


def _bool(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(
            f"{param or name}={json.dumps(value)[:40]} is invalid; use true or false",
            param=param or name,
        )
    return value
