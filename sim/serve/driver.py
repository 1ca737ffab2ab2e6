"""The driver of ``simsrv serve``: simulated time paced against the wall clock.

Why: the simulation (sim/engine/live.py ``LiveSimulation``) never reads the wall clock; this
driver decides how far it may run. Simulated time t is wall time ``start + t / speed``. The
driver only ever runs the simulation up to the simulated time the wall clock has reached, so
an arrival always lands at the simulation's present and cuts a fast-forwarded decode run as a
replayed arrival does. It wakes when the next simulated event or the next decode-step
boundary of a request it is streaming comes due, hands each request's new tokens to its HTTP
stream at that moment, and records every arrival (time, prompt tokens, tokens to generate),
so the session replays with ``simsrv run`` to the same results (sim/serve/session.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from sim.serve.openai_api import ApiError, Asked
from sim.serve.prom import EngineMetrics

# the waiting queue's bound (README, "simsrv serve"): requests waiting to be scheduled, summed
# over the replicas; beyond it a new request gets 503, as a gateway in front of vLLM answers
DEFAULT_MAX_WAITING = 4096

# How early the driver's timer is set before a due time. asyncio's selector waits in whole
# milliseconds rounded up (CPython Lib/selectors.py ``EpollSelector.select``: ``math.ceil(timeout *
# 1e3) * 1e-3``, epoll_wait(2) takes milliseconds; uvloop's libuv timers count milliseconds too),
# and the kernel adds its timer slack (prctl(2) PR_SET_TIMERSLACK, 50 us by default): a timer for
# t fires between t and t + ~1.05 ms. So the driver sleeps to WAKE_EARLY_S before the due time
# and then yields to the loop (``sleep_until``) until the clock reaches it.
WAKE_EARLY_S = 0.0012


async def sleep_until(clock: Callable[[], float], due_wall: float, poke: asyncio.Event | None = None) -> None:
    """Return once ``clock()`` reaches ``due_wall`` (or as soon as ``poke`` is set): a timer to
    ``WAKE_EARLY_S`` before it, then ``asyncio.sleep(0)`` until it is due. Each ``sleep(0)`` is one
    turn of the event loop: the sockets are polled (a zero timeout while a callback is ready) and
    every other ready callback runs, so other streams are never held up; the turns last at most
    ``WAKE_EARLY_S`` plus the timer's lateness. Always yields at least once."""
    delay = due_wall - clock() - WAKE_EARLY_S
    if delay > 0:
        if poke is None:
            await asyncio.sleep(delay)
        else:
            try:
                await asyncio.wait_for(poke.wait(), timeout=delay)
                return
            except asyncio.TimeoutError:
                pass
    await asyncio.sleep(0)
    while clock() < due_wall and not (poke is not None and poke.is_set()):
        await asyncio.sleep(0)


@dataclass
class Stream:
    """One HTTP request in flight: what it asked and the tokens handed to its response."""
    asked: Asked
    request_id: int
    output_tokens: int
    # (token index, simulated time) per token as it comes out; None at the end
    tokens: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0
    done: bool = False
    failure: str = ""
    # admission control's answer (sim/engine/admission_control.py): set once it is known (when
    # the request reaches the engines); ``rejected`` its reason if it refused it
    decided: asyncio.Event = field(default_factory=asyncio.Event)
    rejected: str = ""
    # the simulated time of its latest output (``Driver._observe_gap``)
    last_output_s: float | None = None


