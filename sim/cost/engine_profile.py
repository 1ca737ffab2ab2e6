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
  vllm/engine/output_processor/multi_step.py appends and checks each token) and the model input
  is still broadcast to the TP workers (the per-extra-rank term, paid every step:
  vllm/worker/multi_step_worker.py ``_get_driver_input_and_broadcast``);
- kernel launches ``launch`` = layers x per-layer launch time, unless the step replays a
  CUDA graph (decode-only steps of at most ``cuda_graph_max_batch`` sequences); launches are
  asynchronous, so the GPU hides them when its kernels take longer;
- serial engines: ``step = cpu + max(g, launch)``; overlapping engines (the scheduler runs one
  step ahead): ``step = max(g, launch, cpu)``.
The overhead is ``step - g``. A speculative drafter's passes use ``eager_op_s`` (per eager
PyTorch op of vLLM's propose loop) and ``draft_graphed`` (sim/cost/speculative.py).
NOTE: the CPU terms are host-side and taken as the same on every
GPU (the profile was measured on A100 hosts).

Per-request host work (issue 37): a step that schedules prompt chunks also pays
``per_prompt_chunk`` per chunk and ``per_prompt_token`` per new prompt token (``prompt_cpu_s``:
request setup and input preparation on the engine's host). The serving front end's terms
(``frontend_*``: HTTP and tokenisation per request and prompt token, detokenisation per output
token, one SSE event per streamed chunk) are applied around the engine by
``sim/engine/frontend.py`` when the front end runs in its own process (``frontend_overlap``);
in the engine's own process they are folded into these step terms (``in_process_frontend``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from sim.cost.attention_backend import get_backend
from sim.errors import UserError
from sim.catalog.packed import load_catalog

PROFILE_NAMES = ("vllm-v1", "vllm-v1-0.34", "vllm-v0", "vllm-v0.2", "sglang", "trt-llm", "trt-llm-2023", "custom")
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
    # engine-side host work of a step per prompt chunk it schedules and per new prompt token
    per_prompt_chunk_s: float = 0.0
    per_prompt_token_s: float = 0.0
    # the serving front end (API server): per request, per prompt token (tokenise), per output
    # token (detokenise), per streamed chunk (one SSE event); ``frontend_overlap``: it runs in a
    # process of its own, beside the engine's (its work delays requests, not steps)
    frontend_request_s: float = 0.0
    frontend_per_prompt_token_s: float = 0.0
    frontend_per_output_token_s: float = 0.0
    frontend_chunk_s: float = 0.0
    frontend_overlap: bool = True
    # the vLLM release whose V1 scheduling rules the scheduler follows (EngineLimits.vllm_release):
    # "0.11" (vllm-v1 and the non-vLLM profiles: simsrv's rules before) | "0.34" (vllm-v1-0.34)
    vllm_release: str = "0.11"
    # whether the engine's small all-reduces under TP take a custom one-/two-shot kernel (vLLM's
    # custom all-reduce, sim/cost/shapes.py ``uses_custom_allreduce``) or NCCL always (false:
    # TensorRT-LLM engines of 2023 built without ``--use_custom_all_reduce``, catalogue trt-llm-2023)
    custom_allreduce: bool = True
    # host seconds of one PyTorch operation issued from Python outside a CUDA graph (dispatch and
    # launch): what a speculative drafter's propose loop pays per op (sim/cost/speculative.py
    # ``propose_loop_ops``); 0 where no figure
    eager_op_s: float = 0.0
    # whether an EAGLE / EAGLE-3 / MTP drafter's passes replay CUDA graphs: None follows the
    # target's rule (``graphed``); False: never (vLLM 0.11.0: ``draft_graphed``)
    draft_cuda_graph: bool | None = None
    # the kernel of the engine's fp8 W8A8 GEMMs (sim/cost/calibration.py ``Calibration.fp8_table``):
    # "cutlass" (vLLM's CutlassFP8ScaledMMLinearKernel, the kernel the fp8 tables measured) |
    # "cublaslt" (TensorRT-LLM's cublas_scaled_mm)
    fp8_gemm: str = "cutlass"
    # whether, without chunked prefill, the step budget must hold ``max_model_len`` (vLLM's
    # SchedulerConfig._verify_args) or only each prompt (false: TensorRT-LLM, whose trtllm-bench
    # itself runs max_num_tokens below max_seq_len and whose 2023 GptSession engines bound prompts
    # by max_input_len: sim/policies/budget.py ``budget_error``)
    budget_covers_max_model_len: bool = True
    # whether the engine runs FP8 context FMHA (prefill attention on FP8 tensor cores) where its
    # attention tables hold one and the model runs FP8 with an fp8 KV cache (sim/cost/roofline.py):
    # TensorRT-LLM's builder turns it on in that case in later releases; v0.5-v0.7 had none
    # (NVIDIA/TensorRT-LLM#1463: --use_fp8_context_fmha is not an option in 0.8.0): false there
    fp8_context_fmha: bool = True

    def cpu_s(self, num_seqs: int, has_prefill: bool, tp: int) -> float:
        """Fixed + per-sequence + per-extra-rank CPU seconds of one step; with
        ``num_scheduler_steps`` > 1 a decode-only step pays its share of one scheduling plus its
        own output processing."""
        fixed = self.prefill_step_s if has_prefill else self.decode_step_s
        ranks = self.per_extra_tp_rank_s * (tp - 1)
        cpu = fixed + self.per_seq_s * num_seqs + ranks
        if has_prefill or self.num_scheduler_steps == 1:
            return cpu
        # Multi-step amortises the scheduling and the driver's input preparation, not the
        # broadcast to the TP workers: vLLM V0's MultiStepWorker._get_driver_input_and_broadcast
        # (vllm/worker/multi_step_worker.py, v0.6.0 to the last V0) calls broadcast_tensor_dict
        # with the whole model input on every step, first or not (its TODO: "only broadcast the
        # delta"), and each worker rebuilds its model input from it before it launches; the
        # first all-reduce of the step waits for the last rank to launch (vllm-project/vllm#5792).
        # NOTE: this per-step work (the broadcast, the outputs) is charged serially, as the
        # profile's serial engine does; within a block vLLM's CPU may run ahead of the GPU
        # (MultiStepModelRunner.execute_model: wait_previous_step is a stream wait, outputs are
        # pythonized when ready), which would hide it under longer kernels: an open assumption.
        out = min(cpu - ranks, self.output_step_s + self.output_per_seq_s * num_seqs)
        return (cpu - ranks - out) / self.num_scheduler_steps + out + ranks

    def prompt_cpu_s(self, num_chunks: int, prompt_tokens: int) -> float:
        """Host seconds a step adds for the ``num_chunks`` prompt chunks (``prompt_tokens`` new
        tokens) it schedules: request setup and input preparation (0 without chunks)."""
        return self.per_prompt_chunk_s * num_chunks + self.per_prompt_token_s * prompt_tokens

    def prompt_attributed_s(self, num_chunks: int, prompt_tokens: int) -> float:
        """The part of ``prompt_cpu_s`` reported as engine overhead when only the step's total is
        known (as ``attributed_s``: all of it for a serial engine, none for an overlapping one)."""
        return 0.0 if self.overlap_cpu else self.prompt_cpu_s(num_chunks, prompt_tokens)

    def graphed(self, num_seqs: int, has_prefill: bool) -> bool:
        """Whether the step replays a CUDA graph (decode-only, within the captured sizes)."""
        return self.cuda_graph_decode and not has_prefill and num_seqs <= self.cuda_graph_max_batch

    def draft_graphed(self, num_seqs: int, has_prefill: bool) -> bool:
        """Whether a draft head's pass of ``num_seqs`` sequences replays a CUDA graph: the
        target's rule unless the profile says otherwise (``draft_cuda_graph``). vLLM 0.11.0's
        drafter never does: ``EagleProposer.propose`` (vllm/v1/spec_decode/eagle.py) enters
        ``set_forward_context`` without a ``cudagraph_runtime_mode``, whose default is
        ``CUDAGraphMode.NONE`` (vllm/forward_context.py), and ``CUDAGraphWrapper.__call__``
        (vllm/compilation/cuda_graph.py) then runs the compiled module without replaying a graph
        (vllm-project/vllm#25109, opened 2025-09-17, restores piecewise graphs for the head after this
        release; the releases of mid-2025 replayed them: vllm#17211, #17504).
        vLLM 0.34's speculator captures its graphs in the target's CUDA graph mode
        (v1/worker/gpu/spec_decode/autoregressive/speculator.py ``init_cudagraph_manager``)."""
        if self.draft_cuda_graph is None:
            return self.graphed(num_seqs, has_prefill)
        return self.draft_cuda_graph and not has_prefill and num_seqs <= self.cuda_graph_max_batch

    def overhead_s(self, gpu_s: float, num_seqs: int, has_prefill: bool, tp: int, num_layers: int,
                   extra_cpu_s: float = 0.0) -> float:
        """Seconds the step takes beyond its ``gpu_s`` of kernels (see the module docstring);
        ``extra_cpu_s``: the step's per-prompt host work (``prompt_cpu_s``), added to its CPU."""
        return self.overhead_fn(num_seqs, has_prefill, tp, num_layers, extra_cpu_s)(gpu_s)

    def host_terms(self, num_seqs: int, has_prefill: bool, tp: int, num_layers: int,
                   extra_cpu_s: float = 0.0) -> tuple[float, float]:
        """(cpu, launch): the step's CPU work and its kernel launches (the module docstring)."""
        launch = 0.0 if self.graphed(num_seqs, has_prefill) else num_layers * self.eager_launch_per_layer_s
        return self.cpu_s(num_seqs, has_prefill, tp) + extra_cpu_s, launch

    def overhead_fn(self, num_seqs: int, has_prefill: bool, tp: int, num_layers: int,
                    extra_cpu_s: float = 0.0) -> Callable[[float], float]:
        """``overhead_s`` as a function of the GPU seconds, the host terms fixed by the batch
        computed once (every step of a decode run shares them). NOTE: the cost model's per-step
        path writes this function out (``RooflineCostModel.run_cost``): change both together."""
        cpu, launch = self.host_terms(num_seqs, has_prefill, tp, num_layers, extra_cpu_s)
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
            "per_prompt_chunk_ms": self.per_prompt_chunk_s * 1e3, "per_prompt_token_ms": self.per_prompt_token_s * 1e3,
            "frontend_request_ms": self.frontend_request_s * 1e3,
            "frontend_per_prompt_token_ms": self.frontend_per_prompt_token_s * 1e3,
            "frontend_per_output_token_ms": self.frontend_per_output_token_s * 1e3,
            "frontend_chunk_ms": self.frontend_chunk_s * 1e3, "frontend_overlap": self.frontend_overlap,
            "custom_allreduce": self.custom_allreduce, "vllm_release": self.vllm_release,
            "eager_op_ms": self.eager_op_s * 1e3, "draft_cuda_graph": self.draft_cuda_graph,
            "fp8_gemm": self.fp8_gemm, "budget_covers_max_model_len": self.budget_covers_max_model_len,
            "fp8_context_fmha": self.fp8_context_fmha,
            "overridden": list(self.overridden),
        }


