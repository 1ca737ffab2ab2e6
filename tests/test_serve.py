"""``simsrv serve`` driven by real clients: the ``openai`` package streams from it, ``/metrics``
shows vLLM's names, errors are vLLM's, and Ctrl-C writes a run that ``simsrv run`` replays.

The server runs as a user starts it (``python -m sim serve ... --port 0``: a free port,
printed); skipped where the ``serve`` extra or the ``openai`` client is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "chat.yaml"


class Server:
    def __init__(self, tmp: Path, *args: str):
        self.out = tmp / "served"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sim", "serve", str(SCENARIO), "--port", "0", "--out", str(self.out), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
        line = self.proc.stdout.readline()
        if "http://" not in line:
            self.proc.kill()
            raise AssertionError(f"no address printed: {line!r} {self.proc.stderr.read()}")
        self.base = line.split("http://", 1)[1].split()[0]  # host:port/v1
        self.url = "http://" + self.base.removesuffix("/v1")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out + err


@pytest.fixture()
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()


def _model(server: Server) -> str:
    status, text = server.get("/v1/models")
    assert status == 200
    return json.loads(text)["data"][0]["id"]


def test_openai_client_streams_and_the_run_replays(server, tmp_path):
    client = openai.OpenAI(base_url="http://" + server.base, api_key="none")
    model = _model(server)
    assert model == "llama-3-8b"
    # a first, untimed request: the client's own first call (its connection, its lazy imports)
    # costs ~100-200 ms on its side, which no server could hide
    for _ in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                            stream=True, stream_options={"include_usage": True}):
        pass
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "How long is a piece of string? " * 40}],
        max_tokens=48, stream=True, stream_options={"include_usage": True})
    times, text, usage, finish = [], "", None, None
    for ch in stream:
        if ch.choices:
            times.append(time.perf_counter() - t0)
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        elif ch.usage is not None:
            usage = ch.usage
    assert usage.completion_tokens == 48 and usage.prompt_tokens > 200
    assert finish == "length"
    assert len(times) == 48 + 1  # the role chunk, then one chunk per token (vLLM's chat stream)

    done = client.completions.create(model=model, prompt="hello world", max_tokens=5)
    assert done.usage.completion_tokens == 5 and done.choices[0].finish_reason == "length"

    status, metrics = server.get("/metrics")
    assert status == 200
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_sum", "vllm:request_queue_time_seconds_count",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        assert name in metrics, name
    assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="llama-3-8b"} 3.0' in metrics

    rc, log = server.stop()
    assert rc == 0, log
    import polars as pl

    served = pl.read_parquet(server.out / "requests.parquet")
    assert served["status"].to_list() == ["completed"] * 3
    # the client's TTFT and TPOT are the simulation's, plus the HTTP round trip (loose here: a
    # loaded CI machine; bench/serve_clients.py measures the tight figure)
    ttft_ms = served["ttft_s"][1] * 1e3
    tpot_ms = served["tpot_s"][1] * 1e3
    client_ttft_ms = times[0] * 1e3
    client_tpot_ms = (times[-1] - times[1]) / 47 * 1e3  # times[0]: the role chunk, with the first token
    assert ttft_ms <= client_ttft_ms <= ttft_ms * 1.05 + 100
    assert abs(client_tpot_ms - tpot_ms) <= tpot_ms * 0.05 + 5

    replay = tmp_path / "replay"
    subprocess.run([sys.executable, "-m", "sim", "run", str(server.out / "scenario.resolved.yaml"), "--out",
                    str(replay), "-q"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert pl.read_parquet(replay / "requests.parquet").equals(served)


def test_errors_are_vllms(server):
    model = _model(server)
    status, body = server.post("/v1/completions", {"model": model, "prompt": list(range(9000)), "max_tokens": 4})
    assert status == 400 and "maximum context length is 8192 tokens" in body["error"]["message"]
    status, body = server.post("/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    status, body = server.post("/v1/chat/completions", {"model": model, "messages": "x"})
    assert status == 400
    assert server.get("/health")[0] == 200
    assert "simsrv" in server.get("/version")[1]
    rc, _ = server.stop()
    assert rc == 0


def test_shutdown_fails_what_is_in_flight(tmp_path):
    s = Server(tmp_path, "--speed", "0.001")  # a simulated millisecond per wall second: nothing ends
    try:
        import threading

        client = openai.OpenAI(base_url="http://" + s.base, api_key="none", max_retries=0)
        seen = []

        def ask():
            try:
                for ch in client.completions.create(model=_model(s), prompt="a b c", max_tokens=64, stream=True):
                    seen.append(ch)
            except Exception as e:  # the stream ends with an error event
                seen.append(e)

        th = threading.Thread(target=ask)
        th.start()
        time.sleep(1.0)
        rc, log = s.stop()
        th.join(30)
        assert rc == 0, log
        import polars as pl

        req = pl.read_parquet(s.out / "requests.parquet")
        assert req["status"].to_list() == ["failed"]
        assert req["fail_reason"].to_list() == ["in flight when simsrv serve stopped"]
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_a_second_ctrl_c_still_writes_the_run_without_a_traceback(tmp_path):
    # uvicorn's force exit (a second SIGINT) skips the app's shutdown; the loop's close then
    # cancelled it mid-wait and uvicorn logged a traceback (sim/serve/session.py runs it)
    s = Server(tmp_path)
    try:
        time.sleep(1.0)
        s.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        s.proc.send_signal(signal.SIGINT)
        out, err = s.proc.communicate(timeout=60)
        assert s.proc.returncode == 0, out + err
        assert "Traceback" not in out + err, out + err
        assert (s.out / "requests.parquet").exists()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
