"""Request validation: every malformed body is a 400 that names the bad parameter."""

import pytest

from engine_lite.server.protocol import (
    APIError,
    Endpoint,
    parse_chat,
    parse_completion,
    parse_json_body,
)


def _param_of(fn, body):
    with pytest.raises(APIError) as info:
        fn(body)
    assert info.value.status == 400
    return info.value.param


def test_text_ids_and_single_item_lists_are_all_accepted():
    assert parse_completion({"prompt": "hi"}).prompt_text == "hi"
    assert parse_completion({"prompt": [5, 6]}).prompt_token_ids == [5, 6]
    assert parse_completion({"prompt": ["hi"]}).prompt_text == "hi"
    assert parse_completion({"prompt": [[5, 6]]}).prompt_token_ids == [5, 6]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, 2.5]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": 7}, "prompt"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 5.0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "temperature": -0.1}, "temperature"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "seed": -3}, "seed"),
        ({"prompt": "x", "seed": 2**70}, "seed"),
        ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
        ({"prompt": "x", "stream": 1}, "stream"),
        ({"prompt": "x", "stop_token_ids": "3"}, "stop_token_ids"),
        ({"prompt": "x", "model": 3}, "model"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "stop": ["\n"]}, "stop"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "stream": True, "stream_options": []}, "stream_options"),
        (
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": "1"}},
            "stream_options.include_usage",
        ),
    ],
)
def test_bad_completion_bodies_name_the_parameter(body, param):
    assert _param_of(parse_completion, body) == param


def test_defaults_and_stream_options():
    req = parse_completion(
        {
            "prompt": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "stop": None,
            "logprobs": None,
            "presence_penalty": 0,
        }
    )
    assert req.endpoint is Endpoint.COMPLETIONS
    assert (req.max_tokens, req.temperature, req.top_p, req.seed) == (None, 1.0, 1.0, None)
    assert req.stream and req.include_usage and not req.continuous_usage_stats


def test_chat_messages_and_text_parts():
    req = parse_chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 4,
            "max_tokens": 9,
        }
    )
    assert [(m.role, m.content) for m in req.messages] == [("system", "be brief"), ("user", "ab")]
    assert req.max_tokens == 4


@pytest.mark.parametrize(
    "messages",
    [
        None,
        [],
        ["hi"],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
    ],
)
def test_bad_chat_messages(messages):
    assert _param_of(parse_chat, {"messages": messages}) == "messages"


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b'"text"', b"\xff\xfe", b"[" * 100000])
def test_malformed_json_is_a_400(raw):
    with pytest.raises(APIError) as info:
        parse_json_body(raw)
    assert (
        info.value.status == 400 and info.value.body()["error"]["type"] == "invalid_request_error"
    )
