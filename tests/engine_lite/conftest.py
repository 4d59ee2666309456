"""Shared fixtures for engine_lite tests: a deterministic fake runner and a fake clock.

The fake runner stands in for the GPU model only. It keeps a real "KV cache" of token ids
addressed through each request's block table and samples a hash of everything it reads back,
so a lost, stale or shared KV block changes the generated tokens just as it would on a model.
"""

from __future__ import annotations

import time

import pytest

from engine_lite.defaults import CPU_DEVICE
from engine_lite.request import Request
from engine_lite.sampling_params import SamplingParams

_MOD = (1 << 61) - 1


def next_token(context: list[int] | tuple[int, ...], vocab_size: int) -> int:
    """The fake model: a deterministic function of the whole context."""
    h = 7
    for tok in context:
        h = (h * 1_000_003 + tok + 1) % _MOD
    return h % vocab_size


def reference_generate(
    prompt: list[int], params: SamplingParams, vocab_size: int, eos: int | None, max_len: int
) -> tuple[list[int], str]:
    """What one request must produce no matter how it was batched, chunked or preempted."""
    out: list[int] = []
    while True:
        tok = next_token(prompt + out, vocab_size)
        out.append(tok)
        if len(out) >= params.min_tokens and (
            (tok == eos and not params.ignore_eos) or tok in params.stop_token_ids
        ):
            return out, "stop"
        if len(out) >= params.max_tokens or len(prompt) + len(out) >= max_len:
            return out, "length"


class FakeClock:
    """Injected clock: time moves only when the fake runner 'computes'."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """ModelRunner's interface in pure Python (no torch); optional cost model on a FakeClock."""

    def __init__(
        self,
        num_kv_blocks: int = 256,
        block_size: int = 4,
        max_model_len: int = 1024,
        vocab_size: int = 997,
        eos_token_id: int | None = None,
        clock: FakeClock | None = None,
        step_cost_s: float = 0.001,
        token_cost_s: float = 0.0001,
        sleep_s: float = 0.0,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.device_info = CPU_DEVICE
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.last_forward_duration_s = 0.0
        self.kv: list[list[int]] = [[-1] * block_size for _ in range(num_kv_blocks)]
        self.released: list[str] = []
        self.batches: list[list[tuple[str, int, int]]] = []  # (request_id, start, n)
        self.clock = clock
        self.step_cost_s = step_cost_s
        self.token_cost_s = token_cost_s
        self.sleep_s = sleep_s  # wall time per forward, releasing the GIL like torch kernels

    def execute(self, batch: list[tuple[Request, int]]) -> list[int | None]:
        bs = self.block_size
        self.batches.append([(r.request_id, r.num_computed_tokens, n) for r, n in batch])
        # Write every entry's new KV first, then "attend": like one packed forward.
        for req, n in batch:
            start = req.num_computed_tokens
            tokens = req.all_token_ids
            assert n >= 1 and start + n <= len(tokens), (req.request_id, start, n)
            assert len(req.block_table) * bs >= start + n, "block table does not cover"
            for pos in range(start, start + n):
                self.kv[req.block_table[pos // bs]][pos % bs] = tokens[pos]
        out: list[int | None] = []
        for req, n in batch:
            end = req.num_computed_tokens + n
            if end < req.num_tokens:
                out.append(None)
                continue
            table = req.block_table
            context = [self.kv[table[p // bs]][p % bs] for p in range(end)]
            out.append(next_token(context, self.vocab_size))
        if self.sleep_s:
            time.sleep(self.sleep_s)
        cost = self.step_cost_s + self.token_cost_s * sum(n for _, n in batch)
        self.last_forward_duration_s = cost
        if self.clock is not None:
            self.clock.now += cost
        return out

    def release(self, request_id: str) -> None:
        self.released.append(request_id)


class Fakes:
    """The helpers above, handed to tests through one fixture (conftest is not importable)."""

    Runner = FakeRunner
    Clock = FakeClock
    next_token = staticmethod(next_token)
    reference_generate = staticmethod(reference_generate)


@pytest.fixture(scope="session")
def fakes() -> Fakes:
    return Fakes()
