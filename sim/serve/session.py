"""``simsrv serve``'s session: the scenario's live simulation behind the HTTP endpoint, from
start-up to the run directory written at shutdown.

Why: the endpoint is a run whose requests come from clients. At shutdown (Ctrl-C, SIGTERM)
the requests still in flight are failed with a reason, and the run directory is written as
``simsrv run`` writes it (``report`` and ``diagnose`` read it), with the recorded arrivals
(``arrivals.parquet``: time, prompt tokens, tokens generated) and a ``scenario.resolved.yaml``
that replays them: ``simsrv run DIR/scenario.resolved.yaml`` gives every request that completed
during the session the same results (those in flight at shutdown complete in the replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.scenario import Scenario, TraceSpec, Workload
from sim.serve.app import WARM_UP_HEADER, Endpoint, arrival_stamping_protocol, event_loop_factory
from sim.serve.driver import Driver
from sim.serve.live_view import LiveView

# the failure reason of a request in flight when the server stops
STOPPED = "in flight when simsrv serve stopped"

# --eos: where a request's output length comes from (README, "simsrv serve")
EOS_CHOICES = ("max_tokens", "workload")


def served_model_name(s: Scenario, given: str | None) -> str:
    """The model id ``/v1/models`` lists and requests name: ``--served-model-name``, else the
    scenario's ``model`` as written (vLLM serves a model under the name it was loaded by)."""
    if given:
        return given
    if isinstance(s.model, str):
        return s.model
    return s.model.name or Path(s.model.hf_config or "model").parent.name or "model"


class OutputLengths:
    """How many tokens request number ``index`` generates: its ``max_tokens`` (as with
    ``ignore_eos``, and as ``vllm bench serve`` asks with its fixed output lengths), or, with
    ``--eos workload``, an end-of-sequence draw from the scenario's synthetic output-length
    distribution capped at ``max_tokens`` (seeded: request number i always draws the same)."""

    def __init__(self, s: Scenario, eos: str):
        if eos not in EOS_CHOICES:
            raise UserError(f"--eos must be one of {', '.join(EOS_CHOICES)}, got {eos!r}")
        self.draws: np.ndarray | None = None
        if eos == "workload":
            syn = s.workload.synthetic
            if syn is None:
                raise UserError("--eos workload needs a scenario with workload.synthetic (its output lengths)")
            from sim.workload.synthetic import sample_lengths

            rng = np.random.default_rng(s.seed)
            self.draws = sample_lengths(rng, 1 << 16, syn.output_tokens, s.resolve_path,
                                        "workload.synthetic.output_tokens")

    def __call__(self, asked, index: int) -> int:
        if self.draws is None or asked.ignore_eos:
            return asked.max_tokens
        return int(min(asked.max_tokens, self.draws[index % len(self.draws)]))


def replay_scenario(s: Scenario, arrivals_path: Path) -> Scenario:
    """``s`` with its workload replaced by the recorded arrivals (normalized trace)."""
    trace = TraceSpec(path=str(arrivals_path.resolve()), format="normalized")
    return s.model_copy(update={"workload": Workload(trace=trace)})