# scenario key (ms or plain) -> EngineProfile field
_MS_KEYS = {"prefill_step_ms": "prefill_step_s", "decode_step_ms": "decode_step_s", "per_seq_ms": "per_seq_s",
            "per_extra_tp_rank_ms": "per_extra_tp_rank_s", "eager_launch_per_layer_ms": "eager_launch_per_layer_s",
            "output_step_ms": "output_step_s", "output_per_seq_ms": "output_per_seq_s",
            "per_prompt_chunk_ms": "per_prompt_chunk_s", "per_prompt_token_ms": "per_prompt_token_s",
            "frontend_request_ms": "frontend_request_s", "frontend_per_prompt_token_ms": "frontend_per_prompt_token_s",
            "frontend_per_output_token_ms": "frontend_per_output_token_s", "frontend_chunk_ms": "frontend_chunk_s",
            "eager_op_ms": "eager_op_s"}
_PLAIN_KEYS = ("overlap_cpu", "cuda_graph_decode", "cuda_graph_max_batch", "attention_backend", "batch_range",
               "frontend_overlap")
# optional keys engine.overhead may set, beside _PLAIN_KEYS (draft_cuda_graph absent: None, the
# rule it names follows); the other optional keys (_OPTIONAL_DEFAULTS) are the file's text keys
# and an engine's start-up rule (budget_covers_max_model_len)
_OPTIONAL_PLAIN_KEYS = ("custom_allreduce", "draft_cuda_graph")
_OVERRIDE_PLAIN_KEYS = (*_PLAIN_KEYS, *_OPTIONAL_PLAIN_KEYS, "fp8_gemm")
FRONTEND_MS_KEYS = ("frontend_request_ms", "frontend_per_prompt_token_ms", "frontend_per_output_token_ms",
                    "frontend_chunk_ms")


