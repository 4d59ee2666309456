"""`LLM`: the offline API shaped like vLLM's (`LLM(model=...).generate(prompts, params)`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_lite.config import EngineConfig
from engine_lite.defaults import UsageContext
from engine_lite.engine import LLMEngine, Runner
from engine_lite.errors import EngineLiteError
from engine_lite.outputs import CompletionOutput, RequestOutput, RequestStats
from engine_lite.request import Request
from engine_lite.sampling_params import SamplingParams


class LLM:
    """Loads a model once and runs batches of token-id prompts to completion."""

    def __init__(self, model: str = "tiny", *, runner: Runner | None = None, **knobs: Any) -> None:
        try:
            config = EngineConfig(model=model, **knobs)
        except TypeError as exc:  # an unknown keyword: name it instead of a traceback
            raise EngineLiteError(f"{exc}; see EngineConfig for the valid options") from None
        # vLLM's offline class has its own defaults (4096 / 256 on CPU, not the server's).
        self.engine = LLMEngine(config, runner=runner, usage=UsageContext.OFFLINE)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[int],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_progress: bool = False,
    ) -> list[RequestOutput]:
        """One `RequestOutput` per prompt, in prompt order. A flat list of ints is one prompt."""
        batch = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(batch))
        for prompt, p in zip(batch, params, strict=True):  # check all before any runs
            self.engine.validate(prompt, p)
        reqs = [self.engine.add_request(prompt, p) for prompt, p in zip(batch, params, strict=True)]
        stats = self._run(len(reqs), use_progress)
        return [_output(req, stats[req.request_id]) for req in reqs]

    def _run(self, total: int, use_progress: bool) -> dict[str, RequestStats]:
        done: dict[str, RequestStats] = {}
        progress = _Progress(total) if use_progress else None
        try:
            while self.engine.has_unfinished():
                result = self.engine.step()
                for stats in result.finished:
                    done[stats.request_id] = stats
                if progress is not None and result.finished:
                    progress.advance(len(result.finished))
        finally:
            if progress is not None:
                progress.close()
        return done


def _output(req: Request, stats: RequestStats) -> RequestOutput:
    completion = CompletionOutput(0, list(req.output_token_ids), stats.finish_reason)
    return RequestOutput(
        req.request_id, list(req.prompt_token_ids), [completion], finished=True, metrics=stats
    )


def _as_prompt_list(prompts: Sequence[Sequence[int]] | Sequence[int]) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)):
        raise EngineLiteError(
            "prompts must be token ids (list[list[int]]), not text; tokenize them first"
        )
    items = list(prompts)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [items]  # type: ignore[list-item]  # one prompt given as a flat list
    out = []
    for i, p in enumerate(items):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence):
            raise EngineLiteError(
                f"prompt {i} is {type(p).__name__}; pass each prompt as a list of token ids"
            )
        out.append(list(p))
    return out


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    plist = list(params)
    if len(plist) != n:
        raise EngineLiteError(
            f"got {len(plist)} sampling params for {n} prompts; pass one, or one per prompt"
        )
    return plist


class _Progress:
    """A rich progress bar over finished requests (only when asked for)."""

    def __init__(self, total: int) -> None:
        from rich.progress import Progress

        self._bar = Progress(transient=True)
        self._task = self._bar.add_task("generate", total=total)
        self._bar.start()

    def advance(self, n: int) -> None:
        self._bar.advance(self._task, n)

    def close(self) -> None:
        self._bar.stop()
