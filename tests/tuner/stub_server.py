"""A fast OpenAI-shaped server for tests of `tune` against real processes: loadgen's scripted
server (1 ms per token) with `/health`, and faults on demand.

    python stub_server.py PORT [--hang] [--die-after N] [--seen FILE] [--pid-file FILE]

--hang: completions never answer (a run is then mid-level for as long as a test needs);
--die-after N: the process exits the moment completion N + 1 arrives (a server that dies
mid-level); --seen FILE: written when the first completion arrives; --pid-file FILE: this
process's pid, written at start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aiohttp import web

from loadgen.scripted_server import Script, ScriptedServer


def build_app(args: argparse.Namespace) -> web.Application:
    script = Script(ttft_ms=5.0, itl_ms=1.0, tokens_per_chunk=4, fail="hang" if args.hang else None)
    app = ScriptedServer(script).app
    completions = 0

    @web.middleware
    async def faults(request: web.Request, handler):  # type: ignore[no-untyped-def]
        nonlocal completions
        if request.path.endswith("/completions"):
            completions += 1
            if args.seen and completions == 1:
                Path(args.seen).write_text("seen")
            if args.die_after is not None and completions > args.die_after:
                os._exit(3)
        return await handler(request)

    app.middlewares.append(faults)
    app.router.add_get("/health", lambda request: web.Response(text="ok"))
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--die-after", type=int)
    p.add_argument("--seen")
    p.add_argument("--pid-file")
    p.add_argument("--budget", help="ignored: a knob placeholder for --launch to fill")
    args = p.parse_args()
    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    web.run_app(build_app(args), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
