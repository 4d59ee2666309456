"""What a scheduler did with one case, step by step, and how two such traces differ."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every sampled token; requests ignore EOS, so only max_tokens and max_model_len end them.
SAMPLED_TOKEN = 7
# A case that has not drained after this many steps is a scheduler that stopped progressing.
MAX_STEPS = 20_000


@dataclass(slots=True)
class SchedTrace:
    """Per step: (request_id, tokens) in batch order and the preempted ids; per request: the
    step that produced its first token and the step that finished it."""

    steps: list[list[tuple[str, int]]] = field(default_factory=list)
    preempted: list[list[str]] = field(default_factory=list)
    first_token_step: dict[str, int] = field(default_factory=dict)
    finish_step: dict[str, int] = field(default_factory=dict)

    @property
    def num_preemptions(self) -> int:
        return sum(len(p) for p in self.preempted)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [[[rid, n] for rid, n in step] for step in self.steps],
            "preempted": self.preempted,
            "first_token_step": self.first_token_step,
            "finish_step": self.finish_step,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SchedTrace:
        return cls(
            steps=[[(rid, int(n)) for rid, n in step] for step in data["steps"]],
            preempted=[list(p) for p in data["preempted"]],
            first_token_step={k: int(v) for k, v in data["first_token_step"].items()},
            finish_step={k: int(v) for k, v in data["finish_step"].items()},
        )


def first_difference(ours: SchedTrace, theirs: SchedTrace) -> str | None:
    """None when identical; else a sentence naming the first step or request that differs."""
    for i, (a, b) in enumerate(zip(ours.steps, theirs.steps, strict=False)):
        if a != b:
            return f"step {i}: ours scheduled {a}, vLLM {b}"
        if ours.preempted[i] != theirs.preempted[i]:
            return f"step {i}: ours preempted {ours.preempted[i]}, vLLM {theirs.preempted[i]}"
    if len(ours.steps) != len(theirs.steps):
        return f"ours took {len(ours.steps)} steps, vLLM {len(theirs.steps)}"
    for name in ("first_token_step", "finish_step"):
        a, b = getattr(ours, name), getattr(theirs, name)
        if a != b:
            rid = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            return f"{name} of {rid}: ours {a.get(rid)}, vLLM {b.get(rid)}"
    return None