# keys a catalogue entry or a profile file may leave out, with the value their absence means
_OPTIONAL_DEFAULTS = {"kv_memory_basis": "total", "custom_allreduce": True, "draft_cuda_graph": None,
                      "fp8_gemm": "cutlass", "vllm_release": "0.11", "budget_covers_max_model_len": True,
                      "fp8_context_fmha": True}


def _optional_values(d: dict) -> dict:
    """The optional keys of an entry or a file ``d``, absent ones at their defaults (the release
    as text: YAML reads an unquoted 0.34 as a number)."""
    out = {k: d.get(k, v) for k, v in _OPTIONAL_DEFAULTS.items()}
    out["vllm_release"] = str(out["vllm_release"])
    return out


@lru_cache(maxsize=1)
def _catalog() -> dict:
    return load_catalog("engine_profiles.yaml")


def _from_entry(name: str, d: dict) -> EngineProfile:
    kw = {f: float(d.get(k, 0.0)) / 1e3 for k, f in _MS_KEYS.items()}
    kw.update({k: d[k] for k in _PLAIN_KEYS if k != "frontend_overlap"})
    kw["batch_range"] = tuple(d["batch_range"]) if d["batch_range"] else None
    kw["frontend_overlap"] = d.get("frontend_overlap", True)
    kw.update(_optional_values(d))
    return EngineProfile(name=name, basis=d.get("basis", ""), sources=tuple(d.get("sources") or ()), **kw)


