"""BlockManager: all-or-nothing growth of block tables, exact frees, usage."""

import pytest

from engine_lite import EngineLiteError, SamplingParams
from engine_lite.block_manager import BlockManager
from engine_lite.request import Request


def _req(rid: str) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(), arrival_time_s=0.0)


def test_allocate_grows_by_whole_blocks_and_is_all_or_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = _req("a"), _req("b")
    assert bm.allocate(a, 5)  # positions 0..4 need 2 blocks
    assert len(a.block_table) == 2 and bm.num_free_blocks == 2
    assert bm.allocate(a, 8)  # still 2 blocks
    assert len(a.block_table) == 2
    assert not bm.allocate(b, 12)  # needs 3, only 2 free: nothing taken
    assert b.block_table == [] and bm.num_free_blocks == 2
    assert bm.allocate(b, 8)
    assert set(a.block_table).isdisjoint(b.block_table)
    assert bm.usage == 1.0


def test_free_returns_every_block_once():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = _req("a")
    bm.allocate(a, 6)
    bm.free(a)
    bm.free(a)  # a second free must not double-count
    assert bm.num_free_blocks == 3 and a.block_table == [] and bm.usage == 0.0
    b = _req("b")
    assert bm.allocate(b, 6) and sorted(b.block_table) == [0, 1, 2]


def test_blocks_for_and_capacity():
    bm = BlockManager(num_blocks=10, block_size=16)
    assert [bm.blocks_for(n) for n in (1, 16, 17, 160)] == [1, 1, 2, 10]
    assert bm.capacity_tokens == 160


def test_empty_cache_is_a_user_error():
    with pytest.raises(EngineLiteError, match="num_gpu_blocks_override"):
        BlockManager(num_blocks=0, block_size=16)
