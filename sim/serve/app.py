"""The HTTP side of ``simsrv serve``: vLLM's OpenAI-compatible routes on an ASGI app.

Why this stack: Starlette (the ASGI toolkit FastAPI is built on) served by uvicorn is what
vLLM's own OpenAI server runs on (FastAPI + uvicorn, ``vllm/entrypoints/openai/api_server.py``),
so clients meet the same HTTP behaviour: chunked transfer, ``text/event-stream`` framing,
keep-alive. Both are maintained by Encode, BSD-licensed, pure Python, and come in the
``serve`` extra only. All simulation work runs on the event loop's one thread (sim/serve/
driver.py), so a request's arrival, its tokens and ``/metrics`` see one consistent state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sim.serve.driver import Driver, Stream, sleep_until
from sim.serve.openai_api import ApiError, chunk, parse, sse, token_text, usage_chunk, whole
from sim.serve.prom import exposition

# the header of the server's own warm-up request (sim/serve/session.py ``_warm_up``): it passes
# before the doors open, to a throwaway copy of the deployment
WARM_UP_HEADER = "x-simsrv-warm-up"

# the ASGI scope extension (ASGI spec: servers add theirs under scope["extensions"]) holding the
# wall time a request's first bytes were received (``arrival_stamping_protocol``)
ARRIVAL_EXTENSION = "simsrv.arrival_wall"


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where that package is installed (the ``serve`` extra, on CPython
    outside Windows), else None: asyncio's own. vLLM's API server runs on uvloop
    (vllm/entrypoints/cli/serve.py ``uvloop.run(run_server(args))``); here it takes ~0.2 ms off
    the time from a request's bytes reaching the socket to the server reading them (README,
    "simsrv serve", timing)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def arrival_stamping_protocol(clock: Callable[[], float]) -> type:
    """uvicorn's HTTP protocol, httptools' where that package is installed and h11's otherwise
    (what uvicorn's ``http="auto"`` picks), stamping each request with ``clock()`` when its first
    bytes were received: a request arrives then, not when its handler starts after the HTTP
    parsing and routing (~0.25 ms here). The simulated front end (sim/engine/frontend.py) models
    vLLM's API server from that moment, its HTTP parsing included, so simsrv's own parsing runs
    inside the simulated span instead of before it (README, "simsrv serve", timing)."""
    try:
        import httptools  # noqa: F401  (uvicorn's httptools protocol needs it)
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    class ArrivalStamping(Base):  # type: ignore[misc,valid-type]
        _first_bytes_wall: float | None = None

        def data_received(self, data: bytes) -> None:
            now = clock()
            cycle = self.cycle
            if self._first_bytes_wall is None and (cycle is None or cycle.response_complete):
                self._first_bytes_wall = now  # the first bytes of a new request (not a body's later ones)
            scope = getattr(self, "scope", None)
            super().data_received(data)
            new = getattr(self, "scope", None)
            if new is not scope and new is not None:  # the parser began a request in this call
                new.setdefault("extensions", {})[ARRIVAL_EXTENSION] = self._first_bytes_wall or now
                self._first_bytes_wall = None

    return ArrivalStamping


class Endpoint:
    """The routes, over one driver."""

    def __init__(self, driver: Driver, model: str, max_model_len: int, count, output_tokens, version: str):
        """``output_tokens(asked, index)``: how many tokens request number ``index`` will
        generate (sim/serve/session.py: ``max_tokens``, or an end-of-sequence draw)."""
        self.driver, self.model, self.max_model_len = driver, model, max_model_len
        self.count, self.output_tokens, self.version = count, output_tokens, version
        self.created = int(time.time())
        self.num_requests = 0
        self.open = asyncio.Event()  # set once simulated time 0 has begun (session.py)

    def app(self, lifespan=None) -> Starlette:
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version_route, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=lifespan)

    # -- info routes -----------------------------------------------------------------------------
    async def models(self, _request: Request) -> Response:
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": self.max_model_len, "permission": []}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def version_route(self, _request: Request) -> Response:
        return JSONResponse({"version": self.version})

    async def metrics(self, _request: Request) -> Response:
        d = self.driver
        d.catch_up()
        text = exposition(self.model, d.metrics, d.live.gauges())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- generation ------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        if WARM_UP_HEADER not in request.headers:
            await self.open.wait()
        # its arrival: when its first bytes came in (``arrival_stamping_protocol``), else now,
        # before reading the body and counting tokens
        received_wall = request.scope.get("extensions", {}).get(ARRIVAL_EXTENSION) or self.driver.clock()
        try:
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError):
                raise ApiError(400, "the request body is not valid JSON") from None
            asked = parse(body, chat, self.count, self.max_model_len, self.model)
            index = self.num_requests
            stream = self.driver.submit(asked, self.output_tokens(asked, index), received_wall)
            self.num_requests += 1
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        if not stream.decided.is_set():  # the API server still holds it: admission control answers later
            if await self._aborted_if_gone(stream.decided.wait(), request, stream) is None:
                return Response(status_code=499)  # (nobody reads it: the client has gone)
        if stream.rejected:
            err = ApiError(429, stream.rejected, "RateLimitError")
            return JSONResponse(err.body(), status_code=err.status)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{stream.request_id}"
        created = int(time.time())
        if asked.stream:
            return AbortingStream(self._events(stream, rid, created), lambda: self.driver.abort(stream),
                                  media_type="text/event-stream")
        answer = await self._aborted_if_gone(self._whole(stream, rid, created), request, stream)
        return Response(status_code=499) if answer is None else answer

    async def _aborted_if_gone(self, work, request: Request, stream: Stream):
        """``work``'s result; None if the client disconnects first, its request then aborted."""
        answer = await _unless_gone(work, request)
        if answer is None:
            self.driver.abort(stream)
        return answer

    def _finish_reason(self, stream: Stream) -> str:
        return "length" if stream.output_tokens >= stream.asked.max_tokens else "stop"

    async def _events(self, stream: Stream, rid: str, created: int):
        asked, last = stream.asked, stream.output_tokens - 1
        while True:
            item = await stream.tokens.get()
            if item is None:
                break
            i, t_s = item
            due_wall = self.driver.wall_of(t_s)
            if due_wall > self.driver.clock():  # the serving front end's time to the client (sim/engine/frontend.py)
                await sleep_until(self.driver.clock, due_wall)
            event = sse(chunk(asked, rid, created, token_text(i), self._finish_reason(stream) if i == last else None))
            if asked.chat and i == 0:  # vLLM's chat stream opens with the role, at the first output
                event = sse(chunk(asked, rid, created, None, None, role=True)) + event  # (one write, not two)
            yield event
        if stream.failure:
            yield sse(ApiError(500, f"the simulated engine did not finish the request: {stream.failure}",
                               "InternalServerError").body())
        elif asked.include_usage:
            yield sse(usage_chunk(asked, rid, created, stream.sent))
        yield sse("[DONE]")

    async def _whole(self, stream: Stream, rid: str, created: int) -> Response:
        while await stream.tokens.get() is not None:
            pass
        if stream.failure:
            err = ApiError(500, f"the simulated engine did not finish the request: {stream.failure}",
                           "InternalServerError")
            return JSONResponse(err.body(), status_code=err.status)
        text = "".join(token_text(i) for i in range(stream.sent))
        return JSONResponse(whole(stream.asked, rid, created, text, self._finish_reason(stream), stream.sent))


# -- a client that goes away aborts its request ------------------------------------------------------
# vLLM aborts a request whose client disconnected: a stream's generator is cancelled
# (vllm/v1/engine/async_llm.py ``generate``: ``CancelledError`` -> ``abort``), and a whole answer is
# awaited beside a listener for the ASGI ``http.disconnect`` message
# (vllm/entrypoints/serve/utils/api_utils.py ``with_cancellation``, ``listen_for_disconnect``).

async def _gone(receive) -> None:
    """Returns once the ASGI server reports the client's disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_of(work, receive) -> asyncio.Future:
    """Run ``work`` until it ends or the client disconnects (``receive`` reports it), whichever
    comes first; the other is cancelled. Returns ``work``'s task (cancelled if the client went)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_gone(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await t
    return task


async def _unless_gone(work, request: Request):
    """``work``'s result, or None if the client disconnects first (``work`` is then cancelled)."""
    task = await _first_of(work, request.receive)
    if task.done() and not task.cancelled():
        return task.result()
    return None


class AbortingStream(StreamingResponse):
    """A ``StreamingResponse`` that calls ``on_gone()`` when its client goes away before the
    stream ends: an ``http.disconnect`` while it waits for the next token, or a send that fails.
    (Starlette 1.x listens for the disconnect only under ASGI spec < 2.4; uvicorn says 2.4, and
    then only a failed send tells, which a request queued in the simulation would not make
    until its first token.)"""

    def __init__(self, content, on_gone, **kwargs):
        super().__init__(content, **kwargs)
        self.on_gone = on_gone

    async def __call__(self, scope, receive, send) -> None:
        body = await _first_of(self.stream_response(send), receive)
        if body.done() and not body.cancelled():
            error = body.exception()
            if error is None:
                return  # the stream ended
            if not isinstance(error, OSError):  # (OSError: a send to a closed connection)
                raise error
        self.on_gone()
