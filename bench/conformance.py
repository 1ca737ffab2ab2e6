"""Step-by-step conformance of simsrv's scheduler with vLLM V1's own ``Scheduler``.

Why: simsrv claims vLLM V1's scheduling semantics; this measures it. The same requests go
through vLLM's ``vllm.v1.core.sched.scheduler.Scheduler`` (with its KVCacheManager; no GPU, no
network: the model config is a local config.json written here) and through simsrv's
``ChunkedScheduler``. This script plays the model executor for vLLM: each step every scheduled
request that completes its prompt, or decodes, samples one token; a request finishes at its
output length. Each step's schedule (tokens per request, requests preempted) is compared; the
report gives the fraction of identical steps and the first difference.

Run it with an interpreter that has vLLM (``pip install -e '.[conformance]'``, or a separate
venv: see bench/README.md), from the repository root::

    python bench/conformance.py [CASE ...] [--json OUT]

Cases: chat, kv_pressure, long_prefill, multi_turn, multi_turn_pressure, kv_pressure_no_caching,
long_context, long_context_no_caching, max_num_seqs, budget_small, budget_large.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VLLM_VERSION = "0.11.0"  # the version pinned by the `conformance` extra (pyproject.toml)
BLOCK_SIZE = 16
MAX_MODEL_LEN = 65536


@dataclass
class Case:
    name: str
    num_blocks: int                 # usable KV blocks (vLLM gets one more: its null block)
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0
    prefix_caching: bool = True
    # (arrival step, prompt tokens, output tokens, hash ids or None), by request id
    requests: list = field(default_factory=list)


def _poisson_steps(rng: random.Random, n: int, per_step: float) -> list[int]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(per_step)
        out.append(int(t))
    return out


def _simple(name, seed, n, rate, prompt, output, **kw) -> Case:
    rng = random.Random(seed)
    steps = _poisson_steps(rng, n, rate)
    reqs = [(s, prompt(rng), output(rng), None) for s in steps]
    return Case(name, requests=reqs, **kw)


def _multi_turn(seed: int, name: str = "multi_turn", num_blocks: int = 3000, start_gap: float = 25.0) -> Case:
    import numpy as np

    from sim.workload.sessions import session_requests

    rng = np.random.default_rng(seed)
    num_sessions = 60
    turns = rng.integers(2, 6, num_sessions)
    total = int(turns.sum())
    start = np.cumsum(rng.exponential(start_gap, num_sessions))
    new = rng.integers(50, 400, total)
    out = rng.integers(20, 200, total)
    # the next turn comes after the answer (a client waits for it), then a think time
    gaps = np.concatenate([[0], out[:-1]]) + 100 + rng.exponential(100.0, total)
    arrival, inp, outp, hashes, _ = session_requests(start, turns, new, out, gaps, BLOCK_SIZE)
    order = np.argsort(arrival, kind="stable")
    reqs = [(int(arrival[i]), int(inp[i]), int(outp[i]), hashes[i]) for i in order]
    return Case(name, num_blocks=num_blocks, max_num_seqs=64, max_num_batched_tokens=2048, requests=reqs)


def _u(lo: int, hi: int):
    return lambda rng: rng.randint(lo, hi)


def _mix(rng: random.Random) -> int:  # 20% long prompts
    return rng.randint(3000, 6000) if rng.random() < 0.2 else rng.randint(50, 400)


u, mix = _u, _mix
CASES = {  # name -> builder (built on demand)
        "chat": lambda: _simple("chat", 1, 500, 0.08, u(50, 2000), u(20, 300),
                        num_blocks=4000, max_num_seqs=128, max_num_batched_tokens=2048),
        "kv_pressure": lambda: _simple("kv_pressure", 2, 300, 0.3, u(200, 1200), u(100, 400),
                               num_blocks=500, max_num_seqs=128, max_num_batched_tokens=2048),
        "long_prefill": lambda: _simple("long_prefill", 3, 300, 0.1, mix, u(50, 200),
                                num_blocks=3000, max_num_seqs=64, max_num_batched_tokens=1024,
                                long_prefill_token_threshold=256),
        "multi_turn": lambda: _multi_turn(4),
        # evictions and preemptions with prefix caching: the free queue's order decides hits
        "multi_turn_pressure": lambda: _multi_turn(8, "multi_turn_pressure", num_blocks=700, start_gap=8.0),
        "kv_pressure_no_caching": lambda: _simple("kv_pressure_no_caching", 2, 300, 0.3, u(200, 1200), u(100, 400),
                                                  num_blocks=500, max_num_seqs=128, max_num_batched_tokens=2048,
                                                  prefix_caching=False),
        # scenarios/long_context.yaml scaled down: chunked long prompts thrashing a small KV cache
        "long_context": lambda: _simple("long_context", 9, 200, 0.05, u(2500, 3500), u(300, 500),
                                        num_blocks=1500, max_num_seqs=256, max_num_batched_tokens=2048),
        "long_context_no_caching": lambda: _simple("long_context_no_caching", 9, 200, 0.05, u(2500, 3500),
                                                   u(300, 500), num_blocks=1500, max_num_seqs=256,
                                                   max_num_batched_tokens=2048, prefix_caching=False),
        "max_num_seqs": lambda: _simple("max_num_seqs", 5, 300, 0.5, u(20, 300), u(50, 200),
                                num_blocks=4000, max_num_seqs=8, max_num_batched_tokens=2048),
        "budget_small": lambda: _simple("budget_small", 6, 200, 0.05, u(50, 1500), u(20, 200),
                                num_blocks=4000, max_num_seqs=64, max_num_batched_tokens=96),
        "budget_large": lambda: _simple("budget_large", 7, 300, 0.3, u(500, 6000), u(20, 200),
                                num_blocks=6000, max_num_seqs=128, max_num_batched_tokens=16384),
}


# -- token content: equal hash-id chains <=> equal tokens ------------------------------------------
def _token(rid: int, hashes, pos: int) -> int:
    if hashes is not None and pos < len(hashes) * BLOCK_SIZE:
        return 1 + int(hashes[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
    return 1_000_000_000 + rid * 1_000_000 + pos  # content of this request only


# -- vLLM's side ----------------------------------------------------------------------------------
class VllmSide:
    def __init__(self, case: Case, model_dir: str):
        import torch
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", max_model_len=MAX_MODEL_LEN)
        sc = SchedulerConfig(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                             long_prefill_token_threshold=case.long_prefill_token_threshold)
        cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
                         enable_prefix_caching=case.prefix_caching)
        vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, device_config=DeviceConfig(device="cpu"))
        n = case.num_blocks + 1  # vLLM's block pool keeps block 0 as its null block
        kvc = KVCacheConfig(num_blocks=n, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(BLOCK_SIZE, 1, 1, torch.float16, False))])
        cc.num_gpu_blocks = n
        self.sched = Scheduler(vllm_config=vc, kv_cache_config=kvc,
                               structured_output_manager=StructuredOutputManager(vc), log_stats=False)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.case = case
        self.reqs = {}
        self.num_preemptions = 0

    def add(self, rid: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        _, prompt, out, hashes = self.case.requests[rid]
        r = Request(request_id=str(rid), prompt_token_ids=[_token(rid, hashes, p) for p in range(prompt)],
                    sampling_params=SamplingParams(max_tokens=out, ignore_eos=True), pooling_params=None,
                    eos_token_id=None, block_hasher=self.hasher)
        self.reqs[rid] = r
        self.sched.add_request(r)

    def step(self):
        from vllm.v1.outputs import ModelRunnerOutput

        from vllm.v1.request import RequestStatus

        before = [r for r in self.sched.running]
        out = self.sched.schedule()
        preempted = sorted(int(r.request_id) for r in before if r.status == RequestStatus.PREEMPTED)
        self.num_preemptions += len(preempted)
        tokens = {int(k): v for k, v in out.num_scheduled_tokens.items()}
        ids = [str(k) for k in sorted(tokens)]
        sampled = []
        for rid in sorted(tokens):
            r = self.reqs[rid]
            if r.num_computed_tokens >= r.num_tokens:  # prompt complete, or a decode: one token
                _, _, _, hashes = self.case.requests[rid]
                sampled.append([_token(rid, hashes, r.num_tokens)])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={k: i for i, k in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                pooler_output=[])
        self.sched.update_from_output(out, mro)
        return tokens, preempted

    def busy(self) -> bool:
        return bool(self.sched.waiting or self.sched.running)


# -- simsrv's side --------------------------------------------------------------------------------
class SimSide:
    def __init__(self, case: Case):
        from sim.core.kv import KVBlockManager
        from sim.policies.base import EngineLimits
        from sim.policies.chunked import ChunkedScheduler

        limits = EngineLimits(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                              max_model_len=MAX_MODEL_LEN,
                              long_prefill_token_threshold=case.long_prefill_token_threshold, max_run_steps=1)
        self.sched = ChunkedScheduler(limits, KVBlockManager(case.num_blocks, BLOCK_SIZE, case.prefix_caching))
        self.case = case

    def add(self, rid: int, step: int) -> None:
        import numpy as np

        from sim.core.request import Request

        _, prompt, out, hashes = self.case.requests[rid]
        r = Request(rid, float(step), prompt, out)
        if hashes is not None:
            r.hash_ids, r.hash_block_size = np.asarray(hashes), BLOCK_SIZE
        if not self.sched.add_request(r, float(step)):
            raise SystemExit(f"{self.case.name}: request {rid} rejected by simsrv: {r.fail_reason}")

    def step(self, step: int):
        plan = self.sched.plan_step(float(step))
        tokens = self.sched.scheduled_tokens(plan)
        self.sched.on_step_done(plan, float(step + 1))
        return tokens, sorted(plan.preempted_ids)

    def busy(self) -> bool:
        return bool(self.sched.waiting or self.sched.running)


def _model_dir() -> str:
    d = tempfile.mkdtemp(prefix="simsrv-conformance-")
    # A tiny Llama: only the scheduler reads the config (no weights are loaded).
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 512,
           "vocab_size": 32000, "max_position_embeddings": MAX_MODEL_LEN, "dtype": "float16", "rms_norm_eps": 1e-5}
    Path(d, "config.json").write_text(json.dumps(cfg))
    return d


def run_case(case: Case, model_dir: str, max_steps: int = 200_000) -> dict:
    v, s = VllmSide(case, model_dir), SimSide(case)
    by_step: dict[int, list[int]] = {}
    for rid, (t, *_rest) in enumerate(case.requests):
        by_step.setdefault(t, []).append(rid)
    last_arrival = max(by_step)
    same = total = 0
    first = None
    for step in range(max_steps):
        for rid in by_step.get(step, ()):
            v.add(rid)
            s.add(rid, step)
        if step > last_arrival and not v.busy() and not s.busy():
            break
        vt, vp = v.step()
        st, sp = s.step(step)
        if not vt and not st and not vp and not sp:
            continue  # idle on both sides
        total += 1
        if vt == st and vp == sp:
            same += 1
        elif first is None:
            diff = {k: (vt.get(k), st.get(k)) for k in sorted(set(vt) | set(st)) if vt.get(k) != st.get(k)}
            first = {"step": step, "tokens (vllm, simsrv)": {str(k): d for k, d in list(diff.items())[:12]},
                     "preempted vllm": vp, "preempted simsrv": sp}
    return {"case": case.name, "steps": total, "identical": same,
            "fraction": same / total if total else 1.0, "first_difference": first,
            "requests": len(case.requests),
            "preemptions_vllm": v.num_preemptions,
            "preemptions_simsrv": s.sched.num_preemptions}


def main(argv: list[str]) -> int:
    out_path = None
    if "--json" in argv:
        i = argv.index("--json")
        out_path = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    os.environ.setdefault("PYTHONHASHSEED", "0")
    names = argv or list(CASES)
    model_dir = _model_dir()
    results = []
    for name in names:
        r = run_case(CASES[name](), model_dir)
        results.append(r)
        print(f"{r['case']:>13}: {r['identical']}/{r['steps']} identical steps ({100 * r['fraction']:.2f}%), "
              f"preemptions vllm {r['preemptions_vllm']} simsrv {r['preemptions_simsrv']}"
              + (f"; first difference {json.dumps(r['first_difference'])}" if r["first_difference"] else ""),
              flush=True)
    if out_path:
        Path(out_path).write_text(json.dumps({"vllm": VLLM_VERSION, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
