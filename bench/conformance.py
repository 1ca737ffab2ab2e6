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

Cases: see CASES and FAMILIES below (a family runs as NAME@SEED).
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the versions pinned by the `conformance` and `conformance-latest` extras (pyproject.toml)
PINNED_VERSIONS = ("0.11.0", "0.34.0")
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
    policy: str = "chunked"         # chunked | continuous (vLLM V1 with enable_chunked_prefill=False)
    max_model_len: int = 65536      # continuous: vLLM requires max_num_batched_tokens >= max_model_len
    # (arrival step, prompt tokens, output tokens, hash ids or None), by request id
    requests: list = field(default_factory=list)
    scheduling_policy: str = "fcfs"  # fcfs | priority (vLLM's --scheduling-policy)
    priorities: list = field(default_factory=list)  # by request id, under "priority" (lower first)


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


def _multi_turn(seed: int, name: str = "multi_turn", num_blocks: int = 3000, start_gap: float = 25.0,
                closed: bool = True, think: float = 100.0) -> Case:
    """60 sessions of 2-5 turns; a turn's prompt repeats the previous prompt and answer. Closed
    loop: the next turn comes after the answer (a client waits for it), then a think time. Open
    loop (``closed`` False, the multi-turn generator's own rule): it comes ``think`` steps on
    average after the previous turn, often while that answer is still being generated, so its
    lookup sees the answer's blocks filled so far."""
    import numpy as np

    from sim.workload.sessions import session_requests

    rng = np.random.default_rng(seed)
    num_sessions = 60
    turns = rng.integers(2, 6, num_sessions)
    total = int(turns.sum())
    start = np.cumsum(rng.exponential(start_gap, num_sessions))
    new = rng.integers(50, 400, total)
    out = rng.integers(20, 200, total)
    if closed:
        gaps = np.concatenate([[0], out[:-1]]) + 100 + rng.exponential(think, total)
    else:
        gaps = rng.exponential(think, total)
    arrival, inp, outp, hashes, _ = session_requests(start, turns, new, out, gaps, BLOCK_SIZE)
    order = np.argsort(arrival, kind="stable")
    reqs = [(int(arrival[i]), int(inp[i]), int(outp[i]), hashes[i]) for i in order]
    return Case(name, num_blocks=num_blocks, max_num_seqs=64, max_num_batched_tokens=2048, requests=reqs)


