"""The arrival process: each request of a workload enters the cluster at its arrival time.

Why: ``simulate`` (sim/engine/cluster.py) replays a workload (or consecutive sorted chunks of
one, read only as far as simulated time has reached) by submitting each request to the
topology at its time; with ``max_concurrency`` (vLLM bench ``--max-concurrency``) a request
also waits for a free client and is sent (its arrival time) when one frees up.

It runs as callbacks of events in the clock's queue (sim/engine/calls.py ``Call``), not as a
generator process (a generator resume and a new ``Timeout`` per arrival), and schedules the
very events that process did, at the same times and priorities and in the same order: its start as
``Initialize`` (URGENT, at 0), a wait for the next arrival time as ``Timeout`` (NORMAL, after
the gap), a wait for a free client as an event that ``release`` succeeds (NORMAL, now). The one
event it leaves out is the process's end (scheduled when the last request was sent, with no
callbacks: nothing waits on it); it only counted towards the stall watchdog's events.
A live run (sim/live.py) sends its requests with ``inject`` instead, one at the clock's time,
as ``_send`` sends one whose time has come.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from sim.core.request import Request, end_aborted
from sim.engine.calls import Call
from sim.engine.clock import URGENT
from sim.engine.simpy_clock import ClockEnvironment
from sim.workload.arrays import RequestArrays

NO_ABORT: Final = float("nan")  # a request's abort time when its client does not abort it
ARRIVAL_SLICE = 1 << 16  # arrivals turned into Python numbers at a time (not a whole chunk)

# a wait for a free client (max_concurrency): none, waiting, woken (the wake-up is queued)
_NO_WAIT, _WAITING, _WOKEN = 0, 1, 2


# a slice: (arrival seconds, prompt tokens, output tokens, hash ids or None, offset, hash block
# size, max_tokens or None: none sent, priorities or None: all 0, abort times or None: none
# aborted); typed: compiled (sim/compiled_core.py), its lists' items are read natively, not by a
# generic subscript of an object
_Slice = tuple[list[float], list[int], list[int], Any, int, int, Any, Any, Any]


def _slices(chunks: Iterable[RequestArrays]) -> Iterator[_Slice]:
    """Consecutive slices of the workload as Python lists: (arrival seconds, prompt tokens,
    output tokens, the chunk's hash ids or None, the slice's offset in its chunk, hash block size,
    max_tokens or None, priorities or None, abort times or None).
    A stream is read only when the previous chunk's last request has been sent."""
    for chunk in chunks:
        for lo in range(0, len(chunk), ARRIVAL_SLICE):
            yield (chunk.arrival_s[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.input_tokens[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.output_tokens[lo:lo + ARRIVAL_SLICE].tolist(),
                   chunk.hash_ids, lo, chunk.hash_block_size,
                   None if chunk.max_tokens is None else chunk.max_tokens[lo:lo + ARRIVAL_SLICE].tolist(),
                   None if chunk.priority is None else chunk.priority[lo:lo + ARRIVAL_SLICE].tolist(),
                   None if chunk.abort_s is None else chunk.abort_s[lo:lo + ARRIVAL_SLICE].tolist())


class Arrivals:
    """Sends the workload's requests to ``submit`` at their times, numbered from 0 in order;
    each one sent is appended to ``requests`` (unless None). ``sent`` counts them. With
    ``max_concurrency``, ``release(n)`` returns n clients (their requests ended).
    A request with an abort time (``RequestArrays.abort_s``: its client gives up then) is
    aborted at that time (``abort(req)``, an event at that time to the bit); one whose abort
    time is before its own arrival here (aborted while the API server held it, sim/engine/
    frontend.py) is numbered, ended as aborted and handed to ``aborted_unsent``, not sent."""

    def __init__(self, env: ClockEnvironment, chunks: Iterable[RequestArrays], submit: Callable[[Request], None],
                 requests: list[Request] | None, max_concurrency: int | None = None,
                 abort: Callable[[Request], None] | None = None,
                 aborted_unsent: Callable[[Request], None] | None = None):
        self.env = env
        self.clock = clock = env.clock
        self._submit = submit
        self._abort = abort
        self._aborted_unsent = aborted_unsent
        self.requests = requests
        self.sent = 0
        self.free = max_concurrency if max_concurrency is not None else -1  # -1: open loop
        self._gated = max_concurrency is not None
        self._wait = _NO_WAIT
        self._slices = _slices(chunks)
        # the slice being sent (``_slices``) and the index in it of the next request
        self._slice: _Slice = ([], [], [], None, 0, 16, None, None, None)
        self._j = 0
        self._timer = Call(clock, self._time_reached)  # the wait for the next arrival time (one at a time)
        Call(clock, self._start).at(0.0, URGENT)  # as a process starts (Initialize)

    def release(self, n: int) -> None:
        """``n`` clients are free again: a request waiting for one is woken."""
        self.free += n
        if self._wait == _WAITING:
            self._wait = _WOKEN
            Call(self.clock, self._woken).at(0.0)  # the wait's event succeeding now

    def _start(self, event: Call) -> None:
        self._send(False, event.time_s)

    def _time_reached(self, event: Call) -> None:
        self._send(True, event.time_s)

    def _woken(self, event: Call) -> None:
        self._wait = _NO_WAIT
        self._send(True, event.time_s)

    def _send(self, reached: bool, now: float) -> None:
        """Send requests from the next one on until one must wait (for its arrival time or,
        with ``max_concurrency``, a free client) or the workload ends. ``reached``: the next
        one's arrival time has come (the wait for it just ended: its time is not compared
        with the clock again, as the process went on after its timeout). ``now``: the clock."""
        arrival, inp, out, hash_ids, lo, block_size, max_tokens, priority, abort = self._slice
        j = self._j
        t: float  # (typed: compiled, sim/compiled_core.py, the clock's comparisons are native)
        while True:
            if j == len(arrival):
                nxt = next(self._slices, None)
                if nxt is None:
                    return  # every request sent (the process's end)
                self._slice = nxt
                arrival, inp, out, hash_ids, lo, block_size, max_tokens, priority, abort = nxt
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
            self._emit(t, inp[j], out[j], None if hash_ids is None else hash_ids[lo + j], block_size,
                       0 if max_tokens is None else max_tokens[j], 0 if priority is None else priority[j],
                       NO_ABORT if abort is None else abort[j])
            j += 1

    def inject(self, prompt_tokens: int, output_tokens: int, hash_ids: Any = None,
               hash_block_size: int = 16, max_tokens: int = 0, priority: int = 0,
               aborted_s: float = NO_ABORT, arrival_s: float = NO_ABORT) -> Request:
        """Send one request now (the clock's time), numbered next: a live run's arrival
        (``max_tokens`` 0: the client sent none). ``aborted_s``: when its client aborted it,
        before now (the API server held it meanwhile: sim/live.py), or ``NO_ABORT``.
        ``arrival_s``: its arrival time where it is not the clock's to the bit (a replay's
        request arrives at its trace time ``t`` while the event sending it fires at ``now + (t -
        now)``, ``_send``; sim/live.py mirrors that), or ``NO_ABORT`` (NaN): the clock's time."""
        t = arrival_s if arrival_s == arrival_s else self.clock.now_s
        return self._emit(t, prompt_tokens, output_tokens, hash_ids, hash_block_size, max_tokens,
                          priority, aborted_s)

    def _emit(self, t: float, prompt_tokens: int, output_tokens: int, hash_ids: Any,
              hash_block_size: int, max_tokens: int, priority: int, abort_s: float) -> Request:
        """Send a request arriving at ``t`` (now) to the topology; its abort at ``abort_s``
        (``NO_ABORT``: none) is due then, or it ended before it came here."""
        req = Request(self.sent, t, prompt_tokens, output_tokens, max_tokens, priority)
        if hash_ids is not None:
            req.hash_ids = hash_ids
            req.hash_block_size = hash_block_size
        if self.requests is not None:
            self.requests.append(req)
        self.sent += 1
        if abort_s == abort_s:  # (NaN: no abort)
            if abort_s < t:  # aborted while the API server held it: never sent on
                end_aborted(req, abort_s)
                if self._aborted_unsent is not None:
                    self._aborted_unsent(req)
                return req
            self._submit(req)
            if self._abort is not None:
                Call(self.clock, _AbortAt(req, self._abort).fire).at_time(abort_s)
            return req
        self._submit(req)
        return req


class _AbortAt:
    """A request's abort by its client, fired by a ``Call`` at its time: calls ``abort(req)``.
    (Not a ``Call`` subclass: mypyc 1.13 miscompiles reading the clock entry's inherited
    attributes once a class in another compiled module extends ``Call``: "'time_s' is not in
    list" in its code generator.)"""

    def __init__(self, req: Request, abort: Callable[[Request], None]):
        self.req = req
        self.abort = abort

    def fire(self, _event: Call) -> None:
        self.abort(self.req)
