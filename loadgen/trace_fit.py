"""Trace rows longer than the model's context window: clipped, skipped or refused, and counted."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from loadgen.errors import LoadgenError
from loadgen.traces import TraceRow


class OnLong(enum.StrEnum):
    """What becomes of a row whose prompt + output exceeds max_model_len.

    `clip` (the default) cuts the prompt so the row fits and keeps its output length: every
    arrival of the trace is still sent, so the load it offers keeps its shape, which is what a
    capacity measurement is about. A server would refuse the row whole, so replaying it
    unclipped measures nothing; `skip` drops such rows instead, `error` refuses the trace.
    """

    CLIP = "clip"
    SKIP = "skip"
    ERROR = "error"


@dataclass(slots=True)
class FittedTrace:
    """The rows to replay with their (scaled) lengths, and how many were too long."""

    rows: list[TraceRow]
    prompt_lens: list[int]
    output_lens: list[int]
    num_read: int
    num_long: int
    on_long: OnLong
    max_model_len: int

    def note(self) -> str | None:
        """One line for the user when rows were clipped or skipped, else None."""
        if not self.num_long:
            return None
        done = "had their prompts cut to fit" if self.on_long is OnLong.CLIP else "were skipped"
        return (
            f"{self.num_long} of {self.num_read} trace rows are longer than max_model_len "
            f"{self.max_model_len} (prompt + output) and {done} (--on-long {self.on_long}; "
            f"{_other_choices(self.on_long)})"
        )


def fit_to_context(
    rows: list[TraceRow], max_model_len: int, on_long: str, length_scale: float = 1.0
) -> FittedTrace:
    """Applies `on_long` to the rows whose scaled prompt + output exceeds `max_model_len`."""
    policy = _policy(on_long)
    fit = FittedTrace([], [], [], len(rows), 0, policy, max_model_len)
    for row in rows:
        prompt = max(1, round(row.input_len * length_scale))
        output = max(1, round(row.output_len * length_scale))
        if prompt + output > max_model_len:
            fit.num_long += 1
            if policy is OnLong.ERROR:
                raise LoadgenError(_too_long(row, prompt, output, max_model_len))
            if policy is OnLong.SKIP:
                continue
        fit.rows.append(row)
        fit.prompt_lens.append(prompt)
        fit.output_lens.append(output)
    if not fit.rows:
        raise LoadgenError(
            f"all {len(rows)} trace rows are longer than max_model_len {max_model_len}, so "
            "--on-long skip leaves nothing; use --on-long clip or a larger --max-model-len"
        )
    return fit


def _too_long(row: TraceRow, prompt: int, output: int, max_model_len: int) -> str:
    return (
        f"{row.source or 'a trace row'} has prompt {prompt} + output {output} = "
        f"{prompt + output} tokens, over max_model_len {max_model_len}; use --on-long clip "
        "or skip, or a larger --max-model-len"
    )


def _policy(on_long: str) -> OnLong:
    try:
        return OnLong(on_long)
    except ValueError:
        names = ", ".join(p.value for p in OnLong)
        raise LoadgenError(f"on_long={on_long!r} is unknown; use one of {names}") from None


def _other_choices(policy: OnLong) -> str:
    hints = {
        OnLong.CLIP: "skip drops them",
        OnLong.SKIP: "clip keeps them cut to fit",
        OnLong.ERROR: "",
    }
    return f"{hints[policy]}, error stops at the first"
