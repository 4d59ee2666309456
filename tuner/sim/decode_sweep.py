"""A burst that walks the decode batch from many requests down to one, for the step-time fit.

A step-time model is fitted on the steps the engine served while it was measured, on one
workload. On `mixed`, most decode steps hold fewer than 24 rows, so the fit cannot tell a row's
cost from its context's and reads the per-row cost anywhere from 0.07 to 0.12 ms (two fits of
the `tiny` preset on one VM). A workload with larger decode batches then simulates wrong: the
first of those fits read `chat`'s steps at 32 req/s 31% slow (those of 64 and more decodes 45%).

So every fit of the built-in engine (`tune`, `tune profile`, `benchmarks/sim_vs_real.py`) also
sees this burst: SWEEP_REQUESTS requests at once, prompts and output lengths drawn apart
(seeded), so the batch fills with every request and shrinks one finish at a time, with contexts
from short to long. About 4 s on the `tiny` preset on a 2-core CPU. The fit weighs each band
of batch sizes alike (`engine_lite.costmodel`), so the burst's few hundred steps count beside a
level's thousands. On one set of `mixed` steps (the default's search and the small-budget
level) the fit as it was (no burst, steps as they came) read `chat`'s steps at 32 and 36 req/s
at 1.08 and 1.06 of their summed real time, and with both at 0.99 and 0.95, `mixed`'s held-out
levels unchanged (0.92-0.94). In `benchmarks/sim_vs_real.py`, `chat`'s capacity went from
16-21% low to 0-6%.

`tune` first left it out: in four runs with it, right after four without, it verified as many
configs and overstated more of them, but the model then lacked a chunk's context read
(`engine_lite.probe`), which made small budgets' steps read fast with or without the burst.
A second per-row feature that let the cost bend up to 16 rows was tried twice and not kept
(docs/tuner.md).
"""

from __future__ import annotations

import dataclasses
import math
import random

from loadgen.workloads import RequestSpec
from tuner.measure.meter import LevelRun, Meter
from tuner.search.space import SearchSpace

SWEEP_REQUESTS = 96
PROMPT_LEN = (32, 1536)
OUTPUT_LEN = (16, 192)
SEED = 0


def sweep_requests(max_model_len: int, vocab_size: int) -> list[RequestSpec]:
    """The burst's requests, each within `max_model_len`."""
    rng = random.Random(SEED)
    longest = max(1, min(PROMPT_LEN[1], max_model_len - OUTPUT_LEN[1]))
    requests = []
    for i in range(SWEEP_REQUESTS):
        prompt = [rng.randrange(vocab_size)
                  for _ in range(rng.randint(min(PROMPT_LEN[0], longest), longest))]  # fmt: skip
        output_len = min(rng.randint(*OUTPUT_LEN), max_model_len - len(prompt))
        requests.append(RequestSpec(i, prompt, max(1, output_len), "short"))
    return requests


async def decode_sweep(meter: Meter, space: SearchSpace) -> LevelRun:
    """The burst on the default config (its budget prefills it in few steps)."""
    facts = meter.target.facts
    await meter.target.apply(space.default_config())
    burst = dataclasses.replace(meter, requests=sweep_requests(facts.max_model_len,
                                                              facts.vocab_size))  # fmt: skip
    return await burst.level(math.inf)
