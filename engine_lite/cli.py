"""`engine-lite` entry point: `serve` (OpenAI-compatible server), `bench`, `export-hf`."""

from __future__ import annotations

import sys

USAGE = """usage: engine-lite {serve,bench,export-hf} [options]

  serve      OpenAI-compatible server with vLLM-compatible metrics (engine-lite serve --help)
  bench      engine benchmark (engine-lite bench --help)
  export-hf  write a preset's seeded weights as a Hugging Face folder vLLM can load
"""


def export_main(argv: list[str]) -> int:
    import argparse

    from engine_lite.errors import EngineLiteError

    ap = argparse.ArgumentParser(
        prog="engine-lite export-hf",
        description="Write a preset's seeded random weights, config.json and a word-level "
        "tokenizer as a Hugging Face folder, so engine_lite and vLLM run the same weights.",
    )
    ap.add_argument("folder", help="new or empty folder to write")
    ap.add_argument("--model", default="tiny", help="preset name (default tiny)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed, as engine-lite's --seed")
    args = ap.parse_args(argv)
    try:
        from engine_lite.models.export import export_hf_folder

        folder = export_hf_folder(args.model, args.folder, args.seed)
    except (EngineLiteError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.model} (seed {args.seed}) to {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(USAGE, end="", file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    command, rest = args[0], args[1:]
    # Each subcommand owns its parser; imports stay lazy so a bad flag answers before torch loads.
    if command == "serve":
        from engine_lite.server.serve import main as serve_main

        return serve_main(rest)
    if command == "bench":
        from engine_lite.bench import main as bench_main

        return int(bench_main(rest) or 0)
    if command == "export-hf":
        return export_main(rest)
    print(f"error: unknown command {command!r}; use serve, bench or export-hf", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
