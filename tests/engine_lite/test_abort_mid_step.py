"""An abort that lands while a step's forward runs (outside the engine lock) never changes that
step: the other requests finish with the same tokens as without it, and KV goes back to 0.

The real tiny model runs; a hook in the runner aborts a request of the batch it is computing,
once inside input preparation (where the block tables are read) and once inside the forward.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine_lite import LLM, AsyncEngine, EngineConfig, SamplingParams
from engine_lite.runner import ModelRunner

CONFIG = EngineConfig(
    model="tiny", device="cpu", max_model_len=1024, num_gpu_blocks_override=256,
    max_num_batched_tokens=256, max_num_seqs=8,
)  # fmt: skip
PROMPTS = [[(13 * i + 7 * j) % 3000 + 1 for j in range(n)] for i, n in enumerate([40, 300, 9, 120])]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
VICTIM = "req-1"


class _HookedModel:
    """The model, with a call to `before()` at the start of each forward."""

    def __init__(self, model, before) -> None:
        self._model, self._before = model, before

    def __call__(self, *args):
        self._before()
        return self._model(*args)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class HookedRunner(ModelRunner):
    """Calls `hook()` once, in the step thread, at `where` ("prepare" or "forward") of the
    first step whose batch holds the victim."""

    def __init__(self, config: EngineConfig, where: str) -> None:
        super().__init__(config)
        self.where = where
        self.hook = None
        self.fired = threading.Event()
        self._batch_ids: list[str] = []
        if where == "forward":
            self.model = _HookedModel(self.model, self._maybe_fire)

    def execute(self, batch):
        self._batch_ids = [req.request_id for req, _ in batch]
        return super().execute(batch)

    def prepare(self, batch):
        if self.where == "prepare":
            self._maybe_fire()
        return super().prepare(batch)

    def _maybe_fire(self) -> None:
        if self.hook is not None and not self.fired.is_set() and VICTIM in self._batch_ids:
            self.fired.set()
            self.hook()


@pytest.fixture(scope="module")
def expected():
    """Each prompt's greedy tokens with no abort at all."""
    names = ("device", "max_model_len", "num_gpu_blocks_override", "max_num_batched_tokens",
             "max_num_seqs")  # fmt: skip
    knobs = {k: getattr(CONFIG, k) for k in names}
    outs = LLM("tiny", **knobs).generate(PROMPTS, PARAMS)
    return [o.outputs[0].token_ids for o in outs]


async def _collect(gen):
    return [t async for ev in gen for t in ev.token_ids]


@pytest.mark.parametrize("where", ["prepare", "forward"])
async def test_abort_inside_a_step_leaves_the_other_requests_exact(expected, where):
    runner = HookedRunner(CONFIG, where)
    engine = AsyncEngine(CONFIG, runner=runner)
    await engine.start()
    loop = asyncio.get_running_loop()

    def abort_from_the_loop_and_wait() -> None:
        # In the step thread, mid-step: the abort runs on the event loop and completes while
        # this thread still holds the batch, exactly what a client hang-up can do.
        asyncio.run_coroutine_threadsafe(engine.abort(VICTIM), loop).result(timeout=10)

    runner.hook = abort_from_the_loop_and_wait
    gens = [engine.generate(p, PARAMS, request_id=f"req-{i}") for i, p in enumerate(PROMPTS)]
    tokens = await asyncio.gather(*(_collect(g) for g in gens))
    assert runner.fired.is_set()
    assert len(tokens[1]) < PARAMS.max_tokens  # the victim was cut short
    for i in (0, 2, 3):
        assert tokens[i] == expected[i], f"request {i} changed after an abort mid-{where}"
    assert engine.stats().kv_cache_usage == 0.0
    assert engine.stats().num_running == 0
    await engine.shutdown()
