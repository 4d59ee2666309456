"""Length distributions of the workload presets (chat, code, rag, summarize, agent, mixed).

Sizes are token counts for an 8,192-token context, drawn from clipped log-normals: production
traces (Azure LLM inference 2023, Splitwise ISCA'24) show right-skewed lengths, with
conversation prompts around a thousand tokens and code prompts longer, with short outputs.
A smaller context shrinks every length in proportion; a larger one keeps them, since real
traffic does not grow because the model could take more (`length_scale` stretches explicitly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REFERENCE_MODEL_LEN = 8192


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A log-normal length with the given median, clipped to [lo, hi] (reference context)."""

    median: int
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
        lo = max(1, round(self.lo * scale))
        hi = max(lo, round(self.hi * scale))
        raw = rng.lognormal(math.log(self.median * scale), self.sigma, size=n)
        return np.clip(np.rint(raw), lo, hi).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Component:
    """One kind of request in a preset: its share and its prompt/output length distributions."""

    weight: float
    prompt: LengthDist
    output: LengthDist


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    components: tuple[Component, ...]


_CHAT = Component(1.0, LengthDist(320, 0.8, 16, 1024), LengthDist(160, 0.7, 16, 512))
# Code completion as the Azure 2023 code trace has it: prompts around a thousand tokens, answers
# of about a dozen (median 13, p90 55). Such short answers cannot average a prefill stall away,
# so their TPOT is the first thing an unchunked long prompt breaks.
_COMPLETION = Component(1.0, LengthDist(1024, 0.8, 64, 4096), LengthDist(13, 0.6, 4, 128))
# Long-context prompts (retrieval, documents) near the context limit.
_LONG = Component(1.0, LengthDist(6144, 0.25, 4096, 7680), LengthDist(160, 0.6, 32, 512))

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("chat", "short prompts, medium answers", (_CHAT,)),
        Preset(
            "code",
            "short prompts, short completions; ITL-sensitive",
            (Component(1.0, LengthDist(384, 0.6, 32, 1024), LengthDist(48, 0.6, 8, 160)),),
        ),
        Preset(
            "rag",
            "long retrieved context, short answers",
            (Component(1.0, LengthDist(3072, 0.35, 1536, 6144), LengthDist(96, 0.6, 16, 320)),),
        ),
        Preset(
            "summarize",
            "long documents, long summaries",
            (Component(1.0, LengthDist(4096, 0.3, 2048, 6656), LengthDist(320, 0.4, 96, 768)),),
        ),
        Preset(
            "mixed",
            "60% chat, 30% code completion, 10% long context: short answers beside long "
            "prefills, where chunked prefill matters",
            (
                Component(0.60, _CHAT.prompt, _CHAT.output),
                Component(0.30, _COMPLETION.prompt, _COMPLETION.output),
                Component(0.10, _LONG.prompt, _LONG.output),
            ),
        ),
    )
}

# agent: multi-turn sessions whose context grows by each answer and the next user message.
AGENT_SYSTEM = LengthDist(768, 0.4, 256, 2048)
AGENT_USER = LengthDist(96, 0.9, 8, 1024)
AGENT_OUTPUT = LengthDist(128, 0.6, 16, 384)
AGENT_TURNS = (2, 8)  # turns per session, uniform inclusive


def length_scale_for(max_model_len: int) -> float:
    """Shrink preset lengths for contexts under the reference; never stretch them."""
    return min(1.0, max_model_len / REFERENCE_MODEL_LEN)


def sample_lengths(
    preset: Preset, rng: np.random.Generator, n: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens) for n requests of a preset, components mixed by weight."""
    weights = np.array([c.weight for c in preset.components], dtype=np.float64)
    which = rng.choice(len(weights), size=n, p=weights / weights.sum())
    prompts = np.zeros(n, dtype=np.int64)
    outputs = np.zeros(n, dtype=np.int64)
    for k, comp in enumerate(preset.components):
        idx = np.flatnonzero(which == k)
        prompts[idx] = comp.prompt.sample(rng, idx.size, scale)
        outputs[idx] = comp.output.sample(rng, idx.size, scale)
    return prompts, outputs


def agent_sessions(
    rng: np.random.Generator, n: int, scale: float, max_model_len: int
) -> list[tuple[int, list[tuple[int, int]]]]:
    """Sessions as (session_id, [(context_len_added, output_len) per turn]) totalling n turns.

    Turn 1 adds the system prompt and a user message; each later turn adds the previous answer
    and a new user message. A session ends early when its context would not fit.
    """
    sessions: list[tuple[int, list[tuple[int, int]]]] = []
    total = 0
    while total < n:
        turns_wanted = int(rng.integers(AGENT_TURNS[0], AGENT_TURNS[1] + 1))
        turns: list[tuple[int, int]] = []
        context, prev_out = 0, 0
        for t in range(min(turns_wanted, n - total)):
            added = int(AGENT_USER.sample(rng, 1, scale)[0]) + prev_out
            if t == 0:
                added += int(AGENT_SYSTEM.sample(rng, 1, scale)[0])
            out = int(AGENT_OUTPUT.sample(rng, 1, scale)[0])
            if context + added + out > max_model_len:
                break
            turns.append((added, out))
            context, prev_out = context + added, out
        if not turns:  # the first turn alone did not fit: a minimal one always does
            turns = [(max(1, max_model_len // 2), 1)]
        sessions.append((len(sessions), turns))
        total += len(turns)
    return sessions
