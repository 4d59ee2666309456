"""Hand-worked records shared by the slo tests."""

from __future__ import annotations

import pytest
from slo_records import Rec


@pytest.fixture
def hand_records() -> list[Rec]:
    """Four measured requests and one warm-up, with values worked out by hand in the tests."""
    return [
        Rec(99, sent_s=9.0, chunk_times_s=[9.1, 9.2], output_tokens=2, warmup=True),
        # TTFT 0.1, E2EL 0.3, ITL 0.05 0.10 0.05, TPOT 0.2/3; scheduled 0.1 s before its send.
        Rec(0, 10.0, [10.1, 10.15, 10.25, 10.30], 4, scheduled_s=9.9),
        # Long prompt; two chunks, the second carrying 2 tokens: TTFT 0.2, ITL 0.2, TPOT 0.1.
        Rec(1, 10.5, [10.7, 10.9], 3, prompt_len=2000, class_name="long", chunk_tokens=[1, 2]),
        # One token: TTFT = E2EL = 0.05, no TPOT, no ITL.
        Rec(2, 11.0, [11.05], 1, prompt_len=50),
        # Failed before any token; its send time still bounds the run's duration.
        Rec(3, 11.2, [], 0, success=False, error="HTTP 500: boom"),
    ]
