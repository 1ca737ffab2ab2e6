"""``simsrv serve`` as clients see it: the ``openai`` client against an idle endpoint, and a
load test through the endpoint (issue 41's acceptance; figures in bench/README.md).

    python bench/serve_clients.py idle [--requests 12] [--client openai|raw]
    python bench/serve_clients.py load [--speed 0.5] [--rates 4,8,12,16] [--seconds 30]
    python bench/serve_clients.py idle --floor [--client openai|raw]

``idle``: one request at a time (each after the previous ended, with a pause), prompts from
64 to 4,096 tokens, 64 output tokens; the client's TTFT (send to first chunk) and TPOT (mean
gap over the answer's chunks) against the simulation's figures for the same request
(requests.parquet of the run written at shutdown); the target is |client - simulated| <= 5 ms
+ 2% of the simulated figure. ``load``: an open-loop Poisson client at each offered rate
(simulated req/s; the endpoint runs ``--speed`` times faster than real time, so the client
sends at rate x speed per wall second and its latencies are multiplied by speed), prompts of
2,000 tokens and 256 output tokens; ``/metrics`` is scraped every wall second for the
requests waiting and the KV use; the client's TTFT percentiles in simulated ms.

``--floor``: the same client against ``echo`` (``python bench/serve_clients.py echo``), a
server on the same stack as simsrv serve (uvicorn, uvloop and httptools where installed) that
answers the first chunk as soon as the request's body is read and then one token every
``--itl-ms``: no simulation, no waiting. Its client TTFT is the floor any server on this machine
leaves (the kernel's loopback both ways, the event loops, the client's own HTTP and JSON work);
simsrv serve's offsets are to be read against it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "chat.yaml"


def _env() -> dict[str, str]:
    """This checkout first on the path (and whatever PYTHONPATH held after it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def start(out: Path, speed: float) -> tuple[subprocess.Popen, str]:
    env = _env()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "serve", str(SCENARIO), "--port", "0", "--out", str(out),
                             "--speed", str(speed)], stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    return proc, "http://" + line.split("http://", 1)[1].split()[0].removesuffix("/v1")


def start_echo(itl_ms: float) -> tuple[subprocess.Popen, str]:
    env = _env()
    proc = subprocess.Popen([sys.executable, __file__, "echo", "--itl-ms", str(itl_ms)], stdout=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    return proc, "http://" + line.split("http://", 1)[1].split()[0].removesuffix("/v1")


def echo(args) -> None:
    """A streaming OpenAI-style server that does nothing but answer: the floor (module docstring)."""
    import uvicorn

    from sim.serve.app import event_loop_factory

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                await send({"type": m["type"].replace(".startup", ".startup.complete")
                            .replace(".shutdown", ".shutdown.complete")})
                if m["type"] == "lifespan.shutdown":
                    return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        if scope["method"] == "GET":  # /v1/models
            data = json.dumps({"object": "list", "data": [{"id": "llama-3-8b", "object": "model"}]}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        asked = json.loads(body)
        chat = scope["path"].endswith("/chat/completions")
        n = int(asked.get("max_tokens") or 16)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})

        def event(i: int, text: str) -> bytes:
            if chat:
                delta = {"content": text} if i else {"role": "assistant", "content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
            return f"data: {json.dumps({'id': 'x', 'object': 'x', 'created': 0, 'model': 'llama-3-8b', 'choices': [choice]})}\n\n".encode()

        for i in range(n):
            if i:
                await asyncio.sleep(args.itl_ms / 1e3)
            await send({"type": "http.response.body", "body": event(i, " w"), "more_body": True})
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        tail = f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()
        await send({"type": "http.response.body", "body": tail})

    async def serve() -> None:
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        print(f"echo: http://{host}:{port}/v1", flush=True)
        await task

    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve())  # (until SIGINT: uvicorn raises it again once it has stopped)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)


def words(n: int) -> str:
    """A prompt of exactly n tokens by simsrv serve's count (sim/serve/tokens.py rule 3)."""
    return " ".join(f"w{i % 1000}" for i in range(n))


