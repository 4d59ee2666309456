"""`AsyncEngine`: the serving API. asyncio in front, the step loop in one background thread.

The thread holds the engine lock only to schedule and to apply a step's results; the forward
pass runs outside it (torch releases the GIL in its kernels), so the event loop can add and
abort requests while the model computes. Each step's token events go to the loop in one
`call_soon_threadsafe` call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from engine_lite.config import SCHEDULER_KNOBS, EngineConfig
from engine_lite.defaults import BatchDefaults
from engine_lite.engine import LLMEngine, Runner, StepResult
from engine_lite.errors import EngineLiteError
from engine_lite.outputs import EngineStats, RequestStats, StepStats, TokenEvent
from engine_lite.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "EngineStats", "RequestStats", "StepStats", "TokenEvent"]

log = logging.getLogger(__name__)

_Item = TokenEvent | BaseException


class AsyncEngine:
    """Requests in from asyncio, tokens out as `TokenEvent`s, one step thread in between."""

    def __init__(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = LLMEngine(config, runner=runner, clock=clock)  # loads the model
        self._clock = clock
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[_Item]] = {}  # touched on the loop thread only
        self._release_wanted = False  # guarded by _cond: an abort left runner state to drop
        self._step_listeners: list[Callable[[StepStats], None]] = []
        self._finish_listeners: list[Callable[[RequestStats], None]] = []
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._error: BaseException | None = None
        self._ids = itertools.count()

    # ---- what callers read ------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The config in force, its limits resolved for this device."""
        return self._engine.config

    @property
    def batch_defaults(self) -> BatchDefaults:
        """The row of vLLM's device table that unset limits take here."""
        return self._engine.batch_defaults

    @property
    def block_size(self) -> int:
        return self._engine.runner.block_size

    @property
    def num_kv_blocks(self) -> int:
        return self._engine.runner.num_kv_blocks

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def eos_token_id(self) -> int | None:
        return self._engine.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    def stats(self) -> EngineStats:
        with self._cond:
            return self._engine.stats()

    def add_step_listener(self, fn: Callable[[StepStats], None]) -> None:
        """`fn(StepStats)` runs on the step thread after every step; keep it quick."""
        self._step_listeners = [*self._step_listeners, fn]

    def add_finish_listener(self, fn: Callable[[RequestStats], None]) -> None:
        """`fn(RequestStats)` runs when a request ends, before its last event is delivered:
        on the step thread, or for an abort on the thread that aborted it."""
        self._finish_listeners = [*self._finish_listeners, fn]

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-lite-step", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the step thread; requests still in flight end with finish_reason "abort"."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        for rid in list(self._queues):
            await self.abort(rid)
        with self._cond:
            self._engine.release_pending()

    # ---- requests -----------------------------------------------------------------------

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request's tokens. Bad input raises EngineLiteError here, at the call;
        leaving the `async for` early (break, aclose, cancel) aborts the request."""
        params = SamplingParams() if params is None else params
        prompt = list(prompt_token_ids)
        self._engine.validate(prompt, params)
        rid = f"req-{next(self._ids)}" if request_id is None else request_id
        if rid in self._queues:
            raise EngineLiteError(f"request_id={rid!r} is already in flight; use a unique id")
        return self._stream(prompt, params, rid)

    async def _stream(
        self, prompt: list[int], params: SamplingParams, rid: str
    ) -> AsyncIterator[TokenEvent]:
        await self.start()
        await self._admitting.wait()  # a reconfigure is waiting for the engine to drain
        if self._error is not None:
            raise EngineLiteError(f"the engine stopped after an error: {self._error!r}")
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        with self._cond:
            self._engine.add_request(prompt, params, request_id=rid, arrival_time_s=self._clock())
            self._cond.notify()
        # Registered before the first await, so no event of this request can be missed.
        self._queues[rid] = queue
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self._abort_now(rid)

    async def abort(self, request_id: str) -> None:
        """Free the request's KV blocks now; its `generate()` then yields a final "abort"
        event and ends. Unknown or finished ids are ignored."""
        stats = self._abort_now(request_id)
        queue = self._queues.get(request_id)
        if stats is not None and queue is not None:
            event = TokenEvent(
                [], self._clock(), True, "abort", stats.num_prompt_tokens, stats.num_output_tokens
            )
            queue.put_nowait(event)

    def _abort_now(self, request_id: str) -> RequestStats | None:
        with self._cond:
            stats = self._engine.abort_request(request_id)
            if stats is not None:
                self._release_wanted = True
                self._cond.notify()  # the step thread drops the request's runner state
        if stats is not None:
            self._notify_finished([stats])
        return stats

    async def reconfigure(self, **scheduler_knobs: Any) -> None:
        """New scheduler knobs with the same weights and KV tensors. New requests wait while
        the engine drains; the swap happens once it is idle."""
        unknown = sorted(set(scheduler_knobs) - set(SCHEDULER_KNOBS))
        if unknown:
            raise EngineLiteError(
                f"reconfigure cannot change {unknown[0]!r}; it takes only the scheduler knobs "
                f"({', '.join(SCHEDULER_KNOBS)})"
            )
        new_config = self._engine.requested_config.replace(**scheduler_knobs)
        await self.while_idle(lambda _runner: self._engine.reconfigure(new_config))

    async def while_idle(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(runner)` once the engine has drained, with new requests held back and the step
        thread kept out: a config swap, or a measurement on the engine's own weights and KV
        tensors in blocks no request holds (no prefix cache keeps free blocks to read again)."""
        self._admitting.clear()
        try:
            while True:
                with self._cond:
                    idle = not self._engine.has_unfinished()
                if idle:
                    done, result = await asyncio.to_thread(self._if_idle, fn)
                    if done:
                        return result
                await asyncio.sleep(0.005)
        finally:
            self._admitting.set()

    def _if_idle(self, fn: Callable[[Any], Any]) -> tuple[bool, Any]:
        with self._cond:  # the step thread waits for this lock before it schedules
            if self._engine.has_unfinished():
                return False, None
            return True, fn(self._engine.runner)

    # ---- the step thread ----------------------------------------------------------------

    def _run(self) -> None:
        engine, cond = self._engine, self._cond
        try:
            while True:
                with cond:
                    while not (self._stopping or self._release_wanted or engine.has_unfinished()):
                        cond.wait()  # idle: sleep until a request, an abort or shutdown
                    if self._stopping:
                        return
                    self._release_wanted = False
                    start_s = self._clock()
                    out = engine.begin_step()
                    if not out.scheduled and engine.has_unfinished():
                        # Would spin forever; fail the streams loudly instead.
                        raise RuntimeError("the scheduler made no progress with requests queued")
                if not out.scheduled:
                    continue
                sampled = engine.runner.execute(out.scheduled)  # outside the lock
                with cond:
                    result = engine.finish_step(out, sampled, start_s)
                self._publish(result)
        except BaseException as exc:  # a dead step thread must not leave streams hanging
            log.exception("engine step failed")
            self._error = exc
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._fail_all, exc)

    def _publish(self, result: StepResult) -> None:
        # Listeners first, so a caller that sees a request end also sees it in the stats.
        for fn in self._step_listeners:
            _call_listener(fn, result.stats)
        self._notify_finished(result.finished)
        if result.events and self._loop is not None:
            self._loop.call_soon_threadsafe(self._dispatch, result.events)

    def _notify_finished(self, finished: list[RequestStats]) -> None:
        for stats in finished:
            for fn in self._finish_listeners:
                _call_listener(fn, stats)

    def _dispatch(self, events: list[tuple[str, TokenEvent]]) -> None:
        queues = self._queues
        for rid, event in events:
            queue = queues.get(rid)
            if queue is not None:
                queue.put_nowait(event)

    def _fail_all(self, exc: BaseException) -> None:
        for queue in self._queues.values():
            queue.put_nowait(exc)


def _call_listener(fn: Callable[[Any], None], arg: Any) -> None:
    # A broken metrics hook must not stop serving.
    try:
        fn(arg)
    except Exception:
        log.exception("engine listener %r failed", fn)
