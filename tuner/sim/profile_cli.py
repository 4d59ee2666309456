"""`tune profile`: the command line of `tuner/sim/profiling.py`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tuner.errors import TuneError
from tuner.settings import DEFAULT_LEVEL_S
from tuner.sim.profiling import ProfileRequest, default_path, make_profile
from tuner.targets.factory import TargetOptions


def build_parser() -> argparse.ArgumentParser:
    about = "Measure a target's engine steps and save its step-time model for the simulator."
    p = argparse.ArgumentParser(prog="tune profile", description=about)
    p.add_argument("--engine", default="builtin", choices=["builtin", "vllm"])
    p.add_argument("--model", default="tiny", help="preset or local Hugging Face folder (a "
                   "folder with --engine vllm)")  # fmt: skip
    p.add_argument("--vllm-command", help="vLLM server command prefix (as for tune)")
    p.add_argument("--vllm-args", default="", help="more vllm serve flags")
    p.add_argument("--device", default="auto", help="built-in engine: auto, cpu, cuda, cuda:N")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--workload", default="mixed")
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument(
        "--level-seconds", type=float, default=DEFAULT_LEVEL_S, help="seconds of arrivals per level"
    )
    p.add_argument("--out", help="profile file (default results/profile-ENGINE-MODEL.json)")
    p.add_argument("--json", action="store_true", help="print the profile")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out) if args.out else default_path(args.engine, args.model)
    try:
        check_writable(out, given=bool(args.out))
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = {} if args.engine == "vllm" else {"device": args.device}
    options = TargetOptions(model=args.model, engine=engine, max_model_len=args.max_model_len,
                            kind=args.engine, vllm_command=args.vllm_command,
                            vllm_args=args.vllm_args,
                            log_dir=Path("results") / "profile-server-logs")  # fmt: skip
    request = ProfileRequest(options, args.workload, args.num_requests,
                             level_s=args.level_seconds)  # fmt: skip
    say = (lambda _: None) if args.quiet or args.json else _progress
    try:
        profile = asyncio.run(make_profile(request, say))
        profile.save(out)
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(profile.to_json(), indent=2))
    else:
        say(f"wrote {out} ({profile.engine} on {profile.device}, model {profile.model})")
    return 0


def check_writable(path: Path, given: bool) -> None:
    """Fail before measuring, not after: the folder must exist (or be ours to make) and take
    a file."""
    flag = "--out" if given else "the default profile path"
    if path.is_dir() or (given and not path.parent.is_dir()):
        raise TuneError(f"{flag} {path} must be a file in an existing folder; pass another --out")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise TuneError(f"{flag} {path} cannot be written ({exc.strerror}); pass another "
                        "--out") from None  # fmt: skip


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