def term_fields() -> dict[str, str]:
    """Profile-file (and catalogue) key in ms -> ``EngineProfile`` field, for every float field in
    seconds (``*_s``, not a rate ``*_per_s``), read from the dataclass: a term added to ``EngineProfile`` is a key of a
    profile file and a term ``simsrv fit`` can fit, with no list to update."""
    return {f.name[:-2] + "_ms": f.name for f in fields(EngineProfile)
            if f.type in ("float", float) and f.name.endswith("_s") and not f.name.endswith("_per_s")}


PROFILE_FILE_SUFFIXES = (".yaml", ".yml")
# a profile file's free-text keys (its optional keys are _OPTIONAL_DEFAULTS')
_FILE_TEXT_KEYS = ("basis", "sources")
# the vLLM releases whose V1 scheduling rules simsrv follows (``vllm_release``)
VLLM_RELEASES = ("0.11", "0.34")
KV_MEMORY_BASES = ("total", "free")
FP8_GEMM_KERNELS = ("cutlass", "cublaslt")


def is_profile_path(name: str) -> bool:
    """Whether ``engine.profile`` names a profile file (``*.yaml``) rather than a catalogue entry."""
    return name not in _catalog() and name.lower().endswith(PROFILE_FILE_SUFFIXES)


def _file_error(path: Path, key: str, what: str) -> UserError:
    return UserError(f"engine.profile: {path}: key {key}: {what}")


def _file_number(path: Path, key: str, v: object, integer: bool) -> float | int:
    from sim.limits import MAX_COUNT, MAX_FIGURE

    top = MAX_COUNT if integer else MAX_FIGURE
    ok = (isinstance(v, int) if integer else isinstance(v, (int, float))) and not isinstance(v, bool)
    if not ok or not math.isfinite(v) or not 0 <= v <= top:
        kind = "a whole number" if integer else "a number"
        raise _file_error(path, key, f"{shown_value(v)} is not {kind} from 0 to {top:g}")
    return v


