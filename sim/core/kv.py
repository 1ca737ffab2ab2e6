"""Paged KV-cache blocks (Kwon et al. 2023, "Efficient Memory Management for LLM Serving with
PagedAttention") with automatic prefix caching, as vLLM V1's KVCacheManager and BlockPool
(vllm/v1/core/kv_cache_manager.py, block_pool.py, single_type_kv_cache_manager.py).

Why: KV capacity, not weights, bounds concurrency; running out forces preemption, and which
cached blocks survive decides prefix hits. V1 semantics kept here:
- every full block of a request, generated tokens included, is cached under the hash chain of
  its tokens, as soon as it is scheduled (``allocate_slots`` caches up to the scheduled tokens);
- a cached block nobody references stays resident in the free queue and counts as free;
  allocation pops the queue's head, evicting what it pops;
- a request's blocks are freed in reverse order (its tail block enters the queue first, so it
  is evicted first and the prefix survives longest);
- a hit never covers the last token: at least one token is computed.
Only what changes timing is kept: blocks without a reusable hash are counted, not named.
NOTE: a request's own blocks past its shared prefix (a unique prompt, its generated tokens) can
only be hit by itself after a preemption; they are kept as one run per request in the free
queue, evicted tail first, as V1's reversed free order does block by block.
Blocks filled while a request decodes in the aggregate decode set are published as of the time
they are looked up: V1's ``allocate_slots`` caches each step's full blocks (``cache_blocks``),
so a lookup at a step sees exactly the generated blocks full by then (a multi-turn turn hitting
an answer still being generated). The decode set publishes them lazily, block by block, when a
lookup needs them (``DecodeSet.publish``; ``before_lookup`` for the router's look-ups), so a
step's work does not grow with the tokens generated; blocks without a hash key (content of that
request only) are counted when the request leaves the set, as only it can hit them.

This manager is the one owner of block counts (as V1's KVCacheManager owns the block tables):
a request's table counts its blocks, except while it decodes in the aggregate decode set
(policies/decode_set.py), whose blocks are counted together in ``decode_blocks`` (a sequence
gains one token per step, so a step costs the same however many tokens were generated);
blocks copied to host memory by a swap, and blocks held for a request that left the schedule
until its KV has been sent elsewhere, are counted here too. Requests carry no block counts.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.core.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks covering ``num_tokens`` slots: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class KVGroups:
    """vLLM V1's KV cache groups (vllm/v1/core/kv_cache_utils.py
    ``_get_kv_cache_groups_uniform_page_size``, HybridKVCacheCoordinator): layers of one
    attention type are split into groups of equal layer count; every group draws block ids
    (a page of its layers' KV for ``block_size`` tokens) from one shared pool. A
    full-attention group holds ceil(T / block_size) blocks at T tokens; a sliding-window group
    frees the blocks that left the window (``SlidingWindowManager.remove_skipped_blocks``),
    so it holds at most ``window_blocks`` = ceil((window - 1) / block_size) + 1.
    A model without sliding-window layers is one full group (the default).
    A prefill chunk computing tokens ``computed`` .. T - 1 holds, in a sliding group, every
    block from the one holding token computed - window + 1 on (vLLM frees only the blocks
    before it, ``remove_skipped_blocks(num_computed_tokens)``, before allocating the chunk's):
    a chunk longer than the window holds more until the request's next step.
    With a prefix-cache hit of ``shared`` blocks the sliding pages of the hit are shared too
    (vLLM's hybrid ``find_longest_cache_hit`` takes the window's cached blocks): a request's own
    sliding pages are those past the hit within the window, min(b - shared, window_blocks).
    NOTE: a sliding group is charged its bound ``window_blocks`` once the window is full (the
    exact count alternates between it and one less); the shared sliding pages of a cached
    prefix are charged to nobody (at most ``sliding x window_blocks`` per prefix in use).
    """

    full: int = 1          # full-attention groups
    sliding: int = 0       # sliding-window groups
    window_blocks: int = 0  # most blocks a sliding group holds
    window: int = 0         # the window, tokens

    @property
    def plain(self) -> bool:
        return self.sliding == 0 and self.full == 1

    @property
    def caches_prefixes(self) -> bool:
        """Prefix caching is modelled: no sliding-window group, or exactly one full-attention
        group whose pages stand for a cached prefix (``KVBlockManager.prefix_caching``)."""
        return self.sliding == 0 or self.full == 1

    def blocks(self, num_tokens: int, block_size: int, computed: int | None = None, shared: int = 0) -> int:
        """Block ids one request holds at ``num_tokens`` tokens of KV, ``shared`` of its first
        blocks a prefix-cache hit; with ``computed``, while a chunk computes the tokens from
        ``computed`` on."""
        b = -(-num_tokens // block_size)
        held = min(b - shared, self.window_blocks)
        if computed is not None and self.sliding:
            skipped = max(0, computed - self.window + 1) // block_size
            held = max(held, b - max(skipped, shared))
        return self.full * b + self.sliding * held


def prefix_keys(req: Request, block_size: int) -> list:
    """Cache keys of the full blocks that ``req.hash_ids`` describe: the hash chain up to each
    block's last token (vLLM ``hash_block_tokens``).

    ``req.hash_ids`` holds one id per ``hash_block_size`` tokens (Mooncake: 512); a block's key
    is (chain of ids up to the one holding its last token, offset inside that id). The ids cover
    the prompt, or the prompt and the answer when there are more ids than the prompt needs (the
    multi-turn generator gives a turn the ids of its answer, which the next turn's prompt repeats).
    Blocks past the described tokens are the request's own (unique content).
    """
    if req.prefix_keys is None:
        keys: list[tuple[int, int]] = []
        if req.hash_ids is not None and len(req.hash_ids):
            h = req.hash_block_size
            chain, c = [], 0
            for hid in req.hash_ids:
                c = hash((c, int(hid)))
                chain.append(c)
            described = req.prompt_tokens
            if len(chain) > blocks_for(req.prompt_tokens, h):
                described = req.prompt_tokens + req.output_tokens
            full = min(len(chain) * h, described) // block_size
            for j in range(full):
                last = (j + 1) * block_size - 1
                keys.append((chain[last // h], last % h))
        req.prefix_keys = keys
    return req.prefix_keys


class Block:
    """A cached block with a reusable hash (a shared prefix): referenced by ``ref`` requests."""

    __slots__ = ("key", "ref")
    count = 1

    def __init__(self, key) -> None:
        self.key = key
        self.ref = 1


class Run:
    """``count`` blocks in the free queue: plain ones (``owner`` None, nothing to hit), or a
    freed request's own cached blocks, which only that request can hit, lowest first."""

    __slots__ = ("count", "owner")

    def __init__(self, count: int, owner: "Table | None" = None) -> None:
        self.count = count
        self.owner = owner


class CPUTier:
    """vLLM's CPU offloading tier (``--kv-offloading-size``; vLLM 0.11's OffloadingConnector:
    vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py with
    vllm/v1/kv_offload/lru_manager.py ``LRUOffloadingManager`` over ``CPUBackend``):
    ``capacity_blocks`` GPU-block-sized pages in host memory, least recently used first.
    - store (``OffloadingConnectorScheduler._get_reqs_to_store``): every full block of a request
      is copied GPU -> CPU once computed (write-through, not on eviction); blocks already there
      are skipped; ``prepare_store`` evicts the LRU head to make room and stores nothing when
      the new blocks exceed the whole tier (``prepare_store`` returns None: "Cannot store");
    - lookup (``get_num_new_matched_tokens``): every block of the request is touched (moved to
      the LRU's tail in reverse, so its first block is the most recent, ``LRUOffloadingManager
      .touch``), then the blocks after the GPU prefix hit that are in the tier are counted;
    - load (``CpuGpuOffloadingHandler.transfer_async``): CPU -> GPU on the handler's one
      host-to-device CUDA stream, so loads run one after another (``h2d_free_s``); stores run on
      its device-to-host stream, the other direction of the link: they neither delay loads nor
      the step (asynchronous, overlapping compute), and are counted, not timed against anything.
    Blocks are GPU blocks (vLLM's default offloaded block size is the GPU's,
    ``OffloadingSpec.offloaded_block_size``). Blocks without a reusable hash (a request's own
    prompt tail, its generated tokens) take room too, as runs (``Run``, owner None), evicted
    like the rest; only the request itself could hit them, after a preemption, which vLLM
    supports from 0.14 on (vllm-project/vllm#29870, per the vLLM blog of 2026-01-08): NOTE not
    modelled, such a request recomputes them (and writes them again, where vLLM would find them
    by hash: its store traffic is over-counted by them).
    """

    def __init__(self, capacity_blocks: int, load_s_per_block: float, latency_s: float) -> None:
        self.capacity_blocks = capacity_blocks
        self.load_s_per_block = load_s_per_block  # block bytes per GPU / host link bandwidth
        self.latency_s = latency_s                # per transfer
        self.lru: OrderedDict[object, None] = OrderedDict()  # keys and plain runs, LRU first
        self.num_used = 0
        self.h2d_free_s = 0.0   # when the host-to-device stream finishes its queued loads
        self.ends: deque[float] = deque()  # the ends of the loads queued, in order (one stream: ascending)
        self.query_tokens = 0   # prompt tokens of first admissions
        self.hit_tokens = 0     # of which loaded from the tier
        self.loads = 0          # load transfers (one per request that hit the tier)
        self.load_blocks = 0
        self.load_s = 0.0       # seconds the host-to-device stream spent loading
        self.store_blocks = 0
        self.evicted_blocks = 0

    def _make_room(self, n: int) -> bool:
        """Evict LRU entries until ``n`` more blocks fit; False (nothing evicted) if they never can."""
        if n > self.capacity_blocks:
            return False
        lru = self.lru
        while self.num_used + n > self.capacity_blocks:
            for entry in lru:
                break
            if isinstance(entry, Run):
                k = min(entry.count, self.num_used + n - self.capacity_blocks)
                entry.count -= k
                self.num_used -= k
                self.evicted_blocks += k
                if not entry.count:
                    del lru[entry]
            else:
                del lru[entry]
                self.num_used -= 1
                self.evicted_blocks += 1
        return True

    def store(self, keys: Sequence[object], plain: int) -> None:
        """Blocks just computed: hash-keyed ones (those already here are touched) and ``plain``
        ones without a reusable hash, in the request's order."""
        lru = self.lru
        new = [k for k in keys if k not in lru]
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
        n = len(new) + plain
        if not n or not self._make_room(n):
            return
        for k in new:
            lru[k] = None
        if plain:
            lru[Run(plain)] = None
        self.num_used += n
        self.store_blocks += n

    def touch(self, keys: Sequence[object]) -> None:
        """``LRUOffloadingManager.touch``: the request's blocks here become the most recent,
        its first block last."""
        lru = self.lru
        for k in reversed(keys):
            if k in lru:
                lru.move_to_end(k)

    def hits(self, keys: Sequence[object], start: int) -> int:
        """Blocks from ``keys[start]`` on found here in a row (``LRUOffloadingManager.lookup``)."""
        lru = self.lru
        n = 0
        for k in keys[start:]:
            if k not in lru:
                break
            n += 1
        return n

    def next_end_s(self, now: float) -> float:
        """The first end of a queued load after ``now`` (inf: none)."""
        ends = self.ends
        while ends and ends[0] <= now:
            ends.popleft()
        return ends[0] if ends else math.inf

    def count_query(self, prompt_tokens: int, hit_tokens: int) -> None:
        """A request's first admission: its prompt tokens, of which ``hit_tokens`` were loaded
        from here (vLLM's connector prefix-cache stats: queries and hits in tokens)."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += hit_tokens

    def load(self, num_blocks: int, now: float) -> float:
        """Queue a load of ``num_blocks`` on the host-to-device stream at ``now``; when it ends."""
        start = self.h2d_free_s if self.h2d_free_s > now else now
        s = num_blocks * self.load_s_per_block + self.latency_s
        self.h2d_free_s = start + s
        self.ends.append(start + s)
        self.loads += 1
        self.load_blocks += num_blocks
        self.load_s += s
        return start + s


class Table:
    """One request's block table: the shared-prefix blocks it references, then
    ``num_own_cached`` cached blocks of its own, then uncached ones (``num_blocks`` in all; 0
    while the request is in the decode set, whose blocks ``decode_blocks`` counts). ``freed``
    is its run of own cached blocks left in the free queue after a free. ``hit_blocks``: the
    prefix-cache blocks its current allocation here started with (per manager: a disaggregated
    request's prefill and decode replicas each have their own)."""

    __slots__ = ("request_id", "num_blocks", "held", "shared", "num_own_cached", "freed", "hit_blocks",
                 "load_end_s", "load_blocks", "offloaded")

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.num_blocks = 0
        self.held = False  # the request left the schedule; its blocks stay until ``free``
        self.shared: list[Block] = []
        self.num_own_cached = 0
        self.freed: Run | None = None
        self.hit_blocks = 0
        # a load from the CPU tier (``CPUTier``) of blocks it holds: when it ends (-1.0 none), and
        # how many it loads
        self.load_end_s = -1.0
        self.load_blocks = 0
        self.offloaded = 0  # blocks written to the CPU tier, without the GPU prefix cache


class KVBlockManager:
    """The blocks of one replica (all its tensor-parallel GPUs together) and their owners."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 groups: KVGroups = KVGroups(), uncached_to_head: bool = False):
        self.num_blocks = num_blocks
        # a freed request's blocks without a hash go to the free queue's head, reused first
        # (vLLM 0.34 block_pool.py free_blocks: "LIFO reuse of non-cached blocks"); vLLM 0.11
        # appends every freed block to the tail
        self.uncached_to_head = uncached_to_head
        self.block_size = block_size
        self.groups = groups
        self._plain = groups.plain  # one full-attention group: blocks_for is ceil(tokens / block_size)
        # With sliding-window groups a cached block is the full-attention group's page of that
        # prefix (one full group); the hit's sliding pages are shared uncharged (``KVGroups``).
        # NOTE: with no full-attention group (every layer sliding) or several, prefix caching
        # is not modelled: no hits (the run's warnings say so for the first).
        self.prefix_caching = enable_prefix_caching and groups.caches_prefixes
        self.num_free = num_blocks   # blocks an allocation can get: never used, or cached but unreferenced
        self.peak_used = 0
        # The free queue, head first: ``_front`` plain blocks (nothing to hit: which ones does not
        # matter), then ``_queue``'s entries (plain runs, freed requests' own cached runs,
        # cached blocks) in order. The blocks given back to the head (``release_blocks``) and
        # a plain run reaching the head join the front, so most takes only count it down (the
        # head of an OrderedDict is a generic iteration, compiled: sim/compiled_core.py).
        # ``_tail``: the last entry when it is a plain run that blocks freed next can join.
        self._front = num_blocks
        self._queue: OrderedDict[Run | Block, None] = OrderedDict()
        self._tail: Run | None = None
        self._cached: dict = {}      # key -> blocks holding it (V1 keeps duplicates), first used
        self.tables: dict[int, Table] = {}  # request id -> block table
        self.decode_blocks = 0       # blocks of the requests in the aggregate decode set
        self._host_blocks: dict[int, int] = {}  # request id -> blocks swapped out to host memory
        self.num_held = 0            # blocks of held requests (``hold``), and their peak
        self.peak_held = 0
        self.num_evicted = 0
        self.query_tokens = 0        # prompt tokens looked up in the prefix cache (first admission)
        self.hit_tokens = 0          # of which found cached
        # publishes the decode set's generated blocks full by now before a look-up from outside a
        # step (the router's ``cached_prefix_blocks``): ``DecodeSet.publish_between_steps``
        self.before_lookup: Callable[[], None] | None = None
        # the CPU offloading tier (engine.kv_offloading_size), None: off
        self.offload: CPUTier | None = None

    def blocks_for(self, num_tokens: int, computed: int | None = None, shared: int = 0) -> int:
        """Block ids a request holds at ``num_tokens`` tokens of KV (every group's); with
        ``computed``, while a chunk computes the tokens from ``computed`` on (``KVGroups.blocks``)."""
        if self._plain:
            return -(-num_tokens // self.block_size)
        return self.groups.blocks(num_tokens, self.block_size, computed, shared)

    def blocks_of(self, req: Request, num_tokens: int, computed: int | None = None) -> int:
        """``blocks_for`` of ``req``, whose allocation here began with ``hit_blocks(req)`` hits."""
        if self._plain:  # blocks_for
            return -(-num_tokens // self.block_size)
        return self.groups.blocks(num_tokens, self.block_size, computed, self.hit_blocks(req))

    def hit_blocks(self, req: Request) -> int:
        """The prefix-cache blocks ``req``'s current allocation here started with."""
        t = self.tables.get(req.key)
        return t.hit_blocks if t is not None else 0

    def chunk_blocks(self, req: Request, num_tokens: int, computed: int) -> int:
        """Blocks ``req`` gains for a prefill chunk computing its tokens from ``computed`` up to
        ``num_tokens`` (negative: blocks that left its sliding windows go back):
        ``blocks_of(req, num_tokens, computed) - blocks_held(req)`` in one call (it runs for
        every chunk of every step); ``grow`` takes them."""
        t = self.tables.get(req.key)
        if self._plain:
            new = -(-num_tokens // self.block_size)
        else:
            new = self.groups.blocks(num_tokens, self.block_size, computed, t.hit_blocks if t is not None else 0)
        if t is not None:
            new -= t.num_blocks
        return new

    def grow(self, req: Request, new: int) -> None:
        """``allocate(req, num_tokens, computed=computed)`` for a running prompt's chunk (no
        cache hits to take) whose ``chunk_blocks`` delta ``new`` the caller has computed and
        checked to be free: a negative one gives back the blocks that left a sliding window."""
        t = self.tables.get(req.key)
        if new < 0:
            self.trim(req, t.num_blocks + new)
            return
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        if new:
            t.num_blocks += new
            self._take(new)

    def blocks_held(self, req: Request) -> int:
        """Blocks ``req`` holds here (0 while it is in the decode set: see ``decode_blocks``)."""
        t = self.tables.get(req.key)
        return t.num_blocks if t is not None else 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks with a reusable hash in the cache (referenced or evictable)."""
        return sum(len(v) for v in self._cached.values())

    def table(self, req: Request) -> Table:
        t = self.tables.get(req.key)
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        return t

    # -- free queue -----------------------------------------------------------------------------
    def _take(self, n: int) -> None:
        """Pop ``n`` blocks from the head of the free queue, evicting cached ones popped."""
        if n > self.num_free:
            raise AssertionError(f"KV over-allocation: {n} > {self.num_free} free")
        if not n:  # nothing popped; peak_used already counts every block in use (each take updated it)
            return
        self.num_free -= n
        front = self._front
        if front >= n:  # the common case: the plain blocks at the head cover them
            self._front = front - n
        else:
            n -= front
            self._front = 0
            q = self._queue
            while n:
                # the head (``next(iter(q))`` as a loop: compiled, sim/compiled_core.py, the
                # iterator's C calls, where ``next`` is a generic call of the builtin; the queue is
                # not empty: n <= num_free blocks are in it). (isinstance, not type() is: the same
                # test, as neither class has subclasses; it types ``entry`` for mypy, and compiled
                # its fields are read natively)
                for entry in q:
                    break
                if isinstance(entry, Block):
                    del q[entry]
                    same = self._cached[entry.key]
                    same.remove(entry)
                    if not same:
                        del self._cached[entry.key]
                    self.num_evicted += 1
                    n -= 1
                    continue
                owner = entry.owner
                if owner is None:  # plain blocks: the run joins the front, which gives the rest
                    del q[entry]
                    if entry is self._tail:
                        self._tail = None
                    if entry.count > n:
                        self._front = entry.count - n
                        n = 0
                    else:
                        n -= entry.count
                    continue
                k = min(n, entry.count)  # a freed request's own cached blocks: evicted
                entry.count -= k
                n -= k
                self.num_evicted += k
                if not entry.count:
                    del q[entry]
                    owner.freed = None
                    if not owner.shared and not owner.num_own_cached and not owner.num_blocks:
                        self.tables.pop(owner.request_id, None)  # nothing left to remember
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used

    def _append_plain(self, n: int) -> None:
        """``n`` plain blocks join the free queue's tail."""
        tail = self._tail
        if tail is not None:  # the last entry is a plain run: they join it
            tail.count += n
        elif not self._queue:  # the front is the whole queue
            self._front += n
        else:
            tail = self._tail = Run(n)
            self._queue[tail] = None

    def _append(self, entry: Run | Block) -> None:
        """A freed request's own cached run, or a cached block, joins the free queue's tail."""
        self._queue[entry] = None
        self._tail = None

    def free_queue(self) -> list[Run | Block]:
        """The free queue's entries, head first (the front's plain blocks as one run; for
        inspection and tests, not the hot path)."""
        entries: list[Run | Block] = [Run(self._front)] if self._front else []
        entries.extend(self._queue)
        return entries

    def allocate_blocks(self, n: int) -> None:
        """Take ``n`` blocks for the aggregate decode set (the caller checked they are free)."""
        if n:
            self._take(n)
            self.decode_blocks += n

    def release_blocks(self, n: int) -> None:
        """Give back blocks taken but not used (a decode run cut short) to the queue's head.
        NOTE: V1 would not have popped them; the cached blocks they evicted stay evicted."""
        if n:
            self.decode_blocks -= n
            self.num_free += n
            self._front += n

    # -- the decode set's blocks, host copies, held blocks -----------------------------------------
    def to_decode(self, req: Request) -> None:
        """``req`` joins the aggregate decode set: its blocks are counted with the set's."""
        t = self.tables.get(req.key)
        if t is not None:
            self.decode_blocks += t.num_blocks
            t.num_blocks = 0

    def from_decode(self, req: Request, num_tokens: int) -> None:
        """``req`` leaves the decode set with ``num_tokens`` tokens of KV: its blocks (every
        group's, ``KVGroups.blocks``) are its own again."""
        t = self.tables.get(req.key)  # self.table(req), inline
        if self._plain:  # blocks_of
            n = -(-num_tokens // self.block_size)
        else:
            n = self.groups.blocks(num_tokens, self.block_size, None, t.hit_blocks if t is not None else 0)
        self.decode_blocks -= n
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        t.num_blocks = n

    def swap_out(self, req: Request) -> int:
        """Copy ``req``'s blocks to host memory (the caller then frees them here); their count."""
        n = self.blocks_held(req)
        self._host_blocks[req.request_id] = n
        return n

    def swap_in(self, req: Request) -> int:
        """Blocks of ``req`` to copy back from host memory (0: none there); the caller allocates them."""
        return self._host_blocks.pop(req.request_id, 0)

    def hold(self, req: Request) -> None:
        """``req`` is done here but its blocks stay until ``free``: a prefill replica keeps a
        request's KV until the decode side has it (vLLM's KV connector delays freeing the blocks
        of a request whose KV is being sent: ``request_finished`` -> ``delay_free_blocks``)."""
        t = self.table(req)
        t.held = True
        self.num_held += t.num_blocks
        if self.num_held > self.peak_held:
            self.peak_held = self.num_held

    # -- requests -------------------------------------------------------------------------------
    def lookup(self, req: Request) -> tuple[list[Block], int]:
        """Cached blocks at the start of the request's tokens (prompt and any generated before a
        preemption), at least one token left to compute (vLLM ``get_computed_blocks``):
        the shared blocks found, and how many of its own freed blocks follow them."""
        if not self.prefix_caching:
            return [], 0
        bs = self.block_size
        keys: list[tuple[int, int]] | None = req.prefix_keys  # prefix_keys(req, bs) once memoised
        if keys is None:
            keys = prefix_keys(req, bs)
        if not keys and req.request_id not in self.tables:  # nothing it could hit (the loop below finds none)
            return [], 0
        cap = (req.prompt_tokens + req.num_generated - 1) // bs
        hits: list[Block] = []
        cached = self._cached
        for key in keys[:cap]:
            same = cached.get(key)
            if not same:
                return hits, 0
            hits.append(same[0])
        t = self.tables.get(req.key)
        own = 0
        if t is not None and t.freed is not None and len(hits) == len(keys):
            own = min(t.freed.count, cap - len(hits))
        return hits, own

    def allocate(self, req: Request, num_tokens: int, hits: Sequence[Block] = (), own_hits: int = 0,
                 computed: int | None = None) -> bool:
        """Grow ``req``'s blocks to cover ``num_tokens`` slots, first taking the cache hits
        ``hits`` / ``own_hits`` from ``lookup`` (vLLM ``allocate_slots``); False, with no change,
        if the free blocks do not suffice (hits nobody references count as taken from them).
        Sliding-window blocks that left the window are freed first either way, as vLLM's
        ``remove_skipped_blocks`` runs before it counts the blocks to allocate.
        ``computed``: the first token the step computes (a prefill chunk's start; sliding-window
        groups, ``KVGroups.blocks``); None for KV that exists whole (a decode's)."""
        num_hit = len(hits) + own_hits
        t = self.tables.get(req.key)
        shared = num_hit if num_hit else (t.hit_blocks if t is not None else 0)
        held = t.num_blocks if t is not None else 0
        if self._plain:  # blocks_for
            new = -(-num_tokens // self.block_size) - held - num_hit
        else:
            new = self.groups.blocks(num_tokens, self.block_size, computed, shared) - held - num_hit
        if new < 0:  # a sliding window moved past blocks of an earlier chunk: freed first
            self.trim(req, held + new)
            new = 0
        evictable = own_hits + sum(1 for b in hits if b.ref == 0) if hits else own_hits
        if new + evictable > self.num_free:
            return False
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        if num_hit:
            t.hit_blocks = num_hit
            q = self._queue
            for b in hits:
                if b.ref == 0:
                    del q[b]
                    self.num_free -= 1
                b.ref += 1
            t.shared.extend(hits)
            if own_hits:
                run = t.freed
                run.count -= own_hits
                self.num_free -= own_hits
                if not run.count:
                    del q[run]
                run.owner = None  # the rest (the tail) is recomputed: nothing left to hit there
                t.freed = None
                t.num_own_cached = own_hits
            t.num_blocks += num_hit
        if new > 0:
            t.num_blocks += new
            self._take(new)
        elif num_hit:
            used = self.num_blocks - self.num_free
            if used > self.peak_used:
                self.peak_used = used
        return True

    def trim(self, req: Request, num_blocks: int) -> None:
        """Give back ``req``'s blocks beyond ``num_blocks``: sliding-window blocks a long chunk
        held that left the window (uncached ones, to the queue's tail)."""
        t = self.tables.get(req.key)
        k = t.num_blocks - num_blocks if t is not None else 0
        if k > 0:
            t.num_blocks = num_blocks
            self.num_free += k
            self._append_plain(k)

    def cache(self, req: Request, num_tokens: int) -> None:
        """Publish the request's full blocks among its first ``num_tokens`` tokens (and write
        them to the CPU tier, ``CPUTier.store``)."""
        if not self.prefix_caching:
            if self.offload is not None:
                self._offload_uncached(req, num_tokens)
            return
        t = self.tables.get(req.key)  # self.table(req), inline: this runs for every chunk
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        full = num_tokens // self.block_size
        done = len(t.shared) + t.num_own_cached
        if full <= done:
            return
        keys: list[tuple[int, int]] | None = req.prefix_keys  # prefix_keys(req, ...) once memoised
        if keys is None:
            keys = prefix_keys(req, self.block_size)
        tier = self.offload
        stored = done
        if done < len(keys) and not t.num_own_cached:
            cached = self._cached
            for key in keys[done:min(full, len(keys))]:
                b = Block(key)
                t.shared.append(b)
                same = cached.get(key)
                if same is None:
                    cached[key] = [b]
                else:
                    same.append(b)
            done = len(t.shared)
        if full > done:
            t.num_own_cached += full - done
        if tier is not None:  # written through to the CPU tier as computed (``CPUTier.store``)
            tier.store(keys[stored:done], full - done)

    def fits_whole(self, req: Request, num_tokens: int, hits: Sequence[Block] = (), own_hits: int = 0) -> bool:
        """Whether the blocks of ``req``'s whole sequence of ``num_tokens`` are free, counting its
        cache hits (those nobody references are taken from the free ones): vLLM 0.34's
        admission gate (kv_cache_manager.py ``allocate_slots(full_sequence_must_fit=True)``:
        ``get_num_blocks_to_allocate`` of the full sequence <= free blocks)."""
        num_hit = len(hits) + own_hits
        t = self.tables.get(req.key)
        held = t.num_blocks if t is not None else 0
        new = self.blocks_for(num_tokens, None, num_hit) - held - num_hit
        evictable = own_hits + sum(1 for b in hits if b.ref == 0) if hits else own_hits
        return max(new, 0) + evictable <= self.num_free

    def unpublished_key(self, req: Request) -> int:
        """Index of ``req``'s next block to publish when that block has a hash key (content
        others can share: a multi-turn answer the next turn repeats), else -1."""
        if not self.prefix_caching:
            return -1
        keys = req.prefix_keys
        if not keys:
            return -1
        t = self.tables.get(req.key)
        if t is None or t.num_own_cached:  # past its keys already
            return -1
        done = len(t.shared)
        return done if done < len(keys) else -1

    def free(self, req: Request, forget: bool = False) -> None:
        """Release a request's blocks, tail first; cached ones stay resident, evictable.
        ``forget``: then ``forget(req)`` (done here for good), in one pass."""
        # ``tables.pop(req.key, None)`` as a look-up and a ``del`` (compiled, sim/compiled_core.py,
        # both native; ``pop`` with a default is a generic method call)
        t = self.tables.get(req.key)
        if t is None:
            return
        del self.tables[req.key]
        t.hit_blocks = 0  # (a table kept below for its cached run starts its next allocation afresh)
        t.load_end_s = -1.0
        t.load_blocks = t.offloaded = 0
        uncached = plain = t.num_blocks - len(t.shared) - t.num_own_cached
        if t.held:
            self.num_held -= t.num_blocks
            t.held = False
        t.num_blocks = 0
        if forget:
            # its own cached blocks could be hit by itself only: forgotten, they are plain ones,
            # following its uncached ones in the queue as the run ``forget`` leaves ownerless
            plain += t.num_own_cached
            t.num_own_cached = 0
        freed = plain
        if self.uncached_to_head:
            # the uncached ones to the head; forgotten own cached blocks (hashed in vLLM, hit by
            # nobody) to the tail, as cached blocks go
            self._front += uncached
            if plain > uncached:
                self._append_plain(plain - uncached)
        elif plain:
            self._append_plain(plain)
        if t.freed is not None:  # an older run of its own blocks, never hit again
            t.freed.owner = None
            t.freed = None
        if t.num_own_cached:
            run = Run(t.num_own_cached, t)
            t.freed = run
            self._append(run)
            freed += t.num_own_cached
            t.num_own_cached = 0
            self.tables[req.key] = t  # kept for the run: a resumed request may hit it
        for b in reversed(t.shared):
            b.ref -= 1
            if b.ref == 0:
                self._append(b)
                freed += 1
        t.shared = []
        self.num_free += freed

    def forget(self, req: Request) -> None:
        """The request is done here for good: its own freed blocks can never be hit."""
        t = self.tables.pop(req.key, None)
        if t is not None and t.freed is not None:
            t.freed.owner = None

    # -- the CPU offloading tier (``CPUTier``) --------------------------------------------------------
    def _offload_uncached(self, req: Request, num_tokens: int) -> None:
        """``cache`` with the GPU prefix cache off: the request's full blocks among its first
        ``num_tokens`` are written to the CPU tier all the same (vLLM hashes a request's blocks
        when a KV connector is set, prefix caching or not: vllm/v1/engine/core.py
        ``EngineCore.__init__``, ``request_block_hasher``)."""
        t = self.tables.get(req.key)
        if t is None:
            t = self.tables[req.key] = Table(req.request_id)
        full = num_tokens // self.block_size
        done = t.offloaded
        if full <= done:
            return
        keys = prefix_keys(req, self.block_size)
        end = min(full, len(keys))
        tier = self.offload
        if tier is not None:
            tier.store(keys[done:end] if done < end else [], full - max(done, end))
        t.offloaded = full

    def offload_hits(self, req: Request, num_hits: int) -> int:
        """Blocks after ``num_hits`` GPU prefix-cache hits that the CPU tier holds, at least one
        token left to compute (``OffloadingConnectorScheduler.get_num_new_matched_tokens``,
        which first touches every block of the request)."""
        tier = self.offload
        if tier is None:
            return 0
        keys = prefix_keys(req, self.block_size)
        if not keys:
            return 0
        tier.touch(keys)
        # NOTE: the hit stops a block short of the last token (as ``lookup``); vLLM loads every
        # full block and recomputes only the last token (``_update_waiting_for_remote_kv``)
        cap = (req.prompt_tokens + req.num_generated - 1) // self.block_size
        return tier.hits(keys[:cap] if cap < len(keys) else keys, num_hits)

    def start_load(self, req: Request, hits: Sequence[Block], num_loaded: int, now: float) -> bool:
        """Allocate ``req``'s GPU prefix hits and ``num_loaded`` blocks for the CPU tier's copies
        and queue their load (vLLM's scheduler: ``allocate_slots`` for the local and external
        computed tokens, then the request waits in WAITING_FOR_REMOTE_KVS until the connector
        reports the load finished: vllm/v1/core/sched/scheduler.py ``schedule``,
        ``_update_waiting_for_remote_kv``); False, with no change, if the blocks are not free.
        The loaded blocks are published as cached once the request is scheduled after the load
        (vLLM: ``delay_cache_blocks``, cached in ``_update_waiting_for_remote_kv``)."""
        tier = self.offload
        bs = self.block_size
        if tier is None or not self.allocate(req, (len(hits) + num_loaded) * bs, hits, 0, computed=len(hits) * bs):
            return False
        t = self.tables[req.key]
        t.load_end_s = tier.load(num_loaded, now)
        t.load_blocks = num_loaded
        return True

    def load_end_s(self, req: Request) -> float:
        """When the CPU-tier load of ``req``'s blocks ends (-1.0: none in flight or pending)."""
        t = self.tables.get(req.key)
        return t.load_end_s if t is not None else -1.0

    def end_load(self, req: Request) -> int:
        """``req`` was scheduled (it looks up afresh after a preemption): the blocks it loaded
        from the CPU tier for it (0: none)."""
        t = self.tables.get(req.key)
        if t is None or t.load_end_s < 0.0:
            return 0
        t.load_end_s = -1.0
        n = t.load_blocks
        t.load_blocks = 0
        return n

    def cached_prefix_blocks(self, req: Request) -> int:
        """Longest cached prefix for routing (prefix_affinity); in-use blocks count too."""
        if self.before_lookup is not None:
            self.before_lookup()
        keys = prefix_keys(req, self.block_size)
        hit = 0
        while hit < len(keys) and keys[hit] in self._cached:
            hit += 1
        return hit
