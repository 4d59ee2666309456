"""`python -m engine_lite.fidelity`: how many seeded cases our scheduler and vLLM 0.32's schedule
identically, step by step, per kind of case."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from engine_lite.errors import EngineLiteError
from engine_lite.fidelity.cases import KINDS, make_cases
from engine_lite.fidelity.compare import compare, find_vllm_python


def _parse_seeds(text: str) -> range:
    lo, sep, hi = text.partition("-")
    try:
        return range(int(lo), int(hi) + 1) if sep else range(int(lo))
    except ValueError:
        raise EngineLiteError(
            f"--seeds {text!r} is invalid; use a count (20) or a range (100-149)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine_lite.fidelity", description=__doc__)
    ap.add_argument("--seeds", default="20", help="a count (20 = seeds 0-19) or a range 100-149")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated case kinds")
    ap.add_argument("--vllm-python", help="interpreter with vLLM (default: $VLLM_PYTHON, "
                    ".venv-vllm beside the checkout, or this one)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        kinds = [k for k in args.kinds.split(",") if k]
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise EngineLiteError(f"--kinds: unknown kind {unknown[0]!r}; use {', '.join(KINDS)}")
        python = args.vllm_python or find_vllm_python()
        if python is None:
            raise EngineLiteError("vLLM is not installed; see docs/engine.md or pass --vllm-python")
        results = compare(make_cases(_parse_seeds(args.seeds), kinds), python)
    except EngineLiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        row = rows[r.case.name.rsplit("-", 1)[0]]
        row["cases"] += 1
        row["identical"] += r.difference is None
        row["steps"] += len(r.vllm.steps)
        row["vllm_preemptions"] += r.vllm.num_preemptions
        row["our_preemptions"] += r.ours.num_preemptions
    differing = [f"{r.case.name}: {r.difference}" for r in results if r.difference]
    if args.json:
        print(json.dumps({"kinds": rows, "differences": differing}, indent=2))
    else:
        print(f"{'kind':<12} {'identical':>10} {'steps':>8} {'preempt vLLM':>13} {'ours':>6}")
        for kind, row in rows.items():
            print(f"{kind:<12} {row['identical']:>4} / {row['cases']:<3} {row['steps']:>8} "
                  f"{row['vllm_preemptions']:>13} {row['our_preemptions']:>6}")  # fmt: skip
        for line in differing:
            print(line)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
