"""``vllm bench serve`` (vLLM's own benchmark client) against ``simsrv serve``, and the same
requests replayed by ``simsrv run``: do the percentiles the client reports match the
simulation's? (issue 41; figures in bench/README.md, "simsrv serve").

    python bench/serve_vllm_bench.py --vllm /work/venv-vllm34/bin/vllm [--num-prompts 200] [--rate 4]

Needs vLLM's CLI in some environment (``--vllm``: its ``vllm`` executable; on a machine
without a GPU, vLLM >= 0.34 runs ``bench serve`` as is; see ../shared/clients/README.md).
The tokenizer question: ``--dataset-name random`` draws token ids and decodes them with the
tokenizer given; this script writes a word-level tokenizer (tokens ``w0`` .. ``w4999``,
joined by spaces; the ``tokenizers`` package), so a prompt of N tokens is N words, which
simsrv serve's count (one token per word, sim/serve/tokens.py) reads back exactly; vLLM
0.34's client also takes ``usage.prompt_tokens`` from the server. The server runs at speed 1
(real time). After the client ends, the server is stopped (SIGINT) and its run directory's
``scenario.resolved.yaml`` (the recorded arrivals) is run by ``simsrv run``; the table gives
each percentile from both and their difference.

``--floor``: the same ``vllm bench serve`` run against bench/serve_clients.py's echo server
(the same HTTP stack, no simulation: the first chunk as soon as the request is read, then one
token every ``--itl-ms``); the TTFT it reports is the floor that the machine's loopback, the
event loops and the client's own work leave on any server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
        "mean_itl_ms", "median_itl_ms", "p99_itl_ms")


def word_tokenizer(d: Path, vocab_size: int = 5000) -> Path:
    """(Run by the vLLM environment's interpreter, which has ``tokenizers``: ``--make-tokenizer``.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    vocab["[UNK]"] = vocab_size
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # (joins the words with spaces)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                         "unk_token": "[UNK]", "model_max_length": 8192}))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size + 1,
                                               "max_position_embeddings": 8192}))
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", required=True, help="the vllm executable")
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "chat.yaml"))
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--floor", action="store_true", help="against the echo server instead (module docstring)")
    ap.add_argument("--itl-ms", type=float, default=7.1, help="--floor: the echo server's gap between tokens")
    ap.add_argument("--make-tokenizer", help=argparse.SUPPRESS)  # (internal: write the tokenizer there)
    args = ap.parse_args()
    if args.make_tokenizer:
        word_tokenizer(Path(args.make_tokenizer))
        return
    work = Path(tempfile.mkdtemp(prefix="serve_vllm_bench_"))
    tok = work / "tokenizer"
    # the vLLM environment's interpreter (beside its vllm executable) has the tokenizers package
    subprocess.run([str(Path(args.vllm).parent / "python"), __file__, "--vllm", args.vllm, "--make-tokenizer",
                    str(tok)], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if args.floor:
        cmd = [sys.executable, str(ROOT / "bench" / "serve_clients.py"), "echo", "--itl-ms", str(args.itl_ms)]
    else:
        cmd = [sys.executable, "-m", "sim", "serve", args.scenario, "--port", "0", "--out", str(work / "served")]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    base = "http://" + server.stdout.readline().split("http://", 1)[1].split()[0].removesuffix("/v1")
    bench_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([args.vllm, "bench", "serve", "--backend", "openai", "--base-url", base, "--model", "llama-3-8b",
                    "--tokenizer", str(tok), "--dataset-name", "random", "--random-input-len", str(args.input_len),
                    "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
                    "--request-rate", str(args.rate), "--ignore-eos", "--seed", "0", "--save-result",
                    "--result-dir", str(work), "--result-filename", "bench.json"],
                   check=True, env=bench_env, stdout=subprocess.DEVNULL)
    server.send_signal(signal.SIGINT)
    server.communicate(timeout=120)
    if args.floor:
        client = json.loads((work / "bench.json").read_text())
        print(f"floor: vllm bench serve against the echo server, {args.num_prompts} prompts at {args.rate:g} req/s, "
              f"{args.output_len} tokens {args.itl_ms:g} ms apart; completed {client['completed']}")
        for k in KEYS:
            print(f"{k:<16} {client[k]:>9.2f}")
        return
    subprocess.run([sys.executable, "-m", "sim", "run", str(work / "served" / "scenario.resolved.yaml"), "--out",
                    str(work / "replay"), "-q"], check=True, env=env)
    client = json.loads((work / "bench.json").read_text())
    sim = json.loads((work / "replay" / "result.json").read_text())
    print(f"vllm bench serve {args.num_prompts} prompts at {args.rate:g} req/s, {args.input_len} in / "
          f"{args.output_len} out; completed: client {client['completed']}, simulation {sim['completed']}")
    print(f"{'metric':<16} {'client':>9} {'simsrv run':>10} {'diff':>8}")
    for k in KEYS:
        print(f"{k:<16} {client[k]:>9.2f} {sim[k]:>10.2f} {(client[k] / sim[k] - 1) * 100:>+7.1f}%")
    print(f"(files in {work})")


if __name__ == "__main__":
    main()