def shown_value(v: object, max_chars: int = 40) -> str:
    """A value from a user's file as an error shows it: ``repr`` (control characters escaped), cut."""
    text = repr(v)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _check_file_entry(path: Path, d: object) -> dict:
    """A profile file's mapping checked key by key (the catalogue's keys, strictly typed): one
    ``UserError`` line naming the file and the key."""
    if not isinstance(d, dict):
        raise UserError(f"engine.profile: {path}: a profile file is a YAML mapping of the catalogue's keys "
                        f"(sim/catalog/engine_profiles.yaml), got {type(d).__name__}")
    terms = term_fields()
    valid = [*terms, *_PLAIN_KEYS, *_OPTIONAL_DEFAULTS, *_FILE_TEXT_KEYS]
    for k in d:
        if k not in valid:
            shown_key = k if isinstance(k, str) else shown_value(k)
            raise _file_error(path, shown_key, f"unknown key; valid keys: {', '.join(valid)}")
    missing = [k for k in _PLAIN_KEYS if k not in d]
    if missing:
        raise _file_error(path, missing[0], "missing (a profile file gives " + ", ".join(_PLAIN_KEYS) + ")")
    for k in terms:
        if k in d:
            _file_number(path, k, d[k], integer=False)
    # the boolean keys: these three, and every optional key whose default is true or false
    for k in ("overlap_cpu", "cuda_graph_decode", "frontend_overlap",
              *(k for k, v in _OPTIONAL_DEFAULTS.items() if isinstance(v, bool))):
        if k in d and not isinstance(d[k], bool):
            raise _file_error(path, k, f"{shown_value(d[k])} is not true or false")
    if d.get("draft_cuda_graph") is not None and not isinstance(d["draft_cuda_graph"], bool):
        raise _file_error(path, "draft_cuda_graph", f"{shown_value(d['draft_cuda_graph'])} is not true, false or null")
    _file_number(path, "cuda_graph_max_batch", d["cuda_graph_max_batch"], integer=True)
    if not isinstance(d["attention_backend"], str):
        raise _file_error(path, "attention_backend", f"{shown_value(d['attention_backend'])} is not a name")
    try:
        get_backend(d["attention_backend"])
    except UserError as e:
        raise _file_error(path, "attention_backend", str(e).split(": ", 1)[-1]) from None
    br = d["batch_range"]
    if br is not None and not (isinstance(br, list) and len(br) == 2
                               and all(isinstance(x, int) and not isinstance(x, bool) for x in br)
                               and 1 <= br[0] <= br[1]):
        raise _file_error(path, "batch_range", f"{shown_value(br)} is not null or [low, high] with 1 <= low <= high")
    opt = _optional_values(d)
    if opt["kv_memory_basis"] not in KV_MEMORY_BASES:
        raise _file_error(path, "kv_memory_basis", f"{shown_value(d['kv_memory_basis'])} is not total or free")
    if opt["fp8_gemm"] not in FP8_GEMM_KERNELS:
        raise _file_error(path, "fp8_gemm", f"{shown_value(d['fp8_gemm'])} is not cutlass or cublaslt")
    if opt["vllm_release"] not in VLLM_RELEASES:
        raise _file_error(path, "vllm_release", f"{shown_value(d['vllm_release'])} is not one of {', '.join(VLLM_RELEASES)}")
    if not isinstance(d.get("basis", ""), str):
        raise _file_error(path, "basis", "is not text")
    src = d.get("sources") or []
    if not isinstance(src, list) or not all(isinstance(x, str) for x in src):
        raise _file_error(path, "sources", "is not a list of text lines")
    return d


@lru_cache(maxsize=32)
def _read_profile_file(path: str, _mtime_ns: int, _size: int) -> EngineProfile:
    from sim.files.yamlfile import read_yaml

    p = Path(path)
    d = _check_file_entry(p, read_yaml(p, "engine profile file"))
    kw: dict = {f: float(d.get(k, 0.0)) / 1e3 for k, f in term_fields().items()}
    kw.update({k: d[k] for k in _PLAIN_KEYS})
    kw["batch_range"] = tuple(d["batch_range"]) if d["batch_range"] else None
    kw.update(_optional_values(d))
    return EngineProfile(name=path, basis=d.get("basis", ""), sources=tuple(d.get("sources") or ()), **kw)


