"""Which re-measured config the report recommends.

A searched config must clear its whole intervals on each draw; the default, what a user runs
today, is stated at the highest rate its pooled runs pass on point estimates. So a searched
config is chosen only where it clears above that figure, and the default is kept otherwise.
"""

from __future__ import annotations

from typing import Any

from tuner.store.records import Candidate, Role


def choose(candidates: list[Candidate]) -> Candidate | None:
    """The best config whose interval clears above the default's stated capacity; else the
    default, where it has one; else the best point estimate (or None).

    The report states the default at the highest rate its pooled runs pass on point estimates.
    A searched config that clears only at or below that rate is no gain over it: one built-in
    run recommended 432 / 112 confirmed at 7.36 req/s, "1.08x the default", where the default
    had passed at 7.82 on both of its draws."""
    default = next((c for c in candidates if c.role is Role.DEFAULT), None)
    # Its stated figure, from its re-measured runs (0 when it was not re-measured).
    bar = default.capacity_ci.point if default and default.capacity_ci else 0.0
    clearing = [c for c in candidates
                if c.clears and (c.role.is_reference or c.confirmed_rps > bar)]  # fmt: skip
    if clearing:
        return max(clearing, key=lambda c: (c.confirmed_rps, c.search_value))
    if bar > 0 and default is not None:
        return default
    return max(candidates, key=lambda c: c.search_value, default=None)


def choose_robust(candidates: list[Candidate], band: dict[str, Any] | None) -> Candidate | None:
    """--robust: of the configs whose interval clears, the one whose worst simulated capacity
    across the traffic band is best (`choose` when there is no band to go by)."""
    worst = {c["trial"]: c["worst_rps"] for c in (band or {}).get("configs", [])}
    clearing = [c for c in candidates if c.clears and c.trial in worst]
    if not clearing:
        return choose(candidates)
    return max(clearing, key=lambda c: (worst[c.trial], c.confirmed_rps))
