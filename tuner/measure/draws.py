"""Which requests of the list one load level replays: its draw.

A level holds n requests of a longer list. Taken as a contiguous stretch, what it carries
depends on where it falls: on `mixed` (400 requests) the stretches of 60 carried from 0.74x to
1.56x the list's mean prompt length. A TPOT p99 judges the decodes that long prefills stall, so
a heavy stretch fails a rate a light one passes. In three tune runs every config's search
(the first stretch, light) passed a rate that its first re-measurement (the second, heavy)
then failed, and the confirmation stepped every config down twice.

A stratified draw carries the list's mix at every size: the list sorted by prompt length is cut
into n strata of equal share, and the draw takes one request from each. Draws differ in which
member of each stratum they take and in their arrivals, not in how much prefill they bring.
The picks keep the list's order, so a trace's order survives.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np


class LevelMix(enum.StrEnum):
    STRATIFIED = "stratified"  # one request of each prompt-length stratum
    CONTIGUOUS = "contiguous"  # the next stretch of the list, wrapping around


def draw_requests(requests: Sequence[Any], n: int, draw: int, seed: int,
                  mix: LevelMix | str = LevelMix.STRATIFIED) -> list[Any]:  # fmt: skip
    """The n requests (never more than the list) that draw `draw` of a level replays."""
    n = min(n, len(requests))
    if n <= 0:
        return []
    if LevelMix(mix) is LevelMix.CONTIGUOUS:
        start = (draw * n) % len(requests)
        return [*requests[start:], *requests[:start]][:n]
    order = sorted(range(len(requests)), key=lambda i: (_length(requests[i]), i))
    # Stratum k spans sorted positions [k, k + 1) * len / n, fractions included, so every
    # stratum stands for the same share of the list (whole strata of 7 and 6 requests would
    # over-weight the longest sixth by 7%). Where strata are under two requests wide, two
    # picks may fall on one position: the later moves up one, which stays inside the list.
    # From one draw to the next each stratum's pick moves on by 1 / (whole requests in a
    # stratum), so that many draws take different requests: the search's, each re-measurement
    # and each step down (5 draws of 640 from vLLM's list of 3200, 6 of 60 from 400), after
    # which the picks come round again with other arrivals.
    width = len(requests) / n
    start = np.random.default_rng([seed, n]).random(n)
    step = 1 / max(2, int(width))
    picks: list[int] = []
    for k, u in enumerate((start + draw * step) % 1.0):
        position = int((k + u) * width)
        picks.append(max(position, picks[-1] + 1) if picks else position)
    return [requests[i] for i in sorted(order[p] for p in picks)]


def _length(request: Any) -> tuple[int, int]:
    return (request.prompt_len, request.output_len)
