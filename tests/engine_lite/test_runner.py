"""ModelRunner on the tiny preset, driven directly: chunking, packing, sampling and KV sizing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from engine_lite import EngineConfig, EngineLiteError, SamplingParams
from engine_lite.attention.kv_cache import GIB, bytes_per_block
from engine_lite.defaults import UsageContext, usable_cores
from engine_lite.request import Request
from engine_lite.runner import ModelRunner
from engine_lite.sampler import Sampler

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(EngineConfig(model="tiny", num_gpu_blocks_override=1024))


class BlockPool:
    """Hands out physical blocks in a scrambled order so tables are never contiguous."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(reversed(range(num_blocks)))

    def cover(self, req: Request, num_tokens: int, block_size: int) -> None:
        while len(req.block_table) * block_size < num_tokens:
            req.block_table.append(self.free.pop(len(self.free) // 2))


def prompts(*lengths: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (n,), generator=gen).tolist() for n in lengths]


def generate(
    runner: ModelRunner,
    prompt_ids: list[list[int]],
    chunk: int,
    params: SamplingParams = GREEDY,
    id_prefix: str = "r",
) -> list[list[int]]:
    """Every unfinished request gets up to `chunk` tokens per step, all in one packed batch."""
    reqs = [Request(f"{id_prefix}{i}", p, params, 0.0) for i, p in enumerate(prompt_ids)]
    pool = BlockPool(runner.num_kv_blocks)
    for _ in steps_until_done(reqs, params.max_tokens):
        batch = []
        for req in reqs:
            if len(req.output_token_ids) < params.max_tokens:
                n = min(chunk, req.num_tokens - req.num_computed_tokens)
                pool.cover(req, req.num_computed_tokens + n, runner.block_size)
                batch.append((req, n))
        for (req, n), token in zip(batch, runner.execute(batch), strict=True):
            req.num_computed_tokens += n
            if token is not None:
                req.output_token_ids.append(token)
    for req in reqs:
        runner.release(req.request_id)
    return [r.output_token_ids for r in reqs]


def steps_until_done(reqs: list[Request], max_tokens: int) -> Iterator[None]:
    while any(len(r.output_token_ids) < max_tokens for r in reqs):
        yield None


def test_chunked_and_unchunked_prefill_give_identical_tokens(runner: ModelRunner) -> None:
    ids = prompts(5, 70, 300, 33)
    whole = generate(runner, ids, chunk=10_000)
    for chunk in (1, 7, 64):
        assert generate(runner, ids, chunk=chunk) == whole


def test_packed_batch_equals_one_request_at_a_time(runner: ModelRunner) -> None:
    ids = prompts(12, 90, 45)
    together = generate(runner, ids, chunk=16)
    alone = [generate(runner, [p], chunk=16)[0] for p in ids]
    assert together == alone


def test_chunk_positions_continue_the_sequence(runner: ModelRunner) -> None:
    req = Request("p", prompts(100)[0], GREEDY, 0.0)
    req.num_computed_tokens = 37
    req.block_table = [9, 3, 500, 7, 1, 2, 4]
    other = Request("q", prompts(3)[0], GREEDY, 0.0, block_table=[11])
    inputs = runner.prepare([(other, 3), (req, 20)])
    assert inputs.positions.tolist() == [0, 1, 2, *range(37, 57)]
    assert inputs.input_ids.tolist()[3:] == req.prompt_token_ids[37:57]
    bs = runner.block_size
    expected = [req.block_table[p // bs] * bs + p % bs for p in range(37, 57)]
    assert inputs.batch.slot_mapping.tolist()[3:] == expected
    # only the entry whose step reaches its last known token is sampled
    assert inputs.sample_entries.tolist() == [0]


def test_tokens_only_for_entries_that_reach_their_end(runner: ModelRunner) -> None:
    pool = BlockPool(runner.num_kv_blocks)
    a = Request("a", prompts(40)[0], GREEDY, 0.0)
    b = Request("b", prompts(8, seed=1)[0], GREEDY, 0.0)
    pool.cover(a, 20, runner.block_size)
    pool.cover(b, 8, runner.block_size)
    before = (a.num_computed_tokens, list(a.block_table), list(a.output_token_ids))
    out = runner.execute([(a, 20), (b, 8)])
    assert out[0] is None and isinstance(out[1], int)
    assert (a.num_computed_tokens, a.block_table, a.output_token_ids) == before  # not mutated


def test_seeded_sampling_is_reproducible_and_batch_independent(runner: ModelRunner) -> None:
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=1234)
    ids = prompts(20, 50)
    first = generate(runner, ids, chunk=64, params=seeded)
    # different batch mates and chunking: the seeded request's tokens do not change
    mixed = generate(runner, [ids[0], *prompts(7, 99, seed=5)], chunk=9, params=seeded)
    assert mixed[0] == first[0]
    other_seed = dataclasses.replace(seeded, seed=4321)
    assert generate(runner, ids, chunk=64, params=other_seed) != first


def test_unseeded_sampling_varies(runner: ModelRunner) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0)
    ids = prompts(20)
    assert generate(runner, ids, 64, params) != generate(runner, ids, 64, params)


def test_tiny_top_p_is_greedy(runner: ModelRunner) -> None:
    ids = prompts(30, 60)
    nucleus = SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-6, seed=3)
    assert generate(runner, ids, 64, nucleus) == generate(runner, ids, 64)