async def _raw_ask(url: str, model: str, n_prompt: int, n_out: int) -> list[float]:
    """One streamed chat completion over plain asyncio streams (no HTTP library): the times of
    its content chunks from the send."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": words(n_prompt)}],
                       "max_tokens": n_out, "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    writer.write(head + body)
    await writer.drain()
    buf, times = b"", []
    while b"[DONE]" not in buf:
        data = await reader.read(65536)
        if not data:
            break
        now = time.perf_counter()
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if b'"content": " ' in event:  # a token (not the role chunk)
                times.append(now - t0)
    writer.close()
    return times


def idle(args) -> None:
    import polars as pl

    out = Path(tempfile.mkdtemp()) / "idle"
    proc, url = start_echo(7.0) if args.floor else start(out, 1.0)
    lengths = [64 * 2 ** (i % 7) for i in range(args.requests)]  # 64 .. 4,096
    if args.client == "openai":
        import openai

        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        model = client.models.list().data[0].id

        def ask(n_prompt: int, n_out: int) -> list[float]:
            t0 = time.perf_counter()
            times = []
            for ch in client.chat.completions.create(model=model, max_tokens=n_out, stream=True,
                                                     messages=[{"role": "user", "content": words(n_prompt)}]):
                if ch.choices and ch.choices[0].delta.content:
                    times.append(time.perf_counter() - t0)
            return times
    else:  # raw: the server's own share of the client's TTFT, without an HTTP library's
        def ask(n_prompt: int, n_out: int) -> list[float]:
            return asyncio.run(_raw_ask(url, "llama-3-8b", n_prompt, n_out))

    ask(16, 4)  # the client's own first call (its connection, its imports)
    client_rows = []
    for n in lengths:
        time.sleep(0.3)
        t = ask(n, 64)
        client_rows.append((t[0], (t[-1] - t[0]) / (len(t) - 1)))
    stop(proc)
    if args.floor:
        ttfts = sorted(r[0] * 1e3 for r in client_rows)
        print(f"floor ({args.client} client, echo server): TTFT ms median {ttfts[len(ttfts) // 2]:.2f} "
              f"min {ttfts[0]:.2f} max {ttfts[-1]:.2f} over {len(ttfts)} requests")
        return
    sim = pl.read_parquet(out / "requests.parquet").tail(len(lengths))
    print(f"{'prompt':>7} {'sim TTFT':>9} {'client':>8} {'diff':>7} {'sim TPOT':>9} {'client':>8} {'diff':>7}  within 5 ms + 2%")
    worst = 0.0
    for n, (cttft, ctpot), sttft, stpot in zip(lengths, client_rows, sim["ttft_s"], sim["tpot_s"]):
        d1, d2 = (cttft - sttft) * 1e3, (ctpot - stpot) * 1e3
        ok = abs(d1) <= 5 + 0.02 * sttft * 1e3 and abs(d2) <= 5 + 0.02 * stpot * 1e3
        worst = max(worst, abs(d1) - 0.02 * sttft * 1e3, abs(d2) - 0.02 * stpot * 1e3)
        print(f"{n:>7} {sttft * 1e3:>9.2f} {cttft * 1e3:>8.2f} {d1:>+7.2f} {stpot * 1e3:>9.3f} {ctpot * 1e3:>8.3f} "
              f"{d2:>+7.3f}  {'yes' if ok else 'NO'}")
    print(f"largest |client - simulated| beyond 2% of the simulated figure: {worst:.2f} ms (target 5 ms)")


async def _load_rate(url: str, model: str, rate: float, speed: float, seconds: float, seed: int):
    import httpx

    rng = random.Random(seed)
    ttfts: list[float] = []
    samples: list[tuple[float, float]] = []
    prompt = words(2000)

    async def one(c: httpx.AsyncClient) -> None:
        t0 = time.perf_counter()
        body = {"model": model, "prompt": prompt, "max_tokens": 256, "stream": True}
        async with c.stream("POST", url + "/v1/completions", json=body, timeout=None) as r:
            first = True
            async for line in r.aiter_lines():
                if first and line.startswith("data: {"):
                    ttfts.append((time.perf_counter() - t0) * speed)
                    first = False

    async def scrape(c: httpx.AsyncClient, end: float) -> None:
        while time.perf_counter() < end:
            text = (await c.get(url + "/metrics")).text
            waiting = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("vllm:num_requests_waiting{"))
            kv = max(float(l.split()[-1]) for l in text.splitlines() if l.startswith("vllm:kv_cache_usage_perc{"))
            samples.append((waiting, kv))
            await asyncio.sleep(1.0)

    limits = httpx.Limits(max_connections=10_000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(limits=limits) as c:
        end = time.perf_counter() + seconds
        tasks = [asyncio.create_task(scrape(c, end))]
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(one(c)))
            await asyncio.sleep(rng.expovariate(rate * speed))  # rate per simulated second
        await asyncio.gather(*tasks)
    return ttfts, samples


def load(args) -> None:
    import numpy as np

    rates = [float(r) for r in args.rates.split(",")]
    print(f"speed {args.speed:g}x; prompts 2,000 tokens, 256 output tokens; latencies in simulated ms")
    print(f"{'rate req/s':>10} {'requests':>9} {'TTFT p50':>9} {'p99':>9} {'waiting max':>12} {'KV use max':>11}")
    for i, rate in enumerate(rates):
        out = Path(tempfile.mkdtemp()) / f"load{i}"
        proc, url = start(out, args.speed)
        try:
            ttfts, samples = asyncio.run(_load_rate(url, "llama-3-8b", rate, args.speed, args.seconds, i))
        finally:
            stop(proc)
        w = max(s[0] for s in samples)
        kv = max(s[1] for s in samples)
        print(f"{rate:>10g} {len(ttfts):>9} {np.percentile(ttfts, 50) * 1e3:>9.0f} {np.percentile(ttfts, 99) * 1e3:>9.0f} "
              f"{w:>12.0f} {kv:>11.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("idle")
    a.add_argument("--requests", type=int, default=12)
    a.add_argument("--client", choices=("openai", "raw"), default="openai",
                   help="the openai package, or plain asyncio streams (no HTTP library)")
    a.add_argument("--floor", action="store_true", help="against the echo server: the transport floor")
    e = sub.add_parser("echo", help="(the floor's server: prints its URL, serves until stopped)")
    e.add_argument("--itl-ms", type=float, default=7.0)
    b = sub.add_parser("load")
    b.add_argument("--speed", type=float, default=0.5)
    b.add_argument("--rates", default="4,8,12,16")
    b.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    {"idle": idle, "load": load, "echo": echo}[args.what](args)


if __name__ == "__main__":
    main()
