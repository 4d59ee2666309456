"""`InProcessTarget`: the same replay against an `engine_lite.AsyncEngine`, no HTTP in between."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

from loadgen.records import RequestRecord
from loadgen.workloads import RequestSpec

if TYPE_CHECKING:
    from engine_lite.async_engine import AsyncEngine

_replay_ids = itertools.count()


class InProcessTarget:
    """Drives a started `AsyncEngine` in this process and fills the same `RequestRecord`s.

    A chunk's time is the engine's own `TokenEvent.time_s` (monotonic, end of the step that
    made the tokens): in process there is no network, and this keeps the driver's own
    event-loop wake-up delay out of the measurement. Each event is one chunk carrying
    `len(ev.token_ids)` tokens; usage comes from the event counters.
    """

    def __init__(self, engine: AsyncEngine, temperature: float = 0.0) -> None:
        self.engine = engine
        self.temperature = temperature
        self.description = f"in-process engine_lite ({engine.config.model})"
        self._prefix = ""
        self.chunk_times_from_loop = False  # the engine stamps its tokens itself

    async def open(self) -> None:
        # A fresh id prefix per replay: the same engine serves many replays in a tuning run.
        self._prefix = f"lg{next(_replay_ids)}-"

    def prepare(self, spec: RequestSpec) -> Any:
        from engine_lite import SamplingParams

        n = spec.output_len
        return SamplingParams(
            max_tokens=n, min_tokens=n, ignore_eos=True, temperature=self.temperature
        )

    async def send(
        self, spec: RequestSpec, prepared: Any, record: RequestRecord, timeout_s: float
    ) -> None:
        from engine_lite.errors import EngineLiteError

        request_id = f"{self._prefix}{spec.index}"
        record.sent_s = time.monotonic()
        try:
            await asyncio.wait_for(self._stream(spec, prepared, record, request_id), timeout_s)
        except TimeoutError:
            await self.engine.abort(request_id)
            n = len(record.chunk_times_s)
            record.fail(f"timeout after {timeout_s:g} s ({n} chunks)", time.monotonic())
        except EngineLiteError as exc:
            record.fail(f"engine rejected the request: {exc}", time.monotonic())

    async def _stream(
        self, spec: RequestSpec, params: Any, record: RequestRecord, request_id: str
    ) -> None:
        reason = None
        async for ev in self.engine.generate(spec.prompt_token_ids, params, request_id=request_id):
            if ev.token_ids:
                record.chunk_times_s.append(ev.time_s)
                record.chunk_tokens.append(len(ev.token_ids))
            record.prompt_tokens, record.output_tokens = ev.num_prompt_tokens, ev.num_output_tokens
            if ev.finished:
                reason = ev.finish_reason
        now = time.monotonic()
        if reason == "abort" or reason is None:
            record.fail(f"the engine ended the request without finishing ({reason})", now)
        elif not record.chunk_times_s:
            record.fail("the engine produced no token", now)
        else:
            record.success, record.finished_s = True, now

    async def close(self) -> None:
        """The engine belongs to the caller: it stays up for the next replay."""

    def worker_factory(self) -> None:
        return None
