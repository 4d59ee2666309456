"""Seeded scheduling cases: a scheduler config plus a request stream with arrival steps.

Both our scheduler and vLLM 0.32's are fed the same cases (`engine_lite.fidelity.compare`).
Each kind stresses one rule; `random` mixes them all. Every request can run to the end: its
prompt + max_tokens fits max_model_len and the KV cache.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CaseRequest:
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_step: int  # added before the scheduler's step with this index


@dataclass(frozen=True, slots=True)
class SchedCase:
    name: str
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    long_prefill_token_threshold_adaptive: bool
    num_blocks: int  # usable KV blocks (vLLM gets one more for its null block)
    block_size: int
    max_model_len: int
    requests: tuple[CaseRequest, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SchedCase:
        reqs = tuple(CaseRequest(**r) for r in data["requests"])
        return cls(**{**data, "requests": reqs})

    def scheduler_knobs(self) -> dict[str, Any]:
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "long_prefill_token_threshold_adaptive": self.long_prefill_token_threshold_adaptive,
        }


def _stream(
    rng: random.Random,
    n: int,
    short: tuple[int, int],
    long: tuple[int, int],
    long_frac: float,
    max_tokens: tuple[int, int],
    spread_steps: int,
) -> list[tuple[int, int, int]]:
    """(prompt_len, max_tokens, arrival_step) for n requests, arrivals sorted."""
    out = []
    for _ in range(n):
        lo, hi = long if rng.random() < long_frac else short
        out.append((rng.randint(lo, hi), rng.randint(*max_tokens), rng.randint(0, spread_steps)))
    out.sort(key=lambda r: r[2])
    return out


def _case(name: str, stream: list[tuple[int, int, int]], **knobs: Any) -> SchedCase:
    block_size = knobs.pop("block_size", 16)
    max_model_len = knobs.pop("max_model_len", 8192)
    longest = max(p + m for p, m, _ in stream)
    # Enough blocks for every request at once unless the kind asks for fewer.
    total = sum(-(-(p + m) // block_size) for p, m, _ in stream)
    num_blocks = knobs.pop("num_blocks", total + 1)
    num_blocks = max(num_blocks, -(-longest // block_size))  # the largest one must fit alone
    reqs = tuple(CaseRequest(f"r{i}", p, m, step) for i, (p, m, step) in enumerate(stream))
    base = {
        "max_num_batched_tokens": 512,
        "max_num_seqs": 32,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "long_prefill_token_threshold_adaptive": False,
    }
    return SchedCase(name=name, num_blocks=num_blocks, block_size=block_size,
                     max_model_len=max_model_len, requests=reqs, **{**base, **knobs})  # fmt: skip


def _budget(rng: random.Random) -> int:
    return rng.choice([64, 128, 256, 512, 1024, 2048])


def mixed(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(10, 40), (8, 300), (1000, 4000), 0.15, (1, 64), 60)
    return _case("mixed", stream, max_num_batched_tokens=_budget(rng))


def burst(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(10, 40), (8, 300), (1000, 3000), 0.2, (1, 48), 0)
    return _case("burst", stream, max_num_batched_tokens=_budget(rng))


def lone_long(rng: random.Random) -> SchedCase:
    stream = [(rng.randint(2000, 6000), rng.randint(1, 32), 0)]
    threshold = rng.choice([64, 128, 256])
    return _case("lone_long", stream, max_num_batched_tokens=_budget(rng),
                 long_prefill_token_threshold=threshold)  # fmt: skip


def threshold(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(8, 30), (8, 400), (800, 4000), 0.3, (1, 40), 40)
    budget = _budget(rng)
    return _case("threshold", stream, max_num_batched_tokens=budget,
                 long_prefill_token_threshold=rng.randint(8, max(8, budget)))  # fmt: skip


def adaptive(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(8, 30), (8, 400), (800, 4000), 0.3, (1, 40), 30)
    budget = _budget(rng)
    return _case("adaptive", stream, max_num_batched_tokens=budget,
                 long_prefill_token_threshold=rng.randint(4, max(4, budget // 4)),
                 long_prefill_token_threshold_adaptive=True)  # fmt: skip


def few_seqs(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(10, 30), (8, 200), (600, 2000), 0.2, (1, 40), 20)
    return _case("few_seqs", stream, max_num_batched_tokens=_budget(rng),
                 max_num_seqs=rng.randint(1, 4))  # fmt: skip


def small_kv(rng: random.Random) -> SchedCase:
    stream = _stream(rng, rng.randint(10, 30), (8, 200), (400, 1500), 0.3, (8, 96), 10)
    block_size = rng.choice([4, 16])
    longest = max(p + m for p, m, _ in stream)
    # Room for the largest request and a little more: running requests must be preempted.
    blocks = -(-longest // block_size) + rng.randint(0, 3 * 256 // block_size)
    return _case("small_kv", stream, max_num_batched_tokens=_budget(rng),
                 block_size=block_size, num_blocks=blocks)  # fmt: skip


def kv_pressure(rng: random.Random) -> SchedCase:
    """Short prompts, long answers, a cache for a few of them: decodes outgrow the cache."""
    stream = _stream(rng, rng.randint(12, 40), (8, 120), (300, 800), 0.1, (64, 320), 15)
    block_size = rng.choice([4, 8, 16])
    longest = max(p + m for p, m, _ in stream)
    blocks = -(-longest // block_size) + rng.randint(0, 600 // block_size)
    return _case("kv_pressure", stream, max_num_batched_tokens=_budget(rng),
                 block_size=block_size, num_blocks=blocks,
                 long_prefill_token_threshold=rng.choice([0, 32, 128]))  # fmt: skip


def unchunked(rng: random.Random) -> SchedCase:
    max_model_len = rng.choice([1024, 2048])
    stream = _stream(rng, rng.randint(8, 30), (8, 300), (500, max_model_len - 64), 0.2,
                     (1, 32), 30)  # fmt: skip
    budget = rng.choice([max_model_len, 2 * max_model_len])
    # vLLM applies a threshold even without chunking (it caps the chunk before the check).
    return _case("unchunked", stream, max_model_len=max_model_len,
                 max_num_batched_tokens=budget, enable_chunked_prefill=False,
                 long_prefill_token_threshold=rng.choice([0, 0, 64, 256]))  # fmt: skip


def anything(rng: random.Random) -> SchedCase:
    """Every knob drawn at random, the cache sometimes small."""
    kind = rng.choice([mixed, burst, threshold, adaptive, few_seqs, small_kv, kv_pressure])
    case = kind(rng)
    seqs = rng.choice([case.max_num_seqs, rng.randint(2, 16)])
    thr = rng.choice([0, 0, rng.randint(8, 512)])
    return dataclasses.replace(
        case, name="random", max_num_seqs=min(seqs, case.max_num_batched_tokens),
        long_prefill_token_threshold=thr,
        long_prefill_token_threshold_adaptive=rng.random() < 0.3,
    )  # fmt: skip


KINDS: dict[str, Callable[[random.Random], SchedCase]] = {
    "mixed": mixed,
    "burst": burst,
    "lone_long": lone_long,
    "threshold": threshold,
    "adaptive": adaptive,
    "few_seqs": few_seqs,
    "small_kv": small_kv,
    "kv_pressure": kv_pressure,
    "unchunked": unchunked,
    "random": anything,
}


def make_cases(seeds: range | list[int], kinds: list[str] | None = None) -> list[SchedCase]:
    """One case per (kind, seed); the same seed always gives the same case."""
    out = []
    for kind in kinds or list(KINDS):
        for seed in seeds:
            case = KINDS[kind](random.Random(f"{kind}-{seed}"))
            out.append(dataclasses.replace(case, name=f"{kind}-{seed}"))
    return out
