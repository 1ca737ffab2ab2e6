"""The arrival process: each request of a workload enters the cluster at its arrival time.

Why: ``simulate`` (sim/engine/cluster.py) replays a workload (or consecutive sorted chunks of
one, read only as far as simulated time has reached) by submitting each request to the
topology at its time; with ``max_concurrency`` (vLLM bench ``--max-concurrency``) a request
also waits for a free client and is sent (its arrival time) when one frees up.

It runs as callbacks of events in SimPy's queue (sim/engine/calls.py ``Call``), not as a
generator process (a generator resume and a new ``Timeout`` per arrival), and schedules the
very events that process did, at the same times and priorities and in the same order: its start as
``Initialize`` (URGENT, at 0), a wait for the next arrival time as ``Timeout`` (NORMAL, after
the gap), a wait for a free client as an event that ``release`` succeeds (NORMAL, now). The one
event it leaves out is the process's end (scheduled when the last request was sent, with no
callbacks: nothing waits on it); it only counted towards the stall watchdog's events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import simpy
from simpy.events import URGENT

from sim.core.request import Request
from sim.engine.calls import Call
from sim.workload.arrays import RequestArrays

ARRIVAL_SLICE = 1 << 16  # arrivals turned into Python numbers at a time (not a whole chunk)

# a wait for a free client (max_concurrency): none, waiting, woken (the wake-up is queued)
_NO_WAIT, _WAITING, _WOKEN = 0, 1, 2


# a slice: (arrival seconds, prompt tokens, output tokens, hash ids or None, offset, hash block
# size, max_tokens or None: none sent); typed: compiled (sim/compiled_core.py), its lists' items
# are read natively, not by a generic subscript of an object
_Slice = tuple[list[float], list[int], list[int], Any, int, int, Any]


def _slices(chunks: Iterable[RequestArrays]) -> Iterator[_Slice]:
    """Consecutive slices of the workload as Python lists: (arrival seconds, prompt tokens,
    output tokens, the chunk's hash ids or None, the slice's offset in its chunk, hash block size,
    max_tokens or None).
    A stream is read only when the previous chunk's last request has been sent."""
    for chunk in chunks:
        for lo in range(0, len(chunk), ARRIVAL_SLICE):
            yield (chunk.arrival_s[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.input_tokens[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.output_tokens[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.hash_ids, lo, chunk.hash_block_size,
                   None if chunk.max_tokens is None else chunk.max_tokens[lo:lo + ARRIVAL_SLICE].tolist())


class Arrivals:
    """Sends the workload's requests to ``submit`` at their times, numbered from 0 in order;
    each one sent is appended to ``requests`` (unless None). ``sent`` counts them. With
    ``max_concurrency``, ``release(n)`` returns n clients (their requests ended)."""

    def __init__(self, env: simpy.Environment, chunks: Iterable[RequestArrays], submit: Callable[[Request], None],
                 requests: list[Request] | None, max_concurrency: int | None = None):
        self.env = env
        self._submit = submit
        self.requests = requests
        self.sent = 0
        self.free = max_concurrency if max_concurrency is not None else -1  # -1: open loop
        self._gated = max_concurrency is not None
        self._wait = _NO_WAIT
        self._slices = _slices(chunks)
        # the slice being sent (``_slices``) and the index in it of the next request
        self._slice: _Slice = ([], [], [], None, 0, 16, None)
        self._j = 0
        self._timer = Call(env, self._time_reached)  # the wait for the next arrival time (one at a time)
        Call(env, self._start).at(0.0, URGENT)  # as a process starts (Initialize)

    def release(self, n: int) -> None:
        """``n`` clients are free again: a request waiting for one is woken."""
        self.free += n
        if self._wait == _WAITING:
            self._wait = _WOKEN
            Call(self.env, self._woken, self._timer).at(0.0)  # the wait's event succeeding now

    def _start(self, event: Call) -> None:
        self._send(False, event._t)

    def _time_reached(self, event: Call) -> None:
        self._send(True, event._t)

    def _woken(self, event: Call) -> None:
        self._wait = _NO_WAIT
        self._send(True, event._t)

    def _send(self, reached: bool, now: float) -> None:
        """Send requests from the next one on until one must wait (for its arrival time or,
        with ``max_concurrency``, a free client) or the workload ends. ``reached``: the next
        one's arrival time has come (the wait for it just ended: its time is not compared
        with the clock again, as the process went on after its timeout). ``now``: the clock
        (the event's time; compiled, sim/compiled_core.py, read natively from the event, where
        the environment's ``_now`` is a generic look-up)."""
        submit, requests = self._submit, self.requests
        arrival, inp, out, hash_ids, lo, block_size, max_tokens = self._slice
        j = self._j
        t: float  # (typed: compiled, sim/compiled_core.py, the clock's comparisons are native)
        while True:
            if j == len(arrival):
                nxt = next(self._slices, None)
                if nxt is None:
                    return  # every request sent (the process's end)
                self._slice = nxt
                arrival, inp, out, hash_ids, lo, block_size, max_tokens = nxt
                j = 0
            t = arrival[j]
            if not reached:
                if t > now:
                    self._j = j
                    self._timer.at_from(now, t - now)
                    return
            reached = False
            if self._gated:
                if self.free <= 0:
                    self._j = j
                    self._wait = _WAITING
                    return
                self.free -= 1
                t = now  # sent now
            req = Request(self.sent, t, inp[j], out[j], 0 if max_tokens is None else max_tokens[j])
            if hash_ids is not None:
                req.hash_ids = hash_ids[lo + j]
                req.hash_block_size = block_size
            if requests is not None:
                requests.append(req)
            self.sent += 1
            submit(req)
            j += 1
