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
beside 0, 8 or 32 decodes, with 128 or 512 prefill tokens; 0.27-0.37 ms once the read of the
chunks' cached positions (below) is priced apart.

A chunk also gathers every position cached before it, in every layer. In serving steps the
cached context grows with the attention work (n * c), so a fit cannot separate them either, and
it put the read on the attention term, which charges a 16-token chunk a sixteenth of what a
256-token one pays per cached position. Here chunks of 16 and of 64 tokens are timed after 0,
half and all of CONTEXT cached positions: the slope in the context is a * n + b per chunk, and
b, the part that does not grow with the chunk, is the read. On the `tiny` preset it read
0.33-0.50 us a position: a 4000-token prompt cut into 16-token chunks pays 0.1 s for it,
which the simulator missed when it put budget 256 / threshold 16 a capacity step or two above
what it measured.
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
CONTEXT_CHUNKS = 4  # chunks per batch of the context probe, each of CONTEXT_TOKENS
CONTEXT_TOKENS = (16, 64)
CONTEXT = 2048  # most cached positions before a chunk (less where the model is shorter)
_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True, slots=True)
class ChunkProbe:
    chunk_s: float  # seconds one more prefill chunk adds to a step, with no context cached
    step_s: dict[str, float]  # "tokens/split" and "tokens@context" -> median step seconds
    wall_s: float
    context_s: float = 0.0  # seconds a chunk adds per position cached before it
    # Mean cores other processes used while it ran (None: not watched); see `tuner.sim.chunk_probe`.
    others_cores: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"chunk_ms": self.chunk_s * 1e3, "context_us": self.context_s * 1e6,
                "wall_s": self.wall_s, "others_cores": self.others_cores,
                "step_ms": {k: v * 1e3 for k, v in self.step_s.items()}}  # fmt: skip


def probe_chunk_cost(runner: Any, repeats: int = REPEATS) -> ChunkProbe | None:
    """Time the probe's batches on `runner` (a ModelRunner of an idle engine: the batches
    write KV into blocks no request holds). None when the runner cannot take them."""
    if not all(hasattr(runner, a) for a in ("block_size", "num_kv_blocks", "vocab_size")):
        return None  # a runner that is not a model's (a test's stand-in)
    batches = {f"{t}/{k}": _batch(runner, _split(t, k)) for t in TOKENS for k in SPLITS}
    longest = min(CONTEXT, getattr(runner, "max_model_len", CONTEXT) - max(CONTEXT_TOKENS) - 1)
    contexts = (0, longest // 2, longest)
    batches |= {f"{n}@{c}": _batch(runner, [(c, n)] * CONTEXT_CHUNKS)
                for n in CONTEXT_TOKENS for c in contexts}  # fmt: skip
    if longest < 1 or any(b is None for b in batches.values()):
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
    context_s = _context_cost(medians)
    return ChunkProbe(_slope(medians, context_s), medians, time.perf_counter() - start,
                      context_s)  # fmt: skip


def _split(tokens: int, split: int) -> list[tuple[int, int]]:
    """`tokens` prefill tokens in `split` chunks, each after as many cached positions as
    keeps the batch's attention work at tokens * ATTENDED."""
    n = tokens // split
    return [(ATTENDED - n // 2, n)] * split


def _context_cost(medians: dict[str, float]) -> float:
    """Per chunk and cached position, the part of the slope that does not grow with the chunk:
    the slope is a * n + b for chunks of n tokens; b from the two sizes."""
    slopes = []
    for n in CONTEXT_TOKENS:
        points = [(int(k.split("@")[1]), v) for k, v in medians.items() if k.startswith(f"{n}@")]
        c, y = np.array(points, dtype=float).T
        slopes.append(float(np.polyfit(c, y, 1)[0]) / CONTEXT_CHUNKS)
    (n1, n2), (s1, s2) = CONTEXT_TOKENS, slopes
    return max(0.0, (n2 * s1 - n1 * s2) / (n2 - n1))


def _slope(medians: dict[str, float], context_s: float) -> float:
    """One slope in the split, one intercept per token count (least squares), with each
    split's cached positions priced at `context_s`."""
    rows, y = [], []
    for name, seconds in medians.items():
        if "/" not in name:
            continue
        tokens, split = (int(p) for p in name.split("/"))
        cached = sum(c for c, _ in _split(tokens, split))
        rows.append([split, *(float(tokens == t) for t in TOKENS)])
        y.append(seconds - context_s * cached)
    coef = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)[0]
    return max(0.0, float(coef[0]))


def _batch(runner: Any, chunks: list[tuple[int, int]]) -> list[tuple[Request, int]] | None:
    """DECODES decodes and one request per (cached, tokens) chunk, in blocks no request holds;
    None when the cache is too small."""
    entries = [(DECODE_CONTEXT, DECODE_CONTEXT + 1, 1)] * DECODES
    entries += [(cached, cached + n + 1, n) for cached, n in chunks]  # one token short of sampling
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