def load_profile_file(path: str | Path) -> EngineProfile:
    """The profile a YAML file holds (``engine.profile: path/to/profile.yaml``): the keys of a
    catalogue entry (``sim/catalog/engine_profiles.yaml``), terms in ms (an absent term is 0, as
    in the catalogue), validated strictly; read again when the file changes."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise UserError(f"engine.profile: {p}: profile file not found") from None
    return _read_profile_file(str(p), st.st_mtime_ns, st.st_size)


def profile_entry(name: str) -> dict:
    """The catalogue entry or profile file ``name`` as a profile file writes it: every key, each
    term in ms as given there (0 where absent), so a file made from it runs as ``name`` does."""
    if is_profile_path(name):
        from sim.files.yamlfile import read_yaml

        load_profile_file(name)  # validated
        d = read_yaml(name, "engine profile file")
    elif name in _catalog():
        d = _catalog()[name]
    else:
        raise UserError(f"unknown profile '{name}'; valid: {', '.join(PROFILE_NAMES)} or a profile file (*.yaml)")
    out: dict = {k: float(d.get(k, 0.0)) for k in term_fields()}
    out.update({k: d[k] for k in _PLAIN_KEYS})
    out["batch_range"] = list(d["batch_range"]) if d["batch_range"] else None
    out.update(_optional_values(d))
    out["basis"] = d.get("basis", "")
    out["sources"] = list(d.get("sources") or [])
    return out


def get_profile(name: str = DEFAULT_PROFILE, overrides: dict | None = None) -> EngineProfile:
    """Profile ``name`` (a catalogue entry, or a profile file: ``load_profile_file``) with
    ``overrides`` (scenario ``engine.overhead`` keys, ms) applied."""
    cat = _catalog()
    if is_profile_path(name):
        p = load_profile_file(name)
    elif name not in cat:
        raise UserError(f"engine.profile: unknown profile '{name}'; valid: {', '.join(PROFILE_NAMES)} "
                        "or a profile file (*.yaml)")
    else:
        p = _from_entry(name, cat[name])
    changes = {}
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k in _MS_KEYS:
            changes[_MS_KEYS[k]] = float(v) / 1e3
        elif k == "batch_range":
            changes[k] = tuple(v)
        elif k in _OVERRIDE_PLAIN_KEYS:
            changes[k] = v
        else:
            valid = ", ".join([*_MS_KEYS, *_OVERRIDE_PLAIN_KEYS])
            raise UserError(f"engine.overhead: unknown key '{k}'; valid keys here: {valid}")
    if "attention_backend" in changes:
        get_backend(changes["attention_backend"])  # a clear error for an unknown name
    if changes:
        p = replace(p, overridden=tuple(sorted(k for k in (overrides or {}) if overrides[k] is not None)), **changes)
    return p


def without_frontend(p: EngineProfile) -> EngineProfile:
    """``p`` served offline (``engine.api_server: false``: vLLM's ``LLM``, trtllm-bench,
    gptSessionBenchmark): requests reach the engine as token ids from the same process, so no
    HTTP, tokenisation, detokenisation or streaming cost applies."""
    return replace(p, frontend_request_s=0.0, frontend_per_prompt_token_s=0.0, frontend_per_output_token_s=0.0,
                   frontend_chunk_s=0.0)


def in_process_frontend(p: EngineProfile, stream_interval: int) -> EngineProfile:
    """``p`` with its front end in the engine's own process and thread (``frontend_overlap``
    false: vLLM V0's in-process AsyncLLMEngine, ``--disable-frontend-multiprocessing``): the
    front end's work is host time of the engine's steps, not a delay beside them. A request's
    HTTP handling and tokenisation are charged to the step that schedules its prompt (per
    chunk and per new token: a chunked prompt pays the per-request term once per chunk), and
    each scheduled sequence pays one output token's detokenisation and 1/``stream_interval``
    of an SSE event per step. The front-end terms themselves are then 0 (nothing is added
    around the engine). NOTE: every scheduled sequence is counted as emitting a token."""
    return replace(
        without_frontend(p),
        per_prompt_chunk_s=p.per_prompt_chunk_s + p.frontend_request_s,
        per_prompt_token_s=p.per_prompt_token_s + p.frontend_per_prompt_token_s,
        per_seq_s=p.per_seq_s + p.frontend_per_output_token_s + p.frontend_chunk_s / stream_interval,
        output_per_seq_s=p.output_per_seq_s + p.frontend_per_output_token_s + p.frontend_chunk_s / stream_interval)


def profile_names() -> tuple[str, ...]:
    return tuple(_catalog())


assert {f.name for f in fields(EngineProfile)} >= set(_MS_KEYS.values()) | set(_PLAIN_KEYS) | set(_OPTIONAL_PLAIN_KEYS)
assert set(_MS_KEYS) <= set(term_fields())  # every overridable term is a profile-file key
