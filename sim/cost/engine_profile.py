"""Engine profiles: the host-side (CPU) cost of one engine step, per serving engine.

Why: a step's wall time is its GPU kernels plus what the engine's CPU does around them
(scheduling, input preparation, kernel launches, output processing). That cost differs by an
order of magnitude between engines: a 2023 vLLM with Ray workers pays milliseconds per step
that grow with the batch and with TP ranks (vidur's CPU profile), SGLang and TensorRT-LLM
overlap their scheduler with the GPU (LMSYS SGLang v0.4 blog; TRT-LLM "overlap scheduler"
docs). The figures live in ``sim/catalog/engine_profiles.yaml``, each with its source; a
scenario names one (``engine.profile``) and may override any term (``engine.overhead``).

Model of one step of ``g`` GPU seconds (kernels only, sampler included):
- CPU work ``cpu`` = fixed (prefill-carrying or decode-only step) + per sequence + per extra
  TP rank; with multi-step scheduling (``engine.num_scheduler_steps`` = N, vLLM 0.6) one
  scheduling and input preparation serve N decode steps, so a decode-only step pays that part
  / N (vLLM multi-step RFC, vllm-project/vllm#6854), while every step's output tokens are still
  processed (``output_step`` + ``output_per_seq`` per sequence: vidur's process_model_outputs;
  vllm/engine/output_processor/multi_step.py appends and checks each token);
- kernel launches ``launch`` = layers x per-layer launch time, unless the step replays a
  CUDA graph (decode-only steps of at most ``cuda_graph_max_batch`` sequences); launches are
  asynchronous, so the GPU hides them when its kernels take longer;
- serial engines: ``step = cpu + max(g, launch)``; overlapping engines (the scheduler runs one
  step ahead): ``step = max(g, launch, cpu)``.
The overhead is ``step - g``. NOTE: the CPU terms are host-side and taken as the same on every
GPU (the profile was measured on A100 hosts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from sim.cost.attention_backend import get_backend
from sim.errors import UserError
from sim.catalog.packed import load_catalog

PROFILE_NAMES = ("vllm-v1", "vllm-v1-0.34", "vllm-v0", "sglang", "trt-llm", "custom")
DEFAULT_PROFILE = "vllm-v1"


@dataclass(frozen=True)
class EngineProfile:
    name: str
    prefill_step_s: float
    decode_step_s: float
    per_seq_s: float
    per_extra_tp_rank_s: float
    overlap_cpu: bool
    cuda_graph_decode: bool
    cuda_graph_max_batch: int
    eager_launch_per_layer_s: float
    attention_backend: str
    batch_range: tuple[int, int] | None
    # what ``engine.gpu_memory_utilization`` is a fraction of (sim/spec/memory.py): "total" memory
    # (vLLM, SGLang) or the memory "free" after weights and activations (TensorRT-LLM)
    kv_memory_basis: str = "total"
    basis: str = ""
    sources: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()
    output_step_s: float = 0.0     # the part of the fixed terms processing the step's outputs
    output_per_seq_s: float = 0.0  # the part of per_seq_s doing so
    num_scheduler_steps: int = 1  # decode steps per scheduling (engine.num_scheduler_steps)
    # the vLLM release whose V1 scheduling rules the scheduler follows (EngineLimits.vllm_release):
    # "0.11" (vllm-v1 and the non-vLLM profiles: simsrv's rules before) | "0.34" (vllm-v1-0.34)
    vllm_release: str = "0.11"

    def cpu_s(self, num_seqs: int, has_prefill: bool, tp: int) -> float:
        """Fixed + per-sequence + per-extra-rank CPU seconds of one step; with
        ``num_scheduler_steps`` > 1 a decode-only step pays its share of one scheduling plus its
        own output processing."""
        fixed = self.prefill_step_s if has_prefill else self.decode_step_s
        cpu = fixed + self.per_seq_s * num_seqs + self.per_extra_tp_rank_s * (tp - 1)
        if has_prefill or self.num_scheduler_steps == 1:
            return cpu
        out = min(cpu, self.output_step_s + self.output_per_seq_s * num_seqs)
        return (cpu - out) / self.num_scheduler_steps + out

    def graphed(self, num_seqs: int, has_prefill: bool) -> bool:
        """Whether the step replays a CUDA graph (decode-only, within the captured sizes)."""
        return self.cuda_graph_decode and not has_prefill and num_seqs <= self.cuda_graph_max_batch

    def overhead_s(self, gpu_s: float, num_seqs: int, has_prefill: bool, tp: int, num_layers: int) -> float:
        """Seconds the step takes beyond its ``gpu_s`` of kernels (see the module docstring)."""
        return self.overhead_fn(num_seqs, has_prefill, tp, num_layers)(gpu_s)

    def host_terms(self, num_seqs: int, has_prefill: bool, tp: int, num_layers: int) -> tuple[float, float]:
        """(cpu, launch): the step's CPU work and its kernel launches (the module docstring)."""
        launch = 0.0 if self.graphed(num_seqs, has_prefill) else num_layers * self.eager_launch_per_layer_s
        return self.cpu_s(num_seqs, has_prefill, tp), launch

    def overhead_fn(self, num_seqs: int, has_prefill: bool, tp: int, num_layers: int) -> Callable[[float], float]:
        """``overhead_s`` as a function of the GPU seconds, the host terms fixed by the batch
        computed once (every step of a decode run shares them). NOTE: the cost model's per-step
        path writes this function out (``RooflineCostModel.run_cost``): change both together."""
        cpu, launch = self.host_terms(num_seqs, has_prefill, tp, num_layers)
        if self.overlap_cpu:
            return lambda gpu_s: max(gpu_s, launch, cpu) - gpu_s
        return lambda gpu_s: cpu + max(gpu_s, launch) - gpu_s

    def attributed_s(self, num_seqs: int, has_prefill: bool, tp: int) -> float:
        """The part of a step's time reported as engine overhead when only its total is known
        (TTFT breakdown). NOTE: the largest GPU time consistent with the total is assumed:
        the CPU work for a serial engine, nothing for an overlapping one."""
        return 0.0 if self.overlap_cpu else self.cpu_s(num_seqs, has_prefill, tp)

    def outside_range(self, num_seqs: int) -> bool:
        """True when the per-sequence term is used beyond the batch sizes it was measured at."""
        if self.batch_range is None or self.per_seq_s == 0.0:
            return False
        lo, hi = self.batch_range
        return num_seqs < lo or num_seqs > hi

    def describe(self) -> dict:
        """The resolved profile, in ms, for ``result.json``."""
        return {
            "name": self.name, "prefill_step_ms": self.prefill_step_s * 1e3, "decode_step_ms": self.decode_step_s * 1e3,
            "per_seq_ms": self.per_seq_s * 1e3, "per_extra_tp_rank_ms": self.per_extra_tp_rank_s * 1e3,
            "overlap_cpu": self.overlap_cpu, "cuda_graph_decode": self.cuda_graph_decode,
            "cuda_graph_max_batch": self.cuda_graph_max_batch,
            "eager_launch_per_layer_ms": self.eager_launch_per_layer_s * 1e3,
            "attention_backend": self.attention_backend,
            "batch_range": list(self.batch_range) if self.batch_range else None,
            "kv_memory_basis": self.kv_memory_basis,
            "output_step_ms": self.output_step_s * 1e3, "output_per_seq_ms": self.output_per_seq_s * 1e3,
            "num_scheduler_steps": self.num_scheduler_steps,
            "overridden": list(self.overridden),
        }


