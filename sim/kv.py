"""Paged KV-cache block accounting (Kwon et al. 2023, "Efficient Memory Management for LLM
Serving with PagedAttention"): fixed-size blocks, allocated on demand, freed on finish.

Why: KV capacity, not weights, bounds concurrency; running out forces preemption. Only counts
are kept: which physical block holds what does not change any timing.
"""

from __future__ import annotations

from sim.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks covering ``num_tokens`` slots: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


class KVBlockManager:
    """Counts free and used blocks of one replica (all its tensor-parallel GPUs together)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.num_used

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return blocks_for(num_tokens, self.block_size) - request.num_blocks <= self.num_free

    def allocate(self, request: Request, num_tokens: int) -> bool:
        """Grow ``request``'s blocks to cover ``num_tokens`` slots; False (no change) if full."""
        need = blocks_for(num_tokens, self.block_size) - request.num_blocks
        if need <= 0:
            return True
        if need > self.num_free:
            return False
        request.num_blocks += need
        self._take(need)
        return True

    def free(self, request: Request) -> None:
        self.num_used -= request.num_blocks
        request.num_blocks = 0

    def allocate_blocks(self, n: int) -> None:
        """Take ``n`` blocks for the aggregate decode set (the caller checked they are free)."""
        if n > self.num_free:
            raise AssertionError(f"KV over-allocation: {n} > {self.num_free} free")
        self._take(n)

    def release_blocks(self, n: int) -> None:
        self.num_used -= n

    def _take(self, n: int) -> None:
        self.num_used += n
        if self.num_used > self.peak_used:
            self.peak_used = self.num_used
