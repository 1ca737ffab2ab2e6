"""Paged KV-cache block accounting (Kwon et al. 2023, "Efficient Memory Management for LLM
Serving with PagedAttention"), with vLLM's automatic prefix caching.

Why: KV capacity, not weights, bounds concurrency; running out forces preemption. Only counts
are kept (which physical block holds what changes no timing). With prefix caching, a full
block of a prompt is identified by the hash chain of its tokens (vLLM ``hash_block_tokens``):
blocks whose chain is cached are reused instead of recomputed; a cached block nobody
references stays resident but counts as free, and is evicted least-recently-used only when an
allocation needs the space.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks covering ``num_tokens`` slots: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def prefix_keys(req: Request, block_size: int) -> list:
    """Cache keys of the prompt's full KV blocks: the hash chain up to the block's last token.

    ``req.hash_ids`` holds one id per ``hash_block_size`` tokens (Mooncake: 512); a block's
    key is (chain of ids up to the one holding its last token, offset inside that id).
    """
    if req.prefix_keys is None:
        keys: list = []
        if req.hash_ids is not None and len(req.hash_ids):
            h = req.hash_block_size
            chain, c = [], 0
            for hid in req.hash_ids:
                c = hash((c, int(hid)))
                chain.append(c)
            full = min(len(chain) * h, req.prompt_tokens) // block_size
            for j in range(full):
                last = (j + 1) * block_size - 1
                keys.append((chain[last // h], last % h))
        req.prefix_keys = keys
    return req.prefix_keys


class KVBlockManager:
    """Counts the blocks of one replica (all its tensor-parallel GPUs together)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0          # blocks referenced by running requests (shared ones once)
        self.peak_used = 0
        self.prefix_caching = enable_prefix_caching
        self.num_cached_free = 0   # cached blocks no request references (evictable, free)
        self._refs: dict = {}      # cache key -> number of running requests referencing it
        self._lru: OrderedDict = OrderedDict()  # evictable keys, least recently released first
        self.num_evicted = 0
        self.query_tokens = 0      # prompt tokens looked up in the prefix cache
        self.hit_tokens = 0        # of which found cached

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get: never used, or cached but unreferenced."""
        return self.num_blocks - self.num_used

    # -- allocation -----------------------------------------------------------------------------
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

    def allocate_blocks(self, n: int) -> None:
        """Take ``n`` blocks for the aggregate decode set (the caller checked they are free)."""
        if n > self.num_free:
            raise AssertionError(f"KV over-allocation: {n} > {self.num_free} free")
        self._take(n)

    def release_blocks(self, n: int) -> None:
        self.num_used -= n

    def free(self, request: Request) -> None:
        """Release a request's blocks; its cached prefix blocks stay resident, evictable."""
        self.num_used -= request.num_blocks - request.num_shared_blocks
        for key in request.cached_keys:
            refs = self._refs[key] - 1
            self._refs[key] = refs
            if refs == 0:
                self.num_used -= 1
                self.num_cached_free += 1
                self._lru[key] = None
        request.cached_keys = []
        request.num_shared_blocks = 0
        request.num_blocks = 0

    def _take(self, n: int) -> None:
        self.num_used += n
        overflow = self.num_used + self.num_cached_free - self.num_blocks
        for _ in range(max(0, overflow)):  # evict least recently used cached blocks
            key, _ = self._lru.popitem(last=False)
            del self._refs[key]
            self.num_cached_free -= 1
            self.num_evicted += 1
        if self.num_used > self.peak_used:
            self.peak_used = self.num_used

    # -- prefix cache ---------------------------------------------------------------------------
    def lookup(self, request: Request) -> int:
        """Cached blocks at the start of the prompt (at least one token is left to compute)."""
        if not self.prefix_caching:
            return 0
        keys = prefix_keys(request, self.block_size)
        cap = min(len(keys), (request.prompt_tokens - 1) // self.block_size)
        hit = 0
        refs = self._refs
        while hit < cap and keys[hit] in refs:
            hit += 1
        return hit

    def evictable_among(self, request: Request, hit: int) -> int:
        """How many of the first ``hit`` cached blocks are unreferenced (free until reused)."""
        keys = request.prefix_keys or ()
        return sum(1 for k in keys[:hit] if self._refs[k] == 0)

    def acquire_prefix(self, request: Request, hit: int) -> None:
        """Reference the first ``hit`` cached blocks: their tokens count as computed."""
        keys = prefix_keys(request, self.block_size)[:hit] if hit else []
        for key in keys:
            refs = self._refs[key]
            if refs == 0:
                del self._lru[key]
                self.num_cached_free -= 1
                self.num_used += 1
            self._refs[key] = refs + 1
        request.cached_keys = list(keys)
        request.num_shared_blocks = hit
        request.num_blocks = hit
        request.num_computed = hit * self.block_size
        if self.num_used > self.peak_used:
            self.peak_used = self.num_used

    def register(self, request: Request) -> None:
        """After a prefill, publish the prompt's full blocks not yet cached (they stay in use)."""
        if not self.prefix_caching:
            return
        keys = prefix_keys(request, self.block_size)
        full = min(len(keys), request.prompt_tokens // self.block_size)
        refs = self._refs
        for j in range(request.num_shared_blocks, full):
            key = keys[j]
            if key not in refs:  # a block computed twice concurrently stays private
                refs[key] = 1
                request.cached_keys.append(key)
                request.num_shared_blocks += 1

    def cached_prefix_blocks(self, request: Request) -> int:
        """Longest cached prefix for routing (prefix_affinity); in-use blocks count too."""
        keys = prefix_keys(request, self.block_size)
        hit = 0
        while hit < len(keys) and keys[hit] in self._refs:
            hit += 1
        return hit
