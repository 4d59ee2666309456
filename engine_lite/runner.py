"""`ModelRunner`: packs a scheduled batch into one varlen forward over the paged KV cache.

Input preparation is vectorised with numpy (one Python pass over the entries, none over tokens),
so the step's host overhead stays small next to the forward pass even with hundreds of decodes.
"""

from __future__ import annotations

import ctypes
import sys
import time
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from engine_lite.attention import StepBatch, create_backend, default_block_size, resolve_backend
from engine_lite.attention.kv_cache import allocate_kv_cache, num_kv_blocks
from engine_lite.config import EngineConfig
from engine_lite.defaults import CPU_DEVICE, DeviceInfo, UsageContext, cpu_threads, usable_cores
from engine_lite.errors import EngineLiteError
from engine_lite.models import ModelConfig, build_model, resolve_model
from engine_lite.request import Request
from engine_lite.sampler import Sampler

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class StepInputs:
    """One step's host-side inputs."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64: global position of each token in its sequence
    batch: StepBatch
    sample_entries: np.ndarray  # entries whose step reaches their last known token
    logits_rows: np.ndarray  # packed row of each of those entries' last token


class ModelRunner:
    """Owns the weights, the KV cache and the sampler; runs one step at a time."""

    def __init__(self, config: EngineConfig, usage: UsageContext = UsageContext.SERVER) -> None:
        self.device = resolve_device(config.device)
        self.device_info = describe_device(self.device)
        self.dtype = _DTYPES.get(config.dtype) or (
            torch.bfloat16 if self.device.type == "cuda" else torch.float32
        )
        self.cpu_threads: int | None = None  # torch threads on a CPU device
        if self.device.type == "cpu":
            keep_freed_memory()
            half = self.dtype in (torch.bfloat16, torch.float16)
            self.cpu_threads = set_cpu_threads(config.cpu_threads, usage, half)
        source = resolve_model(config.model)
        self.model_config: ModelConfig = source.config
        self.attention_backend = resolve_backend(
            config.attention_backend, self.device, self.dtype, self.model_config.head_dim
        )
        self.block_size = config.block_size or default_block_size(self.attention_backend)
        self.max_model_len = resolve_max_model_len(config, self.model_config)
        # The KV sizing needs the resolved budget; the engine resolves the same way.
        config, _ = config.resolved(self.device_info, self.max_model_len, usage)
        self.config = config
        cfg = self.model_config
        self.backend = create_backend(
            self.attention_backend,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.block_size,
            self.device,
            cfg.sliding_window,
            self.dtype,
        )
        self.model = build_model(source, self.backend, self.device, self.dtype, config.seed)
        self.model.init_rope(self.max_model_len)
        self.num_kv_blocks = num_kv_blocks(
            config, cfg, self.block_size, self.max_model_len, self.device, self.dtype
        )
        self.kv_caches = allocate_kv_cache(
            cfg, self.num_kv_blocks, self.block_size, self.device, self.dtype
        )
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        self.sampler = Sampler(self.device, config.seed, cfg.eos_token_id)
        self.last_forward_duration_s = 0.0

    def execute(self, batch: list[tuple[Request, int]]) -> list[int | None]:
        """One forward over the packed batch; a token for entries that reach their last token.

        Entry (req, n) computes positions req.num_computed_tokens .. + n - 1 of
        req.all_token_ids. Requests are not mutated.
        """
        results: list[int | None] = [None] * len(batch)
        if not batch:
            self.last_forward_duration_s = 0.0
            return results
        inputs = self.prepare(batch)
        meta = self.backend.prepare_metadata(inputs.batch)
        input_ids = torch.from_numpy(inputs.input_ids).to(self.device, non_blocking=True)
        positions = torch.from_numpy(inputs.positions).to(self.device, non_blocking=True)
        rows = torch.from_numpy(inputs.logits_rows).to(self.device, non_blocking=True)
        start = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, meta, self.kv_caches)
            if len(inputs.sample_entries):
                logits = self.model.compute_logits(hidden.index_select(0, rows)).float()
                sampled_reqs = [batch[i][0] for i in inputs.sample_entries]
                tokens = self.sampler.sample(logits, sampled_reqs)
                for entry, token in zip(inputs.sample_entries.tolist(), tokens, strict=True):
                    results[entry] = token
            elif self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self.last_forward_duration_s = time.perf_counter() - start
        return results

    def release(self, request_id: str) -> None:
        """Drops per-request sampler state (a seeded request's generator)."""
        self.sampler.release(request_id)

    def prepare(self, batch: list[tuple[Request, int]]) -> StepInputs:
        """Token ids, global positions, block tables and cache slots of a packed batch."""
        num = len(batch)
        reqs = [req for req, _ in batch]
        # One pass over the entries gathers every per-request number the step needs.
        per_entry = np.array(
            [
                (
                    n,
                    r.num_computed_tokens,
                    len(r.prompt_token_ids) + len(r.output_token_ids),
                    len(r.block_table),
                )
                for r, n in batch
            ],
            dtype=np.int64,
        ).reshape(num, 4)
        query_lens, computed, known, table_lens = per_entry.T
        seq_lens = computed + query_lens
        bs = self.block_size
        needed = -(-seq_lens // bs)
        _check_batch(reqs, query_lens, seq_lens, known, table_lens, needed)
        block_tables = _block_table_matrix(reqs, needed, table_lens)
        token_ids: list[int] = []
        for req, start, end in zip(reqs, computed.tolist(), seq_lens.tolist(), strict=True):
            token_ids += _token_slice(req, start, end)
        cu_q = np.concatenate(([0], np.cumsum(query_lens)))
        total = int(cu_q[-1])
        # Global positions: a chunk continues its sequence, it never restarts at 0.
        positions = np.arange(total, dtype=np.int64) + np.repeat(computed - cu_q[:-1], query_lens)
        entry_of_token = np.repeat(np.arange(num), query_lens)
        slot_mapping = block_tables[entry_of_token, positions // bs].astype(np.int64) * bs + (
            positions % bs
        )
        sample_entries = np.flatnonzero(seq_lens == known)
        return StepInputs(
            input_ids=np.asarray(token_ids, dtype=np.int64),
            positions=positions,
            batch=StepBatch(query_lens, computed, block_tables, slot_mapping),
            sample_entries=sample_entries,
            logits_rows=cu_q[sample_entries + 1] - 1,
        )


def _block_table_matrix(
    reqs: list[Request], needed: np.ndarray, table_lens: np.ndarray
) -> np.ndarray:
    """[entries, max blocks] int32, each row the blocks its context needs, padded with 0."""
    num, total = len(reqs), int(needed.sum())
    if bool((table_lens == needed).all()):
        blocks = chain.from_iterable(r.block_table for r in reqs)
    else:  # some tables already hold blocks for later tokens
        blocks = chain.from_iterable(
            r.block_table[:k] for r, k in zip(reqs, needed.tolist(), strict=True)
        )
    flat = np.fromiter(blocks, np.int32, total)
    matrix = np.zeros((num, int(needed.max())), np.int32)
    rows = np.repeat(np.arange(num), needed)
    cols = np.arange(total) - np.repeat(np.cumsum(needed) - needed, needed)
    matrix[rows, cols] = flat
    return matrix


def keep_freed_memory() -> None:
    """Stops glibc from handing each step's large activations back to the OS when freed.

    By default blocks over ~128 KiB are mmap'ed and unmapped on free, so every step page-faults
    its activations in again (over 100k faults per second of prefill on a small model); keeping
    freed memory in the heap is what jemalloc/tcmalloc give PyTorch CPU inference.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, ...): nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


def set_cpu_threads(requested: int | None, usage: UsageContext, half_precision: bool) -> int:
    """Sets torch's intra-op threads for a CPU engine (process-wide; where none is asked and
    none is chosen the count stays whatever the process has); returns the count in force."""
    threads = cpu_threads(requested, usage, usable_cores(), half_precision)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def describe_device(device: torch.device) -> DeviceInfo:
    """What vLLM's default table looks at: platform, device name and total memory."""
    if device.type != "cuda":
        return CPU_DEVICE
    props = torch.cuda.get_device_properties(device)
    return DeviceInfo("cuda", props.name, int(props.total_memory))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise EngineLiteError(
                f"device={device!r} but CUDA is not available here; use device='cpu' or 'auto'"
            )
        index = resolved.index or 0
        if index >= torch.cuda.device_count():
            raise EngineLiteError(
                f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist; "
                "use cuda:0 .. cuda:N-1"
            )
        resolved = torch.device("cuda", index)
    return resolved


def resolve_max_model_len(config: EngineConfig, cfg: ModelConfig) -> int:
    limit = cfg.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise EngineLiteError(
            f"max_model_len={config.max_model_len} exceeds the model's "
            f"max_position_embeddings={limit}; use max_model_len <= {limit}"
        )
    return config.max_model_len


def _check_batch(
    reqs: list[Request],
    query_lens: np.ndarray,
    seq_lens: np.ndarray,
    known: np.ndarray,
    table_lens: np.ndarray,
    needed: np.ndarray,
) -> None:
    # Scheduler/runner contract violations are bugs, not user errors: fail loudly.
    bad = np.flatnonzero((query_lens < 1) | (seq_lens > known))
    if len(bad):
        i = int(bad[0])
        raise RuntimeError(
            f"request {reqs[i].request_id}: cannot compute {query_lens[i]} tokens up to "
            f"position {seq_lens[i]} of {known[i]} known tokens"
        )
    short = np.flatnonzero(table_lens < needed)
    if len(short):
        i = int(short[0])
        raise RuntimeError(
            f"request {reqs[i].request_id}: block table has {table_lens[i]} blocks but "
            f"{seq_lens[i]} tokens need {needed[i]}"
        )


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    """all_token_ids[start:end] without concatenating the whole sequence every step."""
    prompt = req.prompt_token_ids
    num_prompt = len(prompt)
    if start >= num_prompt:
        return req.output_token_ids[start - num_prompt : end - num_prompt]
    if end <= num_prompt:
        return prompt[start:end]
    return prompt[start:] + req.output_token_ids[: end - num_prompt]
