"""The official `openai` client against a real server on the tiny preset."""

import openai
import pytest

# The session server of conftest.py serves this name behind this key.
API_KEY = "test-key"
SERVED_NAME = "tiny-served"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_models_lists_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == [SERVED_NAME]


def test_completion_text_prompt_non_streaming(client):
    out = client.completions.create(
        model=SERVED_NAME,
        prompt="Hello there",
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.object == "text_completion" and out.model == SERVED_NAME
    assert out.usage.prompt_tokens == len(b"Hello there")
    assert out.usage.completion_tokens == 7
    assert out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text) >= 1


def test_completion_streaming_with_usage_has_one_chunk_per_token(client):
    stream = client.completions.create(
        model=SERVED_NAME,
        prompt=[5, 6, 7, 8],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 9
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 8 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == 4
    assert len({c.id for c in chunks}) == 1


def test_streamed_text_equals_non_streamed_text_when_greedy(client):
    kwargs = dict(model=SERVED_NAME, prompt="abc", max_tokens=12, temperature=0)
    whole = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))
    assert streamed == whole


def test_seeded_sampling_repeats_and_differs_by_seed(client):
    def sample(seed):
        return (
            client.completions.create(
                model=SERVED_NAME, prompt="xyz", max_tokens=16, temperature=1.0, seed=seed
            )
            .choices[0]
            .text
        )

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_chat_non_streaming_and_streaming(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    out = client.chat.completions.create(
        model=SERVED_NAME, messages=messages, max_tokens=5, temperature=0
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model=SERVED_NAME,
            messages=messages,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and len(deltas) == 5
    assert "".join(d.content for d in deltas) == out.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 5


def test_stop_token_ids_and_min_tokens(client):
    every_id = list(range(4096))  # whatever the model samples is a stop id

    def run(**extra):
        out = client.completions.create(
            model=SERVED_NAME,
            prompt="q",
            max_tokens=8,
            extra_body={"stop_token_ids": every_id, **extra},
        )
        return out.choices[0].finish_reason, out.usage.completion_tokens

    assert run() == ("stop", 1)
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        run(min_tokens=3)  # no token could ever be sampled
    most = list(range(4000))  # greedy tiny picks ids across the vocabulary
    out = client.completions.create(
        model=SERVED_NAME, prompt="q", max_tokens=8, temperature=0,
        extra_body={"stop_token_ids": most, "min_tokens": 3},
    )  # fmt: skip
    assert out.usage.completion_tokens >= 3


def test_tiny_temperatures_do_not_break_sampling(client):
    for temperature in (1e-40, 1e-6, 0.005):
        out = client.completions.create(
            model=SERVED_NAME, prompt="t", max_tokens=4, temperature=temperature, top_p=1e-300
        )
        assert out.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(model="nope", prompt="x", max_tokens=2), openai.NotFoundError),
        (dict(model=SERVED_NAME, prompt="x", max_tokens=-1), openai.BadRequestError),
        (dict(model=SERVED_NAME, prompt="x", max_tokens=10**9), openai.BadRequestError),
        (dict(model=SERVED_NAME, prompt="x" * 2000, max_tokens=2), openai.BadRequestError),
        (dict(model=SERVED_NAME, prompt="x", temperature=-1), openai.BadRequestError),
        (dict(model=SERVED_NAME, prompt=[1, 10**6], max_tokens=2), openai.BadRequestError),
    ],
)
def test_client_sees_typed_errors(client, kwargs, error):
    with pytest.raises(error) as info:
        client.completions.create(**kwargs)
    assert info.value.status_code < 500
    assert isinstance(info.value.body, dict) and info.value.body.get("message")


def test_bad_api_key_is_401(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=SERVED_NAME, prompt="x", max_tokens=1)