def test_release_drops_the_seeded_generator(runner: ModelRunner) -> None:
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=7)
    ids = prompts(10)
    # `generate` releases every request when done; reusing the id must restart the stream
    assert generate(runner, ids, 64, params, "x") == generate(runner, ids, 64, params, "x")
    assert not runner.sampler._seeded


def test_min_tokens_blocks_eos_and_stop_tokens() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0, eos_token_id=5)
    params = SamplingParams(max_tokens=4, min_tokens=2, temperature=0.0, stop_token_ids=(6,))
    req = Request("m", [1, 2], params, 0.0)
    logits = torch.zeros(1, 10)
    logits[0, 5], logits[0, 6], logits[0, 3] = 3.0, 2.0, 1.0
    assert sampler.sample(logits.clone(), [req]) == [3]
    req.output_token_ids = [3, 3]  # min_tokens reached: EOS may end it now
    assert sampler.sample(logits.clone(), [req]) == [5]


def test_kv_cache_sizes() -> None:
    # The CPU layout (16-token blocks, float32); a CUDA box would pick flash-attn's 256 and bf16.
    override = ModelRunner(EngineConfig(model="tiny", device="cpu", num_gpu_blocks_override=77))
    assert override.num_kv_blocks == 77
    assert override.kv_caches[0][0].shape == (77, 16, 2, 32)
    per_block = bytes_per_block(override.model_config, 16, torch.float32)
    by_memory = ModelRunner(EngineConfig(model="tiny", device="cpu", kv_cache_memory_gb=0.01))
    assert by_memory.num_kv_blocks == int(0.01 * GIB) // per_block
    # 4 GiB would hold far more than 2 sequences of 1024 tokens could ever use
    capped = ModelRunner(
        EngineConfig(model="tiny", device="cpu", max_num_seqs=2, max_model_len=1024)
    )
    assert capped.num_kv_blocks == 2 * 1024 // 16


def test_a_serving_runner_in_bfloat16_leaves_a_core_to_the_serving_path() -> None:
    before = torch.get_num_threads()
    small = {"device": "cpu", "max_model_len": 256}
    try:
        torch.set_num_threads(2)
        offline = ModelRunner(EngineConfig(dtype="bfloat16", **small), UsageContext.OFFLINE)
        assert offline.cpu_threads == torch.get_num_threads() == 2
        fp32 = ModelRunner(EngineConfig(dtype="float32", **small))
        assert fp32.cpu_threads == torch.get_num_threads() == 2
        serving = ModelRunner(EngineConfig(dtype="bfloat16", **small))
        assert serving.cpu_threads == torch.get_num_threads() == max(1, usable_cores() - 1)
        asked = ModelRunner(EngineConfig(cpu_threads=3, **small))
        assert asked.cpu_threads == torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"device": "cuda"}, "CUDA is not available"),
        ({"attention_backend": "flash", "device": "cpu"}, "attention_backend='flash'"),
        ({"max_model_len": 9000}, "max_model_len=9000"),
    ],
)
def test_bad_engine_settings_are_named(knobs: dict[str, object], match: str) -> None:
    if torch.cuda.is_available() and knobs.get("device") == "cuda":
        pytest.skip("CUDA is available here")
    with pytest.raises(EngineLiteError, match=match):
        ModelRunner(EngineConfig(model="tiny", num_gpu_blocks_override=8, **knobs))  # type: ignore[arg-type]


def test_backend_choice_follows_device_and_dtype() -> None:
    from engine_lite.attention import resolve_backend

    cuda = torch.device("cuda")
    assert resolve_backend("auto", torch.device("cpu"), torch.float32, 128) == "torch"
    # flash-attn has no fp32 kernels: auto falls back, an explicit request is refused
    assert resolve_backend("auto", cuda, torch.float32, 128) == "torch"
    with pytest.raises(EngineLiteError, match="dtype bfloat16 or float16"):
        resolve_backend("flash", cuda, torch.float32, 128)
    # nor kernels for a head dim off its multiples of 8 or above 256
    for head_dim in (20, 320):
        assert resolve_backend("auto", cuda, torch.bfloat16, head_dim) == "torch"
        with pytest.raises(EngineLiteError, match=f"head_dim={head_dim}"):
            resolve_backend("flash", cuda, torch.bfloat16, head_dim)
