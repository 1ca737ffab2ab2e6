"""Writes the hand-made schema examples in this folder (not real traffic), seeded.

Run from this folder: python make_schema_examples.py. The real-row samples
(azure_code_2023_first500.csv, mooncake_synthetic_first500.jsonl, vidur_splitwise_conv_first500.csv)
are `head` cuts of the public files named in ../README.md, not made here.
"""
import json

import numpy as np

rng = np.random.default_rng(7)
# Azure 2024 (DynamoLLM) schema: TIMESTAMP with +00:00, ContextTokens, GeneratedTokens
t = np.cumsum(rng.exponential(0.4, 40)); t -= t[0]
with open("azure_2024_schema_example.csv", "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for x in t:
        us = int(round(x * 1e6)) + 9930
        s, frac = divmod(us, 10**6)
        f.write(f"2024-05-10 00:{s//60:02d}:{s%60:02d}.{frac:06d}+00:00,{int(rng.lognormal(7, 1))+1},{int(rng.lognormal(5, 0.8))+1}\n")
# BurstGPT schema: Timestamp (s from 0:00 of day 1), Model, Request tokens, Response tokens, Total tokens, Log Type
with open("burstgpt_schema_example.csv", "w") as f:
    f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
    ts = 5
    for i in range(40):
        ts += int(rng.integers(0, 4))
        m = "ChatGPT" if rng.random() < 0.8 else "GPT-4"
        req = int(rng.lognormal(6, 1)) + 1
        resp = 0 if i in (7, 23) else int(rng.lognormal(5, 1)) + 1
        f.write(f"{ts},{m},{req},{resp},{req+resp},{'Conversation log' if rng.random() < 0.7 else 'API log'}\n")
# Qwen Bailian schema: chat_id, parent_chat_id, timestamp (s), input_length, output_length, type, turn, hash_ids (16 tokens)
with open("bailian_schema_example.jsonl", "w") as f:
    nid, chats, t = 0, {}, 0.0
    for i in range(30):
        t += float(rng.exponential(0.5))
        if chats and rng.random() < 0.4:
            parent = int(rng.choice(list(chats)))
            pin, pout, pids = chats.pop(parent)
            inp = pin + pout + int(rng.integers(10, 60))
            keep = pids[: pin // 16]
            turn = 2
        else:
            parent, inp, keep, turn = -1, int(rng.integers(40, 400)), [], 1
        nblocks = -(-inp // 16)
        ids = list(keep) + list(range(nid, nid + nblocks - len(keep)))
        nid += nblocks - len(keep)
        out = int(rng.integers(5, 200))
        chats[i] = (inp, out, ids)
        f.write(json.dumps({"chat_id": i, "parent_chat_id": parent, "timestamp": round(t, 3), "input_length": inp,
                            "output_length": out, "type": "text", "turn": turn, "hash_ids": ids}) + "\n")
# vLLM bench --save-detailed JSON (subset of keys)
n = 12
st = 1000.0 + np.cumsum(rng.exponential(0.25, n))
inl = rng.integers(100, 900, n).tolist(); outl = rng.integers(20, 120, n).tolist(); outl[5] = 0
ttft = (0.03 + rng.random(n) * 0.05).round(4).tolist(); ttft[5] = 0.0
itls = [[round(0.012 + 0.002 * rng.random(), 5) for _ in range(max(o - 1, 0))] for o in outl]
lat = [round(a + sum(b), 5) for a, b in zip(ttft, itls)]
errors = [""] * n; errors[5] = "Bad Request: prompt too long"
json.dump({"date": "20250101-000000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
           "num_prompts": n, "request_rate": 4.0, "burstiness": 1.0, "completed": n - 1, "failed": 1,
           "input_lens": inl, "output_lens": outl, "ttfts": ttft, "itls": itls, "latencies": lat,
           "start_times": st.round(6).tolist(), "errors": errors}, open("vllm_bench_schema_example.json", "w"), indent=1)
# AIPerf profile_export.jsonl
with open("aiperf_schema_example.jsonl", "w") as f:
    t0 = 1759813207532900363
    for i in range(12):
        start = t0 + int(i * 2.5e8 + rng.integers(0, 5e7))
        isl, osl = int(rng.integers(200, 800)), int(rng.integers(10, 100))
        ttft_ms = float(20 + rng.random() * 40); lat_ms = ttft_ms + osl * 5.2
        if i == 8:
            rec = {"metadata": {"session_num": i, "x_request_id": f"r{i}", "x_correlation_id": f"s{i}", "conversation_id": f"c{i}",
                                "turn_index": 0, "request_start_ns": start, "request_ack_ns": None, "request_end_ns": start + 600000,
                                "benchmark_phase": "profiling", "was_cancelled": True, "cancellation_time_ns": start + 600000},
                   "metrics": {"error_isl": {"value": isl, "unit": "tokens"}},
                   "error": {"code": 499, "type": "RequestCancellationError", "message": "Request was cancelled"}}
        else:
            rec = {"metadata": {"session_num": i, "x_request_id": f"r{i}", "x_correlation_id": f"s{i}", "conversation_id": f"c{i}",
                                "turn_index": 0, "request_start_ns": start, "request_ack_ns": start + int(ttft_ms * 1e6),
                                "request_end_ns": start + int(lat_ms * 1e6), "benchmark_phase": "profiling", "was_cancelled": False,
                                "cancellation_time_ns": None},
                   "metrics": {"input_sequence_length": {"value": isl, "unit": "tokens"},
                               "time_to_first_token": {"value": round(ttft_ms, 4), "unit": "ms"},
                               "request_latency": {"value": round(lat_ms, 4), "unit": "ms"},
                               "output_sequence_length": {"value": osl, "unit": "tokens"}},
                   "error": None}
        f.write(json.dumps(rec) + "\n")
# generic CSV: named columns, milliseconds
with open("generic_ms_example.csv", "w") as f:
    f.write("req,sent_ms,prompt_len,completion_len\n")
    t = 0
    for i in range(20):
        t += int(rng.integers(0, 400))
        f.write(f"q{i},{t},{int(rng.integers(50, 2000))},{int(rng.integers(1, 300))}\n")
