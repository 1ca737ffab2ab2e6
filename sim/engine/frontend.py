"""The serving front end around the engine (issue 37): what a client measures beyond the engine.

Why: users time requests from the client (``vllm bench serve``, their own SSE timer), through the
engine's OpenAI-compatible server: HTTP parsing and tokenisation before the engine sees a request,
detokenisation and one server-sent event per streamed chunk after it emitted tokens. Offline
benchmarks (vLLM's ``LLM``, trtllm-bench, gptSessionBenchmark) pay none of it
(``engine.api_server: false``). The figures are engine-profile terms
(``sim/catalog/engine_profiles.yaml``, ``frontend_*``; ``engine.overhead`` overrides them).

Model, for a front end in a process of its own (``frontend_overlap``: vLLM V1's API server beside
EngineCore, vllm/v1/engine/async_llm.py; SGLang's tokenizer and detokenizer managers; Triton's
ensemble preprocessing and postprocessing models; trtllm-serve beside its executor workers), whose
work overlaps the engine's steps and so delays requests, not steps:

- in: request i's HTTP handling and tokenisation take ``c_i = frontend_request + frontend_per_
  prompt_token x prompt_i`` seconds of the API server, one request at a time in arrival order (its
  asyncio event loop is one thread): the request reaches the engine at ``e_i = max(a_i, e_{i-1})
  + c_i`` (Lindley's recursion; vectorised as ``e_i = C_i + max_{j<=i}(a_j - C_{j-1})``, C the
  running sum of c). The engine's replicas see ``e_i`` as the arrival (``shifted``), before the
  simulation: the replica loop is unchanged.
- out: a chunk reaches the client ``frontend_chunk + frontend_per_output_token x its tokens``
  after the engine emitted its last token. The first token goes alone (SGLang
  scheduler_output_processor_mixin: a request streams when it has one output token or at the
  interval; TensorRT-LLM ``stream_interval``: the same), later chunks hold
  ``engine.stream_interval`` tokens, the last what is left (``first_out_s``, ``last_out_s``).

The client's times are the engine's shifted (``client_times``): arrival ``a_i``, first token at the
engine's + ``first_out``, finish at the engine's + ``last_out``. Client TTFT = engine TTFT +
``(e_i - a_i) + first_out``: that sum is the TTFT part ``ttft_frontend_s``.

NOTE: the output side is taken to keep up with the engine (no queue of chunks in the API
server): its throughput limit under many concurrent streams is not modelled. With
``stream_interval`` > 1 the client's ITL is one gap per chunk (sim/metrics/chunk_itl.py).
Under a closed loop (``max_concurrency``: vLLM bench ``--max-concurrency``, genai-perf's
concurrency mode) the same terms apply inside the simulation (``ClosedLoopFrontend``): a client
is free when the last chunk reached it (engine finish + ``last_out``), sends its next request at
once (vllm/benchmarks/serve.py ``limited_request_func``: an ``asyncio.Semaphore`` released when
the request function returns, no delay between requests), and that request goes through the same
one-request-at-a-time API server before the engine sees it. Requests released together (a batch
that finished in one step) therefore reach the engine ``c_i`` apart, one after another, as they do
from one asyncio server, not all at the same instant. The benchmark's start-up (every client at
once) is what its warm-up leaves out of the figures (``workload.synthetic.warmup_requests``,
sim/metrics/summary.py ``measured_rows``). NOTE: no spread of that kind unlocks clients of
identical lengths past the start-up: each request ends a fixed number of steps after its prefill,
so a client whose request once arrived during another's prefill step follows it one step behind
from then on, whatever the client's round trip (shorter than a prefill step); it waits for that
prefill every time (validation/VC-43: steady-state TTFT 1.77x / 1.94x / 1.98x c1's at 5 / 25 / 50
clients, 1.34x / 1.69x / 2.05x measured, while ITL matches; issue 37, "Closed-loop clients
phase-lock", left open).
A front end in the engine's own thread (``frontend_overlap: false``) adds to the engine's steps
instead (``sim.cost.engine_profile.in_process_frontend``); nothing is added here then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from sim.engine.columns import ColumnBuffer
from sim.workload.arrays import RequestArrays


@dataclass(frozen=True)
class Frontend:
    """The front end's terms in seconds (``EngineProfile.frontend_*``) and the stream interval."""

    request_s: float
    per_prompt_token_s: float
    per_output_token_s: float
    chunk_s: float
    stream_interval: int = 1

    @classmethod
    def of(cls, profile, stream_interval: int = 1) -> Frontend | None:
        """The front end of a resolved engine profile (``engine_profile``: offline and in-process
        front ends have their terms at 0 there), or None when it adds nothing."""
        f = cls(profile.frontend_request_s, profile.frontend_per_prompt_token_s, profile.frontend_per_output_token_s,
                profile.frontend_chunk_s, stream_interval)
        return f if f.active else None

    @property
    def active(self) -> bool:
        return any(t > 0.0 for t in (self.request_s, self.per_prompt_token_s, self.per_output_token_s, self.chunk_s))

    def input_s(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """Per request: the API server's seconds before the engine can see it (HTTP, tokenise)."""
        return self.request_s + self.per_prompt_token_s * np.asarray(prompt_tokens, dtype=np.float64)

    def num_chunks(self, output_tokens: np.ndarray) -> np.ndarray:
        """Streamed chunks per request: the first token alone, then ``stream_interval`` at a time."""
        n = np.asarray(output_tokens, dtype=np.int64)
        k = self.stream_interval
        return np.where(n > 0, 1 + (np.maximum(n - 1, 0) + k - 1) // k, 0)

    def first_out_s(self, output_tokens: np.ndarray) -> np.ndarray:
        """Per request: seconds from the engine's first token to the client's (a chunk of one)."""
        n = np.asarray(output_tokens)
        return np.where(n > 0, self.chunk_s + self.per_output_token_s, 0.0)

    def last_out_s(self, output_tokens: np.ndarray) -> np.ndarray:
        """Per request: seconds from the engine's last token to the client's: the last chunk's
        event and the detokenisation of its tokens (1 + (n - 2) mod stream_interval of them)."""
        n = np.asarray(output_tokens, dtype=np.int64)
        last_tokens = np.where(n > 1, (n - 2) % self.stream_interval + 1, 1)
        return np.where(n > 0, self.chunk_s + self.per_output_token_s * last_tokens, 0.0)

    def output_work_s(self, output_tokens: np.ndarray) -> np.ndarray:
        """Per request: the API server's whole output-side work (every chunk and token)."""
        n = np.asarray(output_tokens, dtype=np.float64)
        return self.chunk_s * self.num_chunks(output_tokens) + self.per_output_token_s * n


class EntryQueue:
    """The API server's input side as one FIFO server (the module docstring): chunk by chunk of
    a workload in arrival order, the times requests reach the engine; the last one carries over."""

    def __init__(self) -> None:
        self.last_entry_s = -np.inf

    def entries(self, arrival_s: np.ndarray, input_s: np.ndarray) -> np.ndarray:
        """``e_i = max(a_i, e_{i-1}) + c_i`` for one chunk, after the chunks before it."""
        if not len(arrival_s):
            return np.asarray(arrival_s, dtype=np.float64)
        total = np.cumsum(input_s)
        before = total - input_s
        ready = np.maximum.accumulate(np.asarray(arrival_s, dtype=np.float64) - before)
        out = total + np.maximum(ready, self.last_entry_s)
        self.last_entry_s = float(out[-1])
        return out


class LiveEntryQueue:
    """``EntryQueue`` for requests that come one at a time (a live run, sim/live.py), all one
    chunk: each entry is computed with the very floating-point operations ``entries`` does on a
    whole chunk (numpy's cumsum and maximum.accumulate work left to right), so that a live run
    and ``simsrv run`` on its recorded arrivals (one chunk) hand requests to the engine at the
    same times, to the bit."""

    def __init__(self) -> None:
        self._total = 0.0     # the chunk's running sum of input seconds (cumsum)
        self._ready = -np.inf  # the running maximum of arrival - seconds before (maximum.accumulate)

    def entry(self, arrival_s: float, input_s: float) -> float:
        total = self._total + input_s
        before = total - input_s
        self._ready = ready = max(self._ready, arrival_s - before)
        self._total = total
        return total + max(ready, -np.inf)


def shifted(arrays: RequestArrays | Iterable[RequestArrays], frontend: Frontend,
            record: ColumnBuffer) -> RequestArrays | Iterator[RequestArrays]:
    """The workload as the engine sees it: each request arriving when the front end hands it
    over (``EntryQueue``); each request's seconds in the front end (entry - arrival) are
    appended to ``record`` (column ``frontend_in_s``) in request order. A stream of chunks stays
    a stream (read as the simulation reaches it)."""
    queue = EntryQueue()

    def one(chunk: RequestArrays) -> RequestArrays:
        entry = queue.entries(chunk.arrival_s, frontend.input_s(chunk.input_tokens))
        record.add_block((entry - chunk.arrival_s).reshape(-1, 1))
        # (abort times stay as they are: a client aborts on its own clock, the front end's wait or not)
        return replace(chunk, arrival_s=entry)

    if isinstance(arrays, RequestArrays):
        return one(arrays)
    return (one(chunk) for chunk in arrays)


# the requests-frame columns the front end changes: the client's view of them (``client_times``)
CLIENT_COLUMNS = ("arrival_s", "first_token_s", "finish_s", "ttft_frontend_s")


def client_times(name: str, frontend: Frontend | None, read: Callable[[str], np.ndarray],
                 spent_in_s: Callable[[], np.ndarray]) -> np.ndarray:
    """One of ``CLIENT_COLUMNS`` for some requests, as the client sees it. ``read(field)``: the
    recorded (engine-side) column; ``spent_in_s()``: the seconds each spent in the front end
    before the engine saw it (its arrival there, ``shifted``)."""
    if frontend is None:
        return np.zeros(len(read("arrival_s"))) if name == "ttft_frontend_s" else read(name)
    if name == "arrival_s":
        return read("arrival_s") - spent_in_s()
    if name == "first_token_s":
        return read("first_token_s") + frontend.first_out_s(read("output_tokens"))
    if name == "finish_s":
        return read("finish_s") + frontend.last_out_s(read("output_tokens"))
    if name == "ttft_frontend_s":
        first_out = np.where(np.isnan(read("first_token_s")), 0.0, frontend.first_out_s(read("output_tokens")))
        return spent_in_s() + first_out
    raise KeyError(name)


class ClosedLoopFrontend:
    """The front end under a closed loop (the module docstring): each request a client sends goes
    through the API server's FIFO input side (``entry``: the same recursion as ``EntryQueue``,
    one request at a time, in the order sent); its client is free again when the request's last
    chunk reached it (``client_free_after_s``). ``spent_in`` records each request's seconds in
    the front end before the engine saw it (column ``frontend_in_s``), in the order sent (request
    id order), for ``client_times``."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.spent_in = ColumnBuffer(("frontend_in_s",))
        self._last_entry_s = -np.inf

    def entry(self, sent_s: float, prompt_tokens: int) -> float:
        """When the engine sees a request sent at ``sent_s``: ``e = max(sent, e_prev) + c``."""
        f = self.frontend
        c = f.request_s + f.per_prompt_token_s * float(prompt_tokens)  # ``Frontend.input_s``
        e = max(sent_s, self._last_entry_s) + c
        self._last_entry_s = e
        self.spent_in.append((e - sent_s,))
        return e

    def client_free_after_s(self, output_tokens: int) -> float:
        """Seconds from the engine's last token of a request to its client's (``last_out_s``)."""
        return float(self.frontend.last_out_s(np.asarray([output_tokens]))[0])
