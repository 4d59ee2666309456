"""`engine-lite` entry point: `serve` (OpenAI-compatible server) and `bench`."""

from __future__ import annotations

import sys

USAGE = """usage: engine-lite {serve,bench} [options]

  serve   OpenAI-compatible server with vLLM-compatible metrics (engine-lite serve --help)
  bench   engine benchmark (engine-lite bench --help)
"""


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
    print(f"error: unknown command {command!r}; use serve or bench", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
