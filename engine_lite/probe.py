"""What one more prefill chunk costs a step, measured on the engine's own runner.

In serving steps a budget's chunk count moves with its prefill tokens (a 64-token threshold
makes every chunk 64 tokens), so a cost model fitted on them cannot tell a chunk's cost from a
token's: fits on one evening's levels of the `tiny` preset put it anywhere from 0 to 1.8 ms,
and at 0.18 ms the simulator ranked budget 432 / threshold 32 1.60x the default where it
measured 1.21x. Here only the chunk count moves: the same prefill tokens split into 1 to 16
chunks (one request each) beside a few decodes, each chunk's cached context chosen so that the
batch's attention work (n * (c + n / 2) summed over chunks) is the same for every split. The
slope of the step time in the split is what one chunk costs: its own attention call in every
layer, and its row as a request. On that preset on a 2-core CPU it read 0.62-0.72 ms whether
beside 0, 8 or 32 decodes, with 128 or 512 prefill tokens.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_lite.request import Request
from engine_lite.sampling_params import SamplingParams

SPLITS = (1, 2, 4, 8, 16)
TOKENS = (128, 512)  # prefill tokens per batch
DECODES = 8  # decodes beside the chunks, with DECODE_CONTEXT positions cached each
DECODE_CONTEXT = 256
ATTENDED = 512  # each batch's attention work is TOKENS * ATTENDED, whatever its split
REPEATS = 5
_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True, slots=True)
class ChunkProbe:
    chunk_s: float  # seconds one more prefill chunk adds to a step
    step_s: dict[str, float]  # "tokens/split" -> median step seconds
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {"chunk_ms": self.chunk_s * 1e3, "wall_s": self.wall_s,
                "step_ms": {k: v * 1e3 for k, v in self.step_s.items()}}  # fmt: skip


def probe_chunk_cost(runner: Any, repeats: int = REPEATS) -> ChunkProbe | None:
    """Time the probe's batches on `runner` (a ModelRunner of an idle engine: the batches
    write KV into blocks no request holds). None when the runner cannot take them."""
    if not all(hasattr(runner, a) for a in ("block_size", "num_kv_blocks", "vocab_size")):
        return None  # a runner that is not a model's (a test's stand-in)
    batches = {f"{t}/{k}": _batch(runner, t, k) for t in TOKENS for k in SPLITS}
    if any(b is None for b in batches.values()):
        return None
    start = time.perf_counter()
    times: dict[str, list[float]] = {name: [] for name in batches}
    for batch in batches.values():
        runner.execute(batch)  # warm-up: the allocator's first sizes
    for _ in range(repeats):
        # Interleaved, so a slow stretch of a shared machine spreads over every split.
        for name, batch in batches.items():
            t0 = time.perf_counter()
            runner.execute(batch)
            times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return ChunkProbe(_slope(medians), medians, time.perf_counter() - start)


def _slope(medians: dict[str, float]) -> float:
    """One slope in the split, one intercept per token count (least squares)."""
    rows, y = [], []
    for name, seconds in medians.items():
        tokens, split = (int(p) for p in name.split("/"))
        rows.append([split, *(float(tokens == t) for t in TOKENS)])
        y.append(seconds)
    coef = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)[0]
    return max(0.0, float(coef[0]))


def _batch(runner: Any, tokens: int, split: int) -> list[tuple[Request, int]] | None:
    n = tokens // split
    cached = ATTENDED - n // 2  # n * (cached + n / 2) * split == tokens * ATTENDED
    entries = [(DECODE_CONTEXT, DECODE_CONTEXT + 1, 1)] * DECODES
    entries += [(cached, cached + n + 1, n)] * split  # one token short of sampling
    bs, block, batch = runner.block_size, 0, []
    for i, (computed, length, scheduled) in enumerate(entries):
        blocks = -(-length // bs)
        if block + blocks > runner.num_kv_blocks:
            return None
        prompt = [(7 * i + 3 * t) % runner.vocab_size for t in range(length)]
        req = Request(f"probe-{i}", prompt, _PARAMS, 0.0, num_computed_tokens=computed)
        req.block_table = list(range(block, block + blocks))
        block += blocks
        batch.append((req, scheduled))
    return batch