def write_arrivals(path: Path, arrival_s: list[float], input_tokens: list[int], output_tokens: list[int],
                   max_tokens: list[int], priority: list[int] | None = None,
                   abort_s: list[float] | None = None) -> None:
    """The recorded arrivals as a normalized trace (Parquet: the times' float64 bits kept), with
    each request's ``max_tokens`` (what its client sent) beside the tokens it generated, its
    priority where any request sent one, and ``abort_s`` (when its client went away; null: it
    did not) where any client went away."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"arrival_s": pa.array(arrival_s, pa.float64()),
                      "input_tokens": pa.array(input_tokens, pa.int64()),
                      "output_tokens": pa.array(output_tokens, pa.int64()),
                      "max_tokens": pa.array(max_tokens, pa.int64()),
                      **({"priority": pa.array(priority, pa.int64())} if priority and any(priority) else {}),
                      **({"abort_s": pa.array(abort_s, pa.float64(), from_pandas=True)}
                         if abort_s and any(t == t for t in abort_s) else {})})
    pq.write_table(table, path)


@dataclass
class ServeOptions:
    scenario: Path
    sets: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    speed: float = 1.0
    out: Path | None = None
    force: bool = False
    max_waiting: int = 4096
    tokenizer: Path | None = None
    eos: str = "max_tokens"
    served_model_name: str | None = None
    # called with the bound (host, port) once the server listens (tests; the CLI prints it)
    on_ready: Callable[[str, int], None] | None = None


# --speed's range: a simulated second per wall microsecond at most
MAX_SPEED = 1e6


def _check(o: ServeOptions) -> None:
    if not (0 < o.speed <= MAX_SPEED) or o.speed != o.speed:
        raise UserError(f"--speed must be > 0 and <= {MAX_SPEED:g}, got {o.speed:g}")
    if not 0 <= o.port <= 65535:
        raise UserError(f"--port must be 0-65535, got {o.port}")
    if o.max_waiting < 1:
        raise UserError(f"--max-waiting must be >= 1, got {o.max_waiting}")


def serve_scenario(o: ServeOptions) -> Path:
    """Serve until Ctrl-C / SIGTERM; write the run directory; return its path."""
    from sim.cli.outputs import check_output
    from sim.files.atomic import replacing_dir
    from sim.output import not_run_files
    from sim.scenario import load_scenario
    from sim.serve.tokens import load_counter

    _check(o)
    s = load_scenario(o.scenario, o.sets)
    count = load_counter(o.tokenizer)
    lengths = OutputLengths(s, o.eos)
    out = o.out or Path("reports/runs") / f"{s.dir_name}-serve"
    check_output(out, "--out", directory=True)
    with replacing_dir(out, o.force, not_run_files) as stage:
        live = LiveView(s)
        driver = Driver(live, o.speed, o.max_waiting)
        model = served_model_name(s, o.served_model_name)
        endpoint = Endpoint(driver, model, live.max_model_len, count, lengths, _version())
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve(endpoint, o, s))
        _write(live, driver, out, stage)
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"simsrv {version('simsrv')}"
    except PackageNotFoundError:
        return "simsrv"


async def _serve(endpoint, o: ServeOptions, scenario: Scenario) -> None:
    """uvicorn until Ctrl-C / SIGTERM. Once listening, one request goes through the whole HTTP
    path to a throwaway copy of the deployment (``_warm_up``); then simulated time 0 starts and
    clients are let in (a request that came meanwhile waits for it)."""
    import uvicorn

    driver = endpoint.driver
    loop = asyncio.get_running_loop()
    pacing: list[asyncio.Task] = []

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        try:
            yield
        finally:
            driver.stop(STOPPED)
            for task in pacing:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's, without raising the signal again once served (uvicorn >= 0.29 does, so
            that the default handler runs: asyncio's would raise KeyboardInterrupt before the
            run directory is written)."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame) -> None:  # Ctrl-C, SIGTERM
            # the streams end (their requests failed) before uvicorn waits for connections to close;
            # on the loop's thread, between two of its callbacks, never inside the simulation
            loop.call_soon_threadsafe(driver.stop, STOPPED)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(endpoint.app(lifespan), host=o.host, port=o.port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=5, access_log=False,
                            http=arrival_stamping_protocol(driver.clock))
    server = Server(config)

    async def open_doors() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        await _warm_up(endpoint, scenario, o, host, port)
        pacing.append(asyncio.create_task(driver.pace()))
        endpoint.open.set()
        if o.on_ready is not None:
            o.on_ready(host, port)
        else:
            print(f"simsrv serve: http://{host}:{port}/v1 (model {endpoint.model!r}, speed {o.speed:g}x); "
                  "Ctrl-C stops and writes the run", flush=True)

    doors = asyncio.create_task(open_doors())
    await server.serve()
    doors.cancel()
    lifespan_ = getattr(server, "lifespan", None)
    if server.force_exit and lifespan_ is not None:
        # a second Ctrl-C (uvicorn's force exit) skips the app's shutdown, and the loop's close
        # would then cancel it mid-wait, logging a traceback: it runs here instead
        await lifespan_.shutdown()


async def _warm_up(endpoint, scenario: Scenario, o: ServeOptions, host: str, port: int) -> None:
    """A streamed completion through the server to a throwaway copy of the deployment: what a
    first request would otherwise pay in wall time while its simulated clock runs (the HTTP
    stack's and the cost model's first calls: ~85 ms on a 2-core machine) is paid before
    simulated time 0. It carries ``WARM_UP_HEADER`` past the closed doors."""
    real = endpoint.driver
    warm = Driver(LiveView(scenario), MAX_SPEED, o.max_waiting)  # (its timing is not the point: at once)
    endpoint.driver = warm
    task = asyncio.create_task(warm.pace())
    body = json.dumps({"model": endpoint.model, "prompt": "warm up", "max_tokens": 2, "stream": True}).encode()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"{WARM_UP_HEADER}: 1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        await asyncio.wait_for(reader.read(), timeout=30)
        writer.close()
    finally:
        warm.stop(STOPPED)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        endpoint.driver = real
        endpoint.num_requests = 0


def _write(live: "LiveView", driver: Driver, out: Path, stage: Path) -> None:
    """The run directory: the run so far (requests in flight failed), its arrivals, a scenario replaying them."""
    from dataclasses import replace

    from sim.metrics.summary import summarize
    from sim.output import write_run

    result = live.finish(STOPPED)
    arrivals = stage / "arrivals.parquet"
    write_arrivals(arrivals, *live.recorded())
    result = replace(result, scenario=replay_scenario(result.scenario, out / "arrivals.parquet"))
    summary = summarize(result)
    write_run(result, summary, stage)
    print(f"simsrv serve: {summary['completed']:,} requests completed, {summary['failed']:,} failed"
          + (f", {summary['simsrv_rejected']:,} rejected (429)" if summary.get("simsrv_rejected") else "")
          + (f", {summary['simsrv_aborted']:,} aborted (client gone)" if summary.get("simsrv_aborted") else "")
          + f"; wrote {out}/",
          flush=True)
