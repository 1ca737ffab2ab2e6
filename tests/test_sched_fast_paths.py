"""The scheduler's and KV manager's per-step shortcuts (issue 14) equal the general paths they
replace: the free queue after one take equals the one after take / give back / take again, a
finished request freed and forgotten in one pass leaves the queue it left in two, a running
chunk's precomputed block delta takes what ``allocate`` would, and a plan's empty lists are
one shared read-only list."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.kv import Block, KVBlockManager, KVGroups
from sim.core.request import Request
from sim.policies.admission import SGLangAdmission, VLLMAdmission
from sim.policies.base import NONE, EngineLimits, StepPlan
from sim.policies.chunked import ChunkedScheduler


def _state(kv: KVBlockManager):
    """Everything a later allocation, eviction or prefix hit can see: the free queue block by
    block, head first (a run of n blocks as n entries: how runs are split does not matter),
    the counters, the cache and the block tables."""
    queue = []
    for e in kv.free_queue():
        if type(e) is Block:
            queue.append(("cached", e.key))
        else:
            queue.extend([("run", None if e.owner is None else e.owner.request_id)] * e.count)
    tables = {rid: (t.num_blocks, len(t.shared), t.num_own_cached, t.freed is not None)
              for rid, t in kv.tables.items()}
    return (queue, kv.num_free, kv.num_evicted, kv.peak_used, kv.decode_blocks,
            sorted((k, len(v)) for k, v in kv._cached.items()), tables)


def _messy_kv(seed_ops: list[tuple[int, int, int]], block_size: int = 4, groups: KVGroups = KVGroups()) -> KVBlockManager:
    """A prefix-caching KV manager whose free queue mixes plain runs, requests' own cached runs
    and shared cached blocks: requests sharing hash prefixes allocated, cached and freed
    (some forgotten, some kept for a resume)."""
    kv = KVBlockManager(200, block_size, True, groups)
    live = []
    for i, (prompt, prefix, action) in enumerate(seed_ops):
        r = Request(i, 0.0, prompt, 8)
        r.hash_ids, r.hash_block_size = list(range(prefix)) + [1000 + i] * 4, block_size
        hits, own = kv.lookup(r)
        if not kv.allocate(r, prompt, hits, own, computed=(len(hits) + own) * block_size):
            continue
        kv.cache(r, prompt)
        live.append(r)
        if action == 1 and live:  # finish the oldest: freed and forgotten
            done = live.pop(0)
            kv.free(done)
            kv.forget(done)
        elif action == 2 and live:  # preempt the newest: freed, its own blocks kept for a resume
            kv.free(live.pop())
    return kv


_ops = st.lists(st.tuples(st.integers(5, 40), st.integers(0, 6), st.integers(0, 2)), min_size=1, max_size=25)


@settings(max_examples=120, deadline=None)
@given(ops=_ops, a=st.integers(0, 30), b=st.integers(0, 30))
def test_one_take_equals_take_give_back_take(ops, a, b):
    # plan_step takes a decode run's blocks once: the step's a blocks then the run's b (>= a in
    # the scheduler; the other order too here) as take(a), release(a), take(b) did
    kv = _messy_kv(ops)
    if max(a, b) > kv.num_free:
        return
    ref, new = kv, _messy_kv(ops)  # the same operations: an equal manager
    ref.allocate_blocks(a)
    ref.release_blocks(a)
    ref.allocate_blocks(b)
    new.allocate_blocks(a)
    if b > a:
        new.allocate_blocks(b - a)
    elif b < a:
        new.release_blocks(a - b)
    assert _state(new) == _state(ref)
    # and what follows pops the same blocks
    for m in (kv.num_free // 2, kv.num_free - kv.num_free // 2):
        ref.allocate_blocks(m)
        new.allocate_blocks(m)
        assert _state(new) == _state(ref)


@settings(max_examples=120, deadline=None)
@given(ops=_ops, victim=st.integers(0, 100))
def test_free_and_forget_in_one_pass_equals_two(ops, victim):
    kv = _messy_kv(ops)
    if not kv.tables:
        return
    rid = sorted(kv.tables)[victim % len(kv.tables)]
    req = Request(rid, 0.0, 1, 1)
    ref, new = kv, _messy_kv(ops)
    ref.free(req)
    ref.forget(req)
    new.free(req, forget=True)
    assert _state(new) == _state(ref)
    ref.allocate_blocks(ref.num_free)  # evict everything, in order
    new.allocate_blocks(new.num_free)
    assert _state(new) == _state(ref)


@settings(max_examples=200, deadline=None)
@given(ops=_ops, computed=st.integers(0, 40), n=st.integers(1, 40),
       groups=st.sampled_from([KVGroups(), KVGroups(1, 1, 3, 8), KVGroups(1, 2, 2, 5)]))
def test_grow_takes_what_allocate_takes(ops, computed, n, groups):
    # a running prompt's next chunk (sliding windows: the delta may be negative, blocks that
    # left the window going back first)
    def prepared() -> KVBlockManager:
        kv = _messy_kv(ops, groups=groups)
        if computed:  # its first chunk
            kv.allocate(req, computed, computed=0)
        return kv

    req = Request(999, 0.0, computed + n, 8)
    kv = prepared()
    new_blocks = kv.chunk_blocks(req, computed + n, computed)
    if new_blocks > kv.num_free:
        return
    ref, fast = kv, prepared()
    assert ref.allocate(req, computed + n, computed=computed)
    fast.grow(req, new_blocks)
    assert _state(fast) == _state(ref)


def test_a_plans_empty_lists_are_one_shared_read_only_list():
    plan = StepPlan(1, 0, 0, 0)
    assert plan.chunks is NONE and plan.preempted is NONE and plan.chunks == [] and not plan.kv_ready
    with pytest.raises(TypeError):
        plan.preempted.append(None)
    with pytest.raises(TypeError):
        plan.chunks[:0] = [None]
    r = Request(7, 0.0, 1, 1)
    plan.add_preempted(r)
    assert plan.preempted == [r] and NONE == []
    # a scheduler fills its plans' lists without touching the shared one
    s = ChunkedScheduler(EngineLimits(max_num_batched_tokens=64), KVBlockManager(40, 4))
    for i in range(3):
        s.add_request(Request(i, 0.0, 50, 4), 0.0)
    plans = []
    now = 0.0
    while not (p := s.schedule(now)).idle:
        plans.append(p)
        now += 0.01
        s.on_step_done(p, now)
    assert plans and NONE == [] and all(len(p.chunks) == len(p.chunk_contexts) for p in plans)


def test_only_an_admission_with_hooks_is_called():
    assert not VLLMAdmission.has_hooks and SGLangAdmission.has_hooks
    s = ChunkedScheduler(EngineLimits(), KVBlockManager(40, 4))
    assert not s._hooks
    s.admission = SGLangAdmission(exact_lengths=True)
    assert s._hooks and s.admission.name == "sglang"


def test_limits_set_later_are_obeyed():
    # a policy may replace its limits after construction (tests/test_policy_registry.py's toy)
    s = ChunkedScheduler(EngineLimits(max_num_seqs=8), KVBlockManager(400, 4))
    s.limits = EngineLimits(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(4):
        s.add_request(Request(i, 0.0, 10, 3), 0.0)
    plan = s.schedule(0.0)
    assert len(plan.chunks) == 2 and s.limits.max_num_seqs == 2


def test_new_plan_is_the_dataclass_plan_field_by_field():
    """``new_plan(now)`` equals ``StepPlan(1, 0, 0, 0, planned_s=now)``: every field set, the
    list fields the shared read-only ``NONE`` itself."""
    import dataclasses

    from sim.policies.base import new_plan
    a, b = new_plan(2.5), StepPlan(1, 0, 0, 0, planned_s=2.5)
    for f in dataclasses.fields(StepPlan):
        x, y = getattr(a, f.name), getattr(b, f.name)  # (an unset slot raises AttributeError)
        assert x is y if y is NONE else (type(x) is type(y) and x == y), f.name
    assert a == b and new_plan(0.0) == StepPlan(1, 0, 0, 0)


def test_step_plan_init_takes_every_field_in_order_by_position_and_by_name():
    """``StepPlan``'s own ``__init__`` (written out for the compiled core) takes the dataclass's
    fields in their order, each by position and by name, and sets each to what it is given."""
    import dataclasses

    fields = dataclasses.fields(StepPlan)
    # a value of each field's type unlike its default (the compiled core checks the types): the
    # four without a default and swap_blocks are ints
    kinds = {bool: lambda i: True, float: lambda i: 0.5 + i}
    values = [[i] if f.default is NONE else kinds.get(type(f.default), lambda i: 100 + i)(i)
              for i, f in enumerate(fields)]
    assert sum(type(v) is list for v in values) == 8  # the list fields
    for plan in (StepPlan(*values), StepPlan(**{f.name: v for f, v in zip(fields, values)})):
        for f, v in zip(fields, values):  # (compiled, a float field hands back an equal float)
            x = getattr(plan, f.name)
            assert x is v if type(v) is list else (type(x) is type(v) and x == v), f.name
