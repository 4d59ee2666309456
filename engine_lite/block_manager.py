"""Paged KV cache bookkeeping: fixed-size blocks from a free list, one block table per request."""

from __future__ import annotations

from engine_lite.errors import EngineLiteError
from engine_lite.request import Request


class BlockManager:
    """Tracks which physical KV blocks are free; never touches tensors (the runner owns those)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise EngineLiteError(
                f"KV cache has {num_blocks} blocks; raise num_gpu_blocks_override, "
                "kv_cache_memory_gb or gpu_memory_utilization"
            )
        if block_size < 1:
            raise EngineLiteError(f"block_size={block_size} is invalid; use an integer >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack: pop() hands out the lowest free id first, which keeps tests readable.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's `kv_cache_usage`)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold KV for positions 0 .. num_tokens - 1."""
        return -(-num_tokens // self.block_size)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def allocate(self, request: Request, num_tokens: int) -> bool:
        """Grow `request.block_table` to cover `num_tokens` positions; all or nothing."""
        need = self.blocks_for(num_tokens) - len(request.block_table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        table = request.block_table
        pop = self._free.pop
        for _ in range(need):
            table.append(pop())
        return True

    def free(self, request: Request) -> None:
        """Return all of the request's blocks; a second call is a no-op."""
        if request.block_table:
            self._free.extend(reversed(request.block_table))
            request.block_table = []
