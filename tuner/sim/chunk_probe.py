"""The chunk probe (`engine_lite.probe`) on a machine this process has to itself.

The probe times batches of many small attention calls, and on a 2-core VM their time hangs on
what the other core does: with a spinning process beside it, the `tiny` preset's 16-chunk batch
of 128 tokens took 6.7 ms where it takes 13.1 ms alone, and the probe read a chunk at 0.05 ms
and its context at 0.12 us a position where it reads 0.34 ms and 0.35 us (four probes,
alternating). One `tune` run's probe read exactly that (0.11 ms, 0.14 us); its simulator then
put budget 432 / threshold 32 at 14.05 req/s, 32% above what the real search measured, and
the run took 154 s where others take 90-134. The serving steps the model is fitted on run with
the machine as quiet as the CPU guard keeps the levels, so the probe is read likewise: when
other processes (this run's own children included) used more than a level may, it waits a
moment and probes again, and keeps the quietest of its tries.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from engine_lite.probe import ChunkProbe, probe_chunk_cost
from tuner.measure.contention import FOREIGN_CORES, others_cores, others_mark

TRIES = 4
PAUSE_S = 1.5  # between tries: what woke beside the probe is often a burst of work


async def probe_alone(engine: Any, tries: int = TRIES, pause_s: float = PAUSE_S
                      ) -> ChunkProbe | None:  # fmt: skip
    """`probe_chunk_cost` on an idle `engine` (one with `while_idle`), tried again while other
    processes used more than `FOREIGN_CORES`; the quietest try, with what others used."""
    quietest: ChunkProbe | None = None
    for attempt in range(tries):
        if attempt:
            await asyncio.sleep(pause_s)
        before = others_mark()
        probe = await engine.while_idle(probe_chunk_cost)
        if probe is None:
            return None
        others = others_cores(before)
        probe = dataclasses.replace(probe, others_cores=others)
        if quietest is None or (others or 0.0) < (quietest.others_cores or 0.0):
            quietest = probe
        if others is None or others <= FOREIGN_CORES:
            break
    return quietest


def described(chunk: ChunkProbe) -> str:
    """For the model's source line."""
    text = (f"a prefill chunk {chunk.chunk_s * 1e3:.2f} ms and {chunk.context_s * 1e6:.2f} us "
            "per position cached before it, measured apart")  # fmt: skip
    others = chunk.others_cores
    if others is not None and others > FOREIGN_CORES:
        text += f" while other processes used {others:.2f} cores"
    return text