# scenario key (ms or plain) -> EngineProfile field
_MS_KEYS = {"prefill_step_ms": "prefill_step_s", "decode_step_ms": "decode_step_s", "per_seq_ms": "per_seq_s",
            "per_extra_tp_rank_ms": "per_extra_tp_rank_s", "eager_launch_per_layer_ms": "eager_launch_per_layer_s",
            "output_step_ms": "output_step_s", "output_per_seq_ms": "output_per_seq_s"}
_PLAIN_KEYS = ("overlap_cpu", "cuda_graph_decode", "cuda_graph_max_batch", "attention_backend", "batch_range")


@lru_cache(maxsize=1)
def _catalog() -> dict:
    return load_catalog("engine_profiles.yaml")


def _from_entry(name: str, d: dict) -> EngineProfile:
    kw = {f: float(d.get(k, 0.0)) / 1e3 for k, f in _MS_KEYS.items()}
    kw.update({k: d[k] for k in _PLAIN_KEYS})
    kw["batch_range"] = tuple(d["batch_range"]) if d["batch_range"] else None
    kw["kv_memory_basis"] = d.get("kv_memory_basis", "total")
    kw["vllm_release"] = str(d.get("vllm_release", "0.11"))
    return EngineProfile(name=name, basis=d.get("basis", ""), sources=tuple(d.get("sources") or ()), **kw)


def get_profile(name: str = DEFAULT_PROFILE, overrides: dict | None = None) -> EngineProfile:
    """Profile ``name`` with ``overrides`` (scenario ``engine.overhead`` keys, ms) applied."""
    cat = _catalog()
    if name not in cat:
        raise UserError(f"engine.profile: unknown profile '{name}'; valid: {', '.join(PROFILE_NAMES)}")
    p = _from_entry(name, cat[name])
    changes = {}
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k in _MS_KEYS:
            changes[_MS_KEYS[k]] = float(v) / 1e3
        elif k == "batch_range":
            changes[k] = tuple(v)
        elif k in _PLAIN_KEYS:
            changes[k] = v
        else:
            valid = ", ".join([*_MS_KEYS, *_PLAIN_KEYS])
            raise UserError(f"engine.overhead: unknown key '{k}'; valid keys here: {valid}")
    if "attention_backend" in changes:
        get_backend(changes["attention_backend"])  # a clear error for an unknown name
    if changes:
        p = replace(p, overridden=tuple(sorted(k for k in (overrides or {}) if overrides[k] is not None)), **changes)
    return p


def profile_names() -> tuple[str, ...]:
    return tuple(_catalog())


assert {f.name for f in fields(EngineProfile)} >= set(_MS_KEYS.values()) | set(_PLAIN_KEYS)
