"""The token budgets engineers pick from a table today, by traffic scenario.

The report measures the table's value next to the tuned one, to show what measuring bought.
Values follow the common guidance (vLLM's performance-tuning notes, Sarathi-Serve's 512/2048
budgets for strict/relaxed TBT, serving blogs): about 2048 for code completion, 4096-8192 for
chat, 8192-16384 for long-context RAG, 16384 and up for offline batch. Where the table gives a
range we measure its lower end, the value a latency-minded engineer would start from.
"""

from __future__ import annotations

import enum

from tuner.targets.knobs import Knobs


class Scenario(enum.StrEnum):
    CODE = "code"
    CHAT = "chat"
    RAG = "rag"
    BATCH = "batch"


RULE_OF_THUMB_BUDGET = {
    Scenario.CODE: 2048,
    Scenario.CHAT: 4096,
    Scenario.RAG: 8192,
    Scenario.BATCH: 16384,
}
RULE_OF_THUMB_TEXT = {
    Scenario.CODE: "2048 for code completion",
    Scenario.CHAT: "4096-8192 for chat",
    Scenario.RAG: "8192-16384 for long-context RAG",
    Scenario.BATCH: "16384+ for offline batch",
}

_WORKLOAD_SCENARIO = {
    "code": Scenario.CODE,
    "chat": Scenario.CHAT,
    "mixed": Scenario.CHAT,  # mostly chat traffic with a minority of long prompts
    "agent": Scenario.CHAT,
    "random": Scenario.CHAT,
    "trace": Scenario.CHAT,  # the Azure conversation trace
    "rag": Scenario.RAG,
    "summarize": Scenario.RAG,
}


def scenario_for(workload: str) -> Scenario:
    """The table row a serving engineer would read for this workload."""
    return _WORKLOAD_SCENARIO.get(workload, Scenario.CHAT)


def rule_of_thumb_knobs(scenario: Scenario, default: Knobs) -> Knobs:
    """The default config with the table's token budget (never below max_num_seqs)."""
    budget = max(RULE_OF_THUMB_BUDGET[scenario], default.get("max_num_seqs", 1))
    return {**default, "max_num_batched_tokens": budget}