def _prefix_cap(seed: int, name: str, num_blocks: int) -> Case:
    """Prompts that are prefixes of 30 shared documents, their lengths k x 16 - 1, k x 16 or
    k x 16 + 1 tokens: a prompt wholly cached hits at most (prompt - 1) // 16 blocks (vLLM
    ``get_computed_blocks``: the last token is always computed, and a hit is whole blocks), so
    a block-aligned prompt recomputes its whole last block. Under KV pressure, a preempted
    request's hit is capped at prompt + generated - 1."""
    rng = random.Random(seed)
    steps = _poisson_steps(rng, 300, 0.2)
    reqs = []
    for s in steps:
        doc = rng.randrange(30)
        length = max(1, rng.randint(1, 64) * BLOCK_SIZE + rng.choice((-1, 0, 1)))
        ids = [doc * 1000 + j for j in range(-(-length // BLOCK_SIZE))]
        reqs.append((s, length, rng.randint(10, 100), ids))
    return Case(name, num_blocks=num_blocks, max_num_seqs=64, max_num_batched_tokens=2048, requests=reqs)


def _arrival_time(case: Case, rid: int) -> float:
    """A request's arrival time on both sides: its step, plus a sub-step offset by request id so
    that no two requests tie (live requests never tie on ``time.time()``; vLLM breaks a tie by the
    request id's string order, simsrv by its integer order)."""
    return case.requests[rid][0] + rid * 1e-6


def _priority_case(seed: int, name: str, num_blocks: int, policy: str = "chunked", **kw) -> Case:
    """Three priority classes (0, 1, 2: a lower value first) under KV pressure: the waiting queue
    in (priority, arrival) order, the lowest-priority running request preempted first (vLLM V1
    ``Scheduler.schedule`` under ``--scheduling-policy priority``)."""
    rng = random.Random(seed)
    steps = _poisson_steps(rng, 300, 0.3)
    reqs = [(s, rng.randint(100, 1200), rng.randint(50, 400), None) for s in steps]
    prios = [rng.choice((0, 1, 1, 2, 2, 2)) for _ in reqs]
    return Case(name, num_blocks=num_blocks, max_num_seqs=64, max_num_batched_tokens=2048, requests=reqs,
                scheduling_policy="priority", priorities=prios, policy=policy, **kw)


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
        # multi-turn, open loop: a turn looks up an answer still being generated (its blocks
        # published as they fill), under KV pressure (evictions, preemptions)
        "multi_turn_open": lambda: _multi_turn(21, "multi_turn_open", num_blocks=900, start_gap=8.0, closed=False,
                                               think=40.0),
        "max_num_seqs": lambda: _simple("max_num_seqs", 5, 300, 0.5, u(20, 300), u(50, 200),
                                num_blocks=4000, max_num_seqs=8, max_num_batched_tokens=2048),
        "budget_small": lambda: _simple("budget_small", 6, 200, 0.05, u(50, 1500), u(20, 200),
                                num_blocks=4000, max_num_seqs=64, max_num_batched_tokens=96),
        # token budget: decodes alone fill it (budget = max_num_seqs); running prompts share what
        # is left after the decodes, in admission order; threshold chunks under a budget that is
        # not a multiple of it
        "budget_tight": lambda: _simple("budget_tight", 12, 150, 0.05, u(20, 300), u(20, 100),
                                num_blocks=4000, max_num_seqs=32, max_num_batched_tokens=32),
        "budget_threshold": lambda: _simple("budget_threshold", 13, 300, 0.15, u(100, 1500), u(20, 200),
                                    num_blocks=3000, max_num_seqs=64, max_num_batched_tokens=250,
                                    long_prefill_token_threshold=100),
        "budget_large": lambda: _simple("budget_large", 7, 300, 0.3, u(500, 6000), u(20, 200),
                                num_blocks=6000, max_num_seqs=128, max_num_batched_tokens=16384),
        # prefix-hit caps: whole-block hits, never the last token
        "prefix_cap": lambda: _prefix_cap(14, "prefix_cap", num_blocks=4000),
        "prefix_cap_pressure": lambda: _prefix_cap(15, "prefix_cap_pressure", num_blocks=300),
        # continuous: vLLM V1 with enable_chunked_prefill=False (whole prompts; one that does not
        # fit the budget left is skipped: 0.11; or stops admission: 0.34)
        "continuous_kv_pressure": lambda: _simple("continuous_kv_pressure", 2, 300, 0.3, u(200, 1200), u(100, 400),
                                                  num_blocks=500, max_num_seqs=128, max_num_batched_tokens=2048,
                                                  policy="continuous", max_model_len=2048),
        "continuous_budget": lambda: _simple("continuous_budget", 16, 300, 0.4, u(100, 700), u(20, 200),
                                             num_blocks=2000, max_num_seqs=64, max_num_batched_tokens=1024,
                                             policy="continuous", max_model_len=1024),
        "continuous_chat": lambda: _simple("continuous_chat", 1, 400, 0.08, u(50, 1500), u(20, 300),
                                           num_blocks=4000, max_num_seqs=128, max_num_batched_tokens=2048,
                                           policy="continuous", max_model_len=2048),
        # --scheduling-policy priority: the waiting heap, prepending skipped requests and the
        # preemption victim by (priority, arrival)
        "priority_kv_pressure": lambda: _priority_case(17, "priority_kv_pressure", num_blocks=500),
        "priority_no_pressure": lambda: _priority_case(18, "priority_no_pressure", num_blocks=6000),
        "priority_continuous": lambda: _priority_case(19, "priority_continuous", num_blocks=500,
                                                      policy="continuous", max_model_len=2048),
}
# seeded families: NAME@SEED builds the case NAME with another seed (--seeds runs several)
FAMILIES = {
    "multi_turn_pressure": lambda seed: _multi_turn(seed, f"multi_turn_pressure@{seed}", num_blocks=700, start_gap=8.0),
    "multi_turn_open": lambda seed: _multi_turn(seed, f"multi_turn_open@{seed}", num_blocks=900, start_gap=8.0,
                                                closed=False, think=40.0),
    "prefix_cap_pressure": lambda seed: _prefix_cap(seed, f"prefix_cap_pressure@{seed}", num_blocks=300),
    "budget_small": lambda seed: _simple(f"budget_small@{seed}", seed, 200, 0.05, u(50, 1500), u(20, 200),
                                         num_blocks=4000, max_num_seqs=64, max_num_batched_tokens=96),
    "continuous_kv_pressure": lambda seed: _simple(f"continuous_kv_pressure@{seed}", seed, 300, 0.3, u(200, 1200),
                                                   u(100, 400), num_blocks=500, max_num_seqs=128,
                                                   max_num_batched_tokens=2048, policy="continuous",
                                                   max_model_len=2048),
}


# the seeded cases of a full run (beside CASES): the open-loop multi-turn case on 7 seeds (issue
# 37: 5 of 7 diverged before generated blocks were published as they fill), the others on 1-2
SEEDED = [f"multi_turn_open@{k}" for k in range(1, 8)] + [
    "multi_turn_pressure@1", "multi_turn_pressure@2", "prefix_cap_pressure@16", "prefix_cap_pressure@17",
    "budget_small@16", "continuous_kv_pressure@3"]


def build_case(name: str) -> Case:
    """``CASES[name]()``, or ``FAMILIES[family](seed)`` for ``family@seed``."""
    if "@" in name:
        family, seed = name.split("@", 1)
        return FAMILIES[family](int(seed))
    return CASES[name]()




# -- token content: equal hash-id chains <=> equal tokens ------------------------------------------
def _described(prompt: int, out: int, hashes) -> int:
    """Tokens whose content the hash ids give (simsrv ``prefix_keys``): the prompt, or prompt and
    answer when there are more ids than the prompt needs (a multi-turn answer the next turn
    repeats); tokens past them are the request's own."""
    if hashes is None:
        return 0
    return prompt + out if len(hashes) > -(-prompt // BLOCK_SIZE) else prompt


def _token(rid: int, hashes, pos: int, described: int) -> int:
    if hashes is not None and pos < min(len(hashes) * BLOCK_SIZE, described):
        return 1 + int(hashes[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
    return 1_000_000_000 + rid * 1_000_000 + pos  # content of this request only


# -- vLLM's side ----------------------------------------------------------------------------------
def _vllm_version() -> str:
    import vllm

    return vllm.__version__


@functools.lru_cache(maxsize=None)
def _legacy() -> bool:
    """vLLM 0.11's constructors (positional specs, a swap space, ``eos_token_id``); 0.34 otherwise."""
    try:
        return tuple(int(x) for x in _vllm_version().split(".")[:2]) < (0, 12)
    except (ImportError, ValueError):
        return True


def _vllm_sha256():
    try:
        from vllm.utils.hashing import sha256  # 0.34
    except ImportError:
        from vllm.utils import sha256  # 0.11
    return sha256


class VllmSide:
    def __init__(self, case: Case, model_dir: str):
        import torch
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        sha256 = _vllm_sha256()
        chunked = case.policy == "chunked"
        mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", max_model_len=case.max_model_len)
        sc_args = dict(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                       max_model_len=case.max_model_len, enable_chunked_prefill=chunked,
                       long_prefill_token_threshold=case.long_prefill_token_threshold,
                       policy=case.scheduling_policy)
        if not _legacy():  # 0.34: async scheduling is on by default; this harness plays the synchronous loop
            sc_args.update(async_scheduling=False, is_encoder_decoder=False)
        sc = SchedulerConfig(**sc_args)
        cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
                         enable_prefix_caching=case.prefix_caching) if _legacy() else \
            CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                        enable_prefix_caching=case.prefix_caching)
        vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, device_config=DeviceConfig(device="cpu"))
        n = case.num_blocks + 1  # vLLM's block pool keeps block 0 as its null block
        spec = FullAttentionSpec(BLOCK_SIZE, 1, 1, torch.float16, False) if _legacy() else \
            FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16)
        kvc = KVCacheConfig(num_blocks=n, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        cc.num_gpu_blocks = n
        kw = {} if _legacy() else {"block_size": BLOCK_SIZE}
        self.sched = Scheduler(vllm_config=vc, kv_cache_config=kvc,
                               structured_output_manager=StructuredOutputManager(vc), log_stats=False, **kw)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.case = case
        self.reqs = {}
        self.num_preemptions = 0

    def add(self, rid: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        _, prompt, out, hashes = self.case.requests[rid]
        kw = {"eos_token_id": None} if _legacy() else {}
        r = Request(request_id=str(rid), prompt_token_ids=[_token(rid, hashes, p, _described(prompt, out, hashes)) for p in range(prompt)],
                    sampling_params=SamplingParams(max_tokens=out, ignore_eos=True), pooling_params=None,
                    block_hasher=self.hasher, arrival_time=_arrival_time(self.case, rid),
                    priority=self.case.priorities[rid] if self.case.priorities else 0, **kw)
        self.reqs[rid] = r
        self.sched.add_request(r)

    def step(self):
        import dataclasses

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
                _, prompt, output, hashes = self.case.requests[rid]
                sampled.append([_token(rid, hashes, r.num_tokens, _described(prompt, output, hashes))])
            else:
                sampled.append([])
        fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
        args = {"req_ids": ids, "req_id_to_index": {k: i for i, k in enumerate(ids)}, "sampled_token_ids": sampled,
                "logprobs": None, "prompt_logprobs_dict": {}, "pooler_output": []}
        mro = ModelRunnerOutput(**{k: v for k, v in args.items() if k in fields})
        self.sched.update_from_output(out, mro)
        return tokens, preempted

    def busy(self) -> bool:
        return bool(self.sched.waiting or self.sched.running)


# -- simsrv's side --------------------------------------------------------------------------------
class SimSide:
    def __init__(self, case: Case, profile: str):
        from sim.core.kv import KVBlockManager
        from sim.policies.base import EngineLimits
        import sim.policies.chunked, sim.policies.continuous  # noqa: F401  (register the policies)
        from sim.policies.registry import get_policy

        limits = EngineLimits(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                              max_model_len=case.max_model_len,
                              long_prefill_token_threshold=case.long_prefill_token_threshold, max_run_steps=1,
                              scheduling_policy=case.scheduling_policy, **_profile_limits(profile))
        cls = get_policy(case.policy).scheduler
        kv = KVBlockManager(case.num_blocks, BLOCK_SIZE, case.prefix_caching,
                            uncached_to_head=limits.vllm_release == "0.34")
        self.sched = cls(limits, kv)
        self.case = case

    def add(self, rid: int, step: int) -> None:
        import numpy as np

        from sim.core.request import Request

        _, prompt, out, hashes = self.case.requests[rid]
        r = Request(rid, _arrival_time(self.case, rid), prompt, out,
                    priority=self.case.priorities[rid] if self.case.priorities else 0)
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


def _profile_limits(profile: str) -> dict:
    """simsrv's engine rules for a vLLM version: the EngineLimits fields its engine profile sets."""
    from sim.cost.engine_profile import get_profile

    return {"vllm_release": get_profile(profile).vllm_release}


def sim_profile(version: str) -> str:
    """The simsrv engine profile that models vLLM ``version`` (sim/catalog/engine_profiles.yaml)."""
    return "vllm-v1" if _legacy() else "vllm-v1-0.34"


def run_case(case: Case, model_dir: str, max_steps: int = 200_000) -> dict:
    v, s = VllmSide(case, model_dir), SimSide(case, sim_profile(_vllm_version()))
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
    names = argv or list(CASES) + SEEDED
    model_dir = _model_dir()
    results = []
    for name in names:
        r = run_case(build_case(name), model_dir)
        results.append(r)
        print(f"{r['case']:>13}: {r['identical']}/{r['steps']} identical steps ({100 * r['fraction']:.2f}%), "
              f"preemptions vllm {r['preemptions_vllm']} simsrv {r['preemptions_simsrv']}"
              + (f"; first difference {json.dumps(r['first_difference'])}" if r["first_difference"] else ""),
              flush=True)
    if out_path:  # one entry per vLLM version, kept beside the other version's
        path = Path(out_path)
        runs = json.loads(path.read_text()).get("runs", {}) if path.exists() else {}
        runs[_vllm_version()] = {"profile": sim_profile(_vllm_version()), "results": results}
        path.write_text(json.dumps({"runs": dict(sorted(runs.items()))}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
