"""``HeapOrder``: heapq's push and pop over a plain list, the order a method a subclass gives.

Why: compiled (sim/compiled_core.py), ``heapq`` compares each pair of entries through the
generic rich comparison: a tuple entry costs a generic tuple comparison (each element compared
in turn), and a compiled class's ``__lt__`` is reached through its Python slot. The event
queue's pops and pushes and the decode set's finish heap cost ~10% of a compiled chunked run
that way (bench/README.md, "Compiled core, ninth round"). Here the algorithm is heapq's, step
for step (``heappush``: append, sift up; ``heappop``: the last entry into the root's place,
moved down along the smaller children to a leaf, then up again), so a list holds, entry for
entry, what heapq would leave in it, and heapq's own functions may go on using it; only the
comparison is the subclass's ``before``, a native method call. With the Python sources heapq
itself is faster (its C loop against Python code here): callers use this class when
``COMPILED``.
"""

from __future__ import annotations

from typing import Final


class HeapOrder:
    """A min-heap's order: ``before(a, b)`` is ``a < b`` (heapq's test); ``push`` / ``pop`` are
    ``heapq.heappush`` / ``heapq.heappop`` with it."""

    def before(self, a: object, b: object) -> bool:
        return bool(a < b)  # type: ignore[operator]

    def push(self, heap: list, item: object) -> None:
        """``heapq.heappush(heap, item)``."""
        heap.append(item)
        self._sift_up(heap, len(heap) - 1, item)

    def _sift_up(self, heap: list, pos: int, item: object) -> None:
        """Put ``item`` at ``pos`` or higher: each ancestor it comes before moves down a level
        (heapq's ``_siftdown``)."""
        while pos > 0:
            parent_pos = (pos - 1) >> 1
            parent = heap[parent_pos]
            if not self.before(item, parent):
                break
            heap[pos] = parent
            pos = parent_pos
        heap[pos] = item

    def pop(self, heap: list) -> object:
        """``heapq.heappop(heap)`` (IndexError when empty, as heapq)."""
        last = heap.pop()
        if not heap:
            return last
        top = heap[0]
        end = len(heap)
        pos = 0
        child = 1
        while child < end:  # down to a leaf along the smaller children
            smaller = heap[child]
            right = child + 1
            if right < end:
                other = heap[right]
                if not self.before(smaller, other):
                    child, smaller = right, other
            heap[pos] = smaller
            pos = child
            child = 2 * pos + 1
        self._sift_up(heap, pos, last)  # then ``last`` up from there
        return top


def _probe() -> None:
    """(compiled by mypyc, a function has no ``__code__``)"""


COMPILED: Final = not hasattr(_probe, "__code__")