class Driver:
    """Owns the live simulation and the streams; every method runs on the event loop's thread."""

    def __init__(self, live, speed: float = 1.0, max_waiting: int = DEFAULT_MAX_WAITING,
                 clock: Callable[[], float] = time.monotonic):
        self.live, self.speed, self.max_waiting, self.clock = live, speed, max_waiting, clock
        self.start_wall = clock()
        self.started = False  # simulated time 0 begins with the first arrival (``submit``)
        self.streams: dict[int, Stream] = {}
        self.metrics = [EngineMetrics() for _ in range(live.num_replicas)]
        self._poke = asyncio.Event()
        self.stopping = False

    # -- time ----------------------------------------------------------------------------------
    def sim_now(self) -> float:
        """The simulated time the wall clock has reached."""
        return (self.clock() - self.start_wall) * self.speed

    def wall_of(self, t_s: float) -> float:
        return self.start_wall + t_s / self.speed

    def catch_up(self, wall: float | None = None) -> float:
        """Run the simulation to the simulated time of ``wall`` (default: the wall clock's
        present), or leave it where it is if it is past that already; hand out what came due."""
        if not self.started:
            return self.live.now_s
        wall = self.clock() if wall is None else wall
        t = max((wall - self.start_wall) * self.speed, self.live.now_s)
        # each token handed out at its own simulated time (an event's, or a step's end inside a
        # fast-forwarded run), however late this call comes: its chunk's due time and its
        # inter-token gap are the simulation's, not the wall clock's
        last = -math.inf
        while self.streams:
            wake = self.next_wake_s()
            if not last < wake <= t:  # (each pass runs what is due by ``wake``: the next comes later)
                break
            self.live.run_until(wake)
            self._hand_out(wake)
            last = wake
        self.live.run_until(t)
        self._hand_out(t)
        return t

    # -- requests ------------------------------------------------------------------------------
    def submit(self, asked: Asked, output_tokens: int, received_wall: float | None = None) -> Stream:
        """A request that reached the server at wall time ``received_wall`` (default now: its
        handler reads and parses the body in between): into the simulation at that simulated
        time, or at the simulation's present if the simulation has run past it meanwhile."""
        if self.stopping:
            raise ApiError(503, "the server is shutting down", "ServiceUnavailableError")
        received = self.clock() if received_wall is None else received_wall
        if not self.started:
            # simulated time 0 is the first arrival (nothing happens in an idle deployment
            # before it), so the recorded arrivals replay from a trace to the same times
            self.start_wall, self.started = received, True
        else:
            self.catch_up(received)
        waiting = self.live.num_waiting()
        if waiting >= self.max_waiting:
            raise ApiError(503, f"{waiting} requests are waiting (simsrv serve --max-waiting "
                                f"{self.max_waiting}); try again later", "ServiceUnavailableError")
        # (a priority under scheduling_policy fcfs is taken and never read, as vLLM 0.11 V1 does:
        # its protocol.py promises an error that its V1 processor does not raise)
        rid = self.live.inject(asked.prompt_tokens, output_tokens, asked.max_tokens, asked.priority)
        stream = Stream(asked, rid, output_tokens)
        self.streams[rid] = stream
        self._hand_out(self.live.now_s)  # a request the engine refused fails at once
        self._poke.set()
        if stream.rejected:  # admission control refused it on arrival: HTTP 429, as a gateway answers
            raise ApiError(429, stream.rejected, "RateLimitError")
        return stream

    def abort(self, stream: Stream) -> None:
        """``stream``'s client went away (a closed connection: sim/serve/app.py): its request
        is aborted at the simulated present, as vLLM's server aborts a request whose client
        disconnected (vllm/v1/engine/async_llm.py ``generate``: on ``CancelledError`` it calls
        ``abort``). Nothing if it ended already or the server is stopping."""
        if stream.done or self.stopping or stream.request_id not in self.streams:
            return
        t = self.catch_up()
        if stream.done:  # (it ended by now)
            return
        self.live.abort(stream.request_id, t)
        self._hand_out(t)
        self._poke.set()

    def _hand_out(self, t_s: float) -> None:
        """Each stream's tokens emitted by ``t_s``; the end of those that finished."""
        ended = []
        for rid, s in self.streams.items():
            if not s.decided.is_set():
                verdict = self.live.rejection(rid)
                if verdict is not None:
                    s.rejected = verdict
                    s.decided.set()
            n, finished, reason = self.live.progress(rid, t_s)
            if n > s.sent:
                self._observe_gap(rid, s, t_s)
            while s.sent < n:  # each token reaches the client the front end's seconds later
                s.tokens.put_nowait((s.sent, t_s + self.live.frontend_out_s))
                s.sent += 1
            if finished:
                s.done, s.failure = True, reason
                s.tokens.put_nowait(None)
                ended.append(rid)
        for rid in ended:
            self._record(rid, self.streams.pop(rid))

    def _observe_gap(self, rid: int, stream: Stream, t_s: float) -> None:
        """The request's new output at simulated time ``t_s``: its gap since the previous one
        into ``vllm:inter_token_latency_seconds``, one observation per output as vLLM makes it
        (vllm/v1/metrics/stats.py ``IterationStats.update_from_output``, 0.11.0 and 0.34.0:
        ``engine_core_timestamp - req_stats.last_token_ts`` for each output after the first;
        loggers.py ``PrometheusStatLogger.record`` observes each)."""
        if stream.last_output_s is not None:
            replica = self.live.replica_of(rid)
            if replica >= 0:
                self.metrics[replica].histograms["vllm:inter_token_latency_seconds"].observe(
                    t_s - stream.last_output_s)
        stream.last_output_s = t_s

    def _record(self, rid: int, stream: Stream) -> None:
        """A finished request's latencies into its replica's histograms (vLLM's metric names)."""
        r = self.live.request_times(rid)
        if r is None or r["replica"] < 0:
            return
        m = self.metrics[r["replica"]]
        if r["status"] != "completed":
            m.success["abort"] = m.success.get("abort", 0) + 1
            return
        h = m.histograms
        h["vllm:time_to_first_token_seconds"].observe(r["first_token_s"] - r["arrival_s"])
        h["vllm:e2e_request_latency_seconds"].observe(r["finish_s"] - r["arrival_s"])
        h["vllm:request_queue_time_seconds"].observe(r["first_scheduled_s"] - r["arrival_s"])
        n = r["output_tokens"]  # (its inter-token gaps were observed as they came: _observe_gap)
        m.counters["vllm:prompt_tokens"] += r["prompt_tokens"]
        m.counters["vllm:generation_tokens"] += n
        m.counters["vllm:num_preemptions"] += r["num_preemptions"]
        m.counters["vllm:prefix_cache_queries"] += r["prompt_tokens"]
        m.counters["vllm:prefix_cache_hits"] += r["prefix_hit_tokens"]
        reason = "length" if n >= stream.asked.max_tokens else "stop"
        m.success[reason] = m.success.get(reason, 0) + 1

    # -- the pacing loop ---------------------------------------------------------------------
    def next_wake_s(self) -> float:
        """The next simulated time at which something comes due: an event, or a token of a
        request being streamed (a decode-step boundary inside a fast-forwarded run)."""
        t = self.live.next_event_s()
        if self.streams:
            t = min(t, self.live.next_token_s())
        return t

    async def pace(self) -> None:
        """Run until ``stop``: catch up, then sleep until the next wake or a new arrival."""
        while not self.stopping:
            self.catch_up()
            wake = self.next_wake_s()
            self._poke.clear()
            if math.isinf(wake):
                await self._poke.wait()
            else:
                # (woken when the token at ``wake`` is due at the client, the front end's seconds
                # later: its chunk leaves at once, not after a second, sub-millisecond wait.
                # Catching up later changes nothing simulated: ``catch_up`` hands each token out at its
                # own time, and an arrival meanwhile catches the simulation up to itself first)
                await sleep_until(self.clock, self.wall_of(wake + self.live.frontend_out_s), self._poke)

    def stop(self, reason: str) -> None:
        """Shutdown: the simulation stops at the present (``LiveView.finish`` fails what is still
        in flight); each open stream ends with ``reason``."""
        if self.stopping:
            return
        self.catch_up()
        self.stopping = True
        for s in self.streams.values():
            s.done, s.failure = True, reason
            s.decided.set()  # (one the API server still held: its handler waits no more)
            s.tokens.put_nowait(None)
        self.streams.clear()
        self._poke.set()
