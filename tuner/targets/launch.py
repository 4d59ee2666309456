"""`--launch`: start a server command per trial, wait for /health, stop its whole process group."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shlex
import signal
import socket
import string
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import aiohttp

from tuner.errors import TuneError
from tuner.targets.knobs import KNOBS

# Placeholders besides the knobs: where the server must listen and what it serves.
EXTRA_FIELDS = ("port", "host", "model")


@dataclass(frozen=True)
class LaunchSpec:
    """A command template such as `vllm serve M --max-num-batched-tokens {max_num_batched_tokens}`.

    The template is split like a shell would (shlex) *before* placeholders are filled, so a value
    can never become two arguments or shell syntax; the command runs without a shell.
    """

    template: str
    url: str
    model: str

    def __post_init__(self) -> None:
        try:
            tokens = shlex.split(self.template)
        except ValueError as exc:
            raise TuneError(
                f"--launch {self.template!r} does not parse ({exc}); check quotes"
            ) from None
        if not tokens:
            raise TuneError("--launch is empty; give the server command, e.g. 'vllm serve M ...'")
        unknown = sorted(self.fields() - set(KNOBS) - set(EXTRA_FIELDS))
        if unknown:
            raise TuneError(
                f"--launch has unknown placeholder {{{unknown[0]}}}; use a knob name "
                f"({', '.join(KNOBS)}) or one of {', '.join(EXTRA_FIELDS)}"
            )

    def fields(self) -> set[str]:
        """Placeholder names the template uses."""
        names: set[str] = set()
        for token in shlex.split(self.template):
            try:
                parsed = list(string.Formatter().parse(token))
            except ValueError as exc:
                raise TuneError(
                    f"--launch token {token!r} is malformed ({exc}); use {{knob}}"
                ) from None
            names.update(name for _, name, _, _ in parsed if name)
        return names

    def argv(self, knobs: dict[str, Any]) -> list[str]:
        """The argument list for one trial."""
        parts = urlsplit(self.url)
        values = {name: KNOBS[name].to_arg(v) for name, v in knobs.items()}
        values.update(port=str(parts.port or 80), host=parts.hostname or "", model=self.model)
        return [token.format_map(values) for token in shlex.split(self.template)]


class LaunchedServer:
    """One server process in its own process group; `stop()` ends every process in the group."""

    def __init__(
        self,
        argv: list[str],
        url: str,
        *,
        health_timeout_s: float = 600.0,
        stop_grace_s: float = 15.0,
        log_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = argv
        self.env = env  # None: this process's environment
        self.url = url.rstrip("/")
        self.health_timeout_s = health_timeout_s
        self.stop_grace_s = stop_grace_s
        self.log_path = log_path
        self.clock = clock  # the health and stop deadlines are read on it
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    async def start(self) -> None:
        """Start the command and return once GET /health answers 200."""
        log: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = log = self.log_path.open("ab")
        self._refuse_a_taken_port()
        try:
            # process_group=0: the server and any workers it forks share one new process group,
            # so stop() can signal all of them by the group id. Not a new session: with the
            # kernel's autogroup scheduling a session is its own CPU group, and a busy server in
            # a group of its own starved the load generator for up to 1.5 s at a time.
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                env=self.env,
            )
        except OSError as exc:
            raise TuneError(f"--launch could not start {self.argv[0]!r}: {exc.strerror}") from None
        _LIVE_GROUPS.add(self.proc.pid)
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise

    def _refuse_a_taken_port(self) -> None:
        """Something already listening where the server must would answer /health for it and
        be measured in its place (a server left behind by a killed run, say)."""
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            raise TuneError(
                f"something already listens on {host}:{port}, where the --launch server must; "
                "stop it (a server left by an earlier run?) or give --url another port"
            )

    async def _wait_healthy(self) -> None:
        deadline = self.clock() + self.health_timeout_s
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self.check_alive()
                try:
                    async with session.get(f"{self.url}/health") as resp:
                        if resp.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                if self.clock() >= deadline:
                    raise TuneError(
                        f"--launch server gave no 200 from {self.url}/health within "
                        f"{self.health_timeout_s:g}s; check its log{self._log_hint()} or raise "
                        "--launch-timeout"
                    )
                await asyncio.sleep(0.25)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_reason(self) -> str | None:
        """Why the server is gone, when its process has exited (None while it runs)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return (f"--launch server exited with status {self.proc.returncode}: "
                f"{shlex.join(self.argv)}; check its log{self._log_hint()}")  # fmt: skip

    def check_alive(self) -> None:
        """Raise when the server process has exited."""
        if (reason := self.exit_reason()) is not None:
            raise TuneError(reason)

    async def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL it if it is still there after the grace."""
        proc, self.proc = self.proc, None
        if proc is not None:
            pgid = proc.pid  # the group's leader: its pid is the group id
            _signal_group(pgid, signal.SIGTERM)
            try:
                await self._wait_gone(proc, pgid)
            except BaseException:
                # Interrupted while waiting (a second Ctrl-C, a cancelled run): no more grace.
                _signal_group(pgid, signal.SIGKILL)
                raise
            finally:
                _LIVE_GROUPS.discard(pgid)
        if self._log is not None:
            self._log.close()
            self._log = None

    async def _wait_gone(self, proc: subprocess.Popen[bytes], pgid: int) -> None:
        deadline = self.clock() + self.stop_grace_s
        while _group_alive(pgid) and self.clock() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie
            await asyncio.sleep(0.05)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        while proc.poll() is None:
            await asyncio.sleep(0.02)

    def _log_hint(self) -> str:
        return f" ({self.log_path})" if self.log_path else ""


# Process groups started and not yet stopped. A run that ends by an unexpected path still
# kills them on the way out, so no server is left holding its port.
_LIVE_GROUPS: set[int] = set()


@atexit.register
def _kill_live_groups() -> None:
    for pgid in list(_LIVE_GROUPS):
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
