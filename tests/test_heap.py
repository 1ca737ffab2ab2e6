"""``HeapOrder`` (sim/core/heap.py) is heapq step for step: after every push and pop the list
holds, entry for entry, what heapq's functions leave in theirs, and pops return the same
entries. For its default order (``<``) and the decode set's finish heaps (``_DueOrder``: (step, request
id, epoch, request) entries, compared natively when compiled)."""

import heapq

import numpy as np
import pytest

from sim.core.heap import HeapOrder
from sim.core.request import Request
from sim.policies.decode_set import _DUE


def _same_as_heapq(order: HeapOrder, make_entry, steps: int = 800, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    ours: list = []
    theirs: list = []
    for i in range(steps):
        if ours and rng.random() < 0.45:
            assert order.pop(ours) is heapq.heappop(theirs)
        else:
            entry = make_entry(rng, i)
            order.push(ours, entry)
            heapq.heappush(theirs, entry)
        assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))
    while theirs:
        assert order.pop(ours) is heapq.heappop(theirs)
    assert not ours


def test_default_order_is_heapqs():
    # boxed floats with many ties: the same objects end in the same places
    _same_as_heapq(HeapOrder(), lambda rng, i: float(rng.integers(0, 20)))
    _same_as_heapq(HeapOrder(), lambda rng, i: (int(rng.integers(0, 5)), i))


def test_finish_heap_order_is_heapqs_on_its_tuples():
    reqs = [Request(i, 0.0, 10, 10) for i in range(40)]

    def entry(rng, i):
        r = reqs[int(rng.integers(0, len(reqs)))]
        r.epoch += 1  # one entry per (request, epoch), as the decode set makes them
        return (int(rng.integers(0, 12)), r.request_id, r.epoch, r)

    _same_as_heapq(_DUE, entry)


def test_pop_of_an_empty_heap_raises_as_heapq():
    with pytest.raises(IndexError):
        HeapOrder().pop([])
