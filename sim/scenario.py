"""Scenario files (ARCHITECTURE.md section 3): YAML -> validated, frozen ``Scenario``.

Why: every run is reproducible from its resolved scenario; unknown keys are errors that list
the valid ones, so a typo never silently runs the default.
"""

# No ``from __future__ import annotations`` here: pydantic would then compile and evaluate each
# field's annotation string when the classes are defined (145 fields, ~0.003 s CPU at start-up).
import functools
import math
import os
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from sim.errors import UserError
from sim.limits import (MAX_COUNT, MAX_FIGURE, MAX_REPLICAS, MAX_REQUESTS, MAX_SEED, MAX_TIME_S,
                        MAX_TOKENS)
from sim.policies import get_policy, policy_names
from sim.policies.registry import PolicySpec, chunked_prefill_policy, name_list, names_with
from sim.workload.formats import AUTO, TIME_UNITS, format_choices
from sim.policies.budget import engine_limits, policy_engines, scenario_budget_error


_PROJECT_DIR = Path(__file__).resolve().parents[1]  # holds scenarios/ and traces/


def _options(ann: Any) -> list:
    """The alternatives of an annotation (Optional and Union unfolded, Annotated's type)."""
    origin = get_origin(ann)
    if origin is Union or origin is types.UnionType:
        return [o for a in get_args(ann) for o in _options(a)]
    if origin is Annotated:
        return _options(get_args(ann)[0])
    return [ann]


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The first pydantic model among an annotation's alternatives (``_options``), if any."""
    return next((o for o in _options(ann) if isinstance(o, type) and issubclass(o, BaseModel)), None)


class _Strict(BaseModel):
    # NaN and +-inf are refused in every float field (a field that means something by inf says so).
    # strict: a value has its field's type, never one pydantic would convert: an int field takes
    # an int (not '64', 64.5 or true), a float field an int or a float (not '1.5' or true), a bool
    # field true or false (not 0, 1 or 'yes'), a str field a string (not 2024). Found by issue 38:
    # enable_prefix_caching: 0 and max_num_seqs: '64' ran as false and 64.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_floats_as_ints(cls, data: Any) -> Any:
        """A whole float where an int belongs is that int (``memory_bytes: 80e9``, ``64.0``; the
        one conversion strict mode is spared, in every model); 64.5 is still refused."""
        ints = _int_fields(cls)
        if isinstance(data, dict) and any(k in ints for k in data):
            return {k: _whole_as_int(v) if k in ints else v for k, v in data.items()}
        return data


@functools.cache
def _int_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that take integers (or lists of them) and no float."""
    return frozenset(k for k, f in cls.model_fields.items() if _takes_ints(f.annotation))


def _takes_ints(ann: Any) -> bool:
    opts = _options(ann)
    if float in opts:
        return False
    return int in opts or any(get_origin(o) in (tuple, list) and set(get_args(o)) == {int} for o in opts)


def _whole_as_int(value: Any) -> Any:
    """``value`` with whole floats (also in a list) made ints; anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_whole_as_int(v) for v in value)
    return value


def _list_as_tuple(value: Any) -> Any:
    """A YAML list given for a tuple field (strict mode takes only tuples); its items are still
    checked strictly."""
    return tuple(value) if isinstance(value, list) else value


def _inf_word(value: Any) -> Any:
    """``inf`` written as a word (YAML's float is ``.inf``): infinity, as ``--set`` reads it."""
    return math.inf if isinstance(value, str) and value.lower() in ("inf", "+inf", ".inf") else value


# pairs written as YAML lists: [low, high], [duration_s, rate]
IntPair = Annotated[tuple[int, int], BeforeValidator(_list_as_tuple)]
FloatPair = Annotated[tuple[float, float], BeforeValidator(_list_as_tuple)]


class HFConfigRef(_Strict):
    """``{hf_config: path}`` (a HuggingFace config.json), or ``{name: catalogue name}``; either
    with ``quantization`` (sim/spec/quantization.py; a config.json's ``quantization_config`` is
    read too, as vLLM does)."""

    hf_config: Optional[str] = None
    name: Optional[str] = None
    quantization: Optional[Literal["fp8", "int8", "awq", "gptq", "modelopt_fp4", "mxfp4"]] = None

    @model_validator(mode="after")
    def _one_source(self) -> "HFConfigRef":
        if self.hf_config is None and self.name is None:
            raise ValueError("model: give hf_config (a config.json) or name (a catalogue model)")
        return self


class CustomGPU(_Strict):
    """A GPU described inline (units as ``catalog/gpus.yaml``); ``based_on`` a catalogue GPU
    fills the fields not given."""

    based_on: Optional[str] = None
    name: Optional[str] = None
    bf16_flops_per_s: Optional[float] = Field(None, gt=0)
    fp8_flops_per_s: Optional[float] = Field(None, gt=0)
    fp4_flops_per_s: Optional[float] = Field(None, gt=0)  # dense FP4 tensor-core peak (Blackwell)
    vendor: Optional[Literal["nvidia", "amd"]] = None       # CUDA or ROCm (default nvidia)
    int8_ops_per_s: Optional[float] = Field(None, gt=0)
    memory_bytes: Optional[int] = Field(None, gt=0)
    hbm_bw_bytes_per_s: Optional[float] = Field(None, gt=0)
    nvlink_bw_bytes_per_s: Optional[float] = Field(None, gt=0)
    pcie_bw_bytes_per_s: Optional[float] = Field(None, gt=0)
    tdp_w: Optional[float] = Field(None, gt=0)
    num_sms: Optional[int] = Field(None, ge=1)
    driver_reserved_bytes: Optional[int] = Field(None, ge=0)  # nvidia-smi -q Reserved (default 551 MiB)
    l2_read_bw_bytes_per_s: Optional[float] = Field(None, gt=0)  # L2 read bandwidth (sim/spec/hardware.py)


class Hardware(_Strict):
    gpu: str = "h100-sxm"
    custom: Optional[CustomGPU] = None  # a GPU described inline instead of a catalogue name
    # power- or clock-capped parts: factors on peak FLOP/s and on memory bandwidth
    flops_factor: float = Field(1.0, gt=0, le=1)
    bandwidth_factor: float = Field(1.0, gt=0, le=1)
    # calibrated: efficiencies measured in kernels_profile/ where the GPU has them;
    # roofline: named default efficiencies everywhere (first principles only)
    cost_model: Literal["calibrated", "roofline"] = "calibrated"
    price_per_gpu_hour: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)  # $ per GPU-hour; capacity reports req per $


class CacheAwareRouting(_Strict):
    """``cluster.router: cache_aware`` thresholds (sim/engine/router.py ``CacheAware``; defaults are
    SGLang router's)."""

    cache_threshold: float = Field(0.3, ge=0, le=1)       # prefix match share to follow the cache
    balance_abs_threshold: float = Field(64.0, ge=0)      # outstanding max - min above this ...
    balance_rel_threshold: float = Field(1.5, ge=1)       # ... and max > this x min: least loaded
    max_tree_tokens: int = Field(2 ** 24, ge=1)           # router's prefix tree per replica (LRU)


class InterNode(_Strict):
    """``cluster.inter_node``: the link between nodes (sim/spec/nodes.py); unset fields take the
    GPU's catalogue figures (catalog/gpus.yaml ``inter_node_bw_bytes_per_s``, 10 us)."""

    bandwidth_gb_per_s: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)  # each GPU's share, one direction
    latency_us: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)          # per message across the link


class Cluster(_Strict):
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_REPLICAS)
    pipeline_parallel_size: int = Field(1, ge=1, le=MAX_REPLICAS)           # stages of tensor_parallel_size GPUs each
    pipeline_link_gb_per_s: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)  # stage-to-stage link, one direction
    enable_expert_parallel: bool = False                   # MoE experts spread over the TP ranks
    # vLLM --data-parallel-size: engine cores per replica, each with its own scheduler, KV cache
    # and attention at tensor_parallel_size; MoE layers span all of them (sim/engine/dp_group.py)
    data_parallel_size: int = Field(1, ge=1, le=MAX_REPLICAS)
    expert_load_imbalance: float = Field(1.0, ge=1, le=MAX_FIGURE)        # busiest rank's routed tokens / mean
    router: Literal["round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity",
                    "cache_aware"] = "least_outstanding"
    cache_aware: CacheAwareRouting = CacheAwareRouting()
    # GPUs per node (unset: the GPU's catalogue node, 8 for HGX/DGX parts) and the link between
    # nodes; a replica's GPUs are placed TP innermost, then PP (sim/spec/nodes.py)
    gpus_per_node: Optional[int] = Field(None, ge=1, le=MAX_REPLICAS)
    inter_node: Optional[InterNode] = None


class EngineOverhead(_Strict):
    """Overrides of the engine profile's terms (``sim/catalog/engine_profiles.yaml``)."""

    prefill_step_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    decode_step_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    per_seq_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    per_extra_tp_rank_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    eager_launch_per_layer_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    output_step_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    output_per_seq_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    # per-request host work (issue 37): engine-side per prompt chunk / prompt token of a step, and
    # the serving front end's terms (sim/engine/frontend.py)
    per_prompt_chunk_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    per_prompt_token_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    frontend_request_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    frontend_per_prompt_token_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    frontend_per_output_token_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    frontend_chunk_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    frontend_overlap: Optional[bool] = None
    # a speculative drafter's host work per eager PyTorch op, and whether its passes replay CUDA
    # graphs (sim/cost/speculative.py; draft_cuda_graph unset: the profile's rule)
    eager_op_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    draft_cuda_graph: Optional[bool] = None
    # small all-reduces under TP through a custom one-/two-shot kernel, or NCCL at every size
    # (sim/cost/engine_profile.py ``custom_allreduce``)
    custom_allreduce: Optional[bool] = None
    # the kernel of fp8 W8A8 linear layers (sim/cost/engine_profile.py ``fp8_gemm``)
    fp8_gemm: Optional[Literal["cutlass", "cublaslt"]] = None
    overlap_cpu: Optional[bool] = None
    cuda_graph_decode: Optional[bool] = None
    cuda_graph_max_batch: Optional[int] = Field(None, ge=0, le=MAX_COUNT)
    attention_backend: Optional[str] = None
    batch_range: Optional[IntPair] = None

    @model_validator(mode="after")
    def _range(self) -> "EngineOverhead":
        if self.batch_range is not None and not 1 <= self.batch_range[0] <= self.batch_range[1]:
            raise ValueError("batch_range must be [low, high] with 1 <= low <= high")
        return self


class SpeculativeConfig(_Strict):
    """vLLM's ``--speculative-config`` (docs.vllm.ai "Speculative Decoding"): a proposer drafts
    ``num_speculative_tokens`` tokens per sequence and step, the target model verifies them in
    its step (sim/cost/speculative.py). Acceptance is given, never guessed: per-position rates
    (the i-th draft token accepted given the ones before were) or the mean tokens per step."""

    method: Literal["ngram", "eagle", "eagle3", "mtp", "draft_model"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_COUNT)
    model: Optional[str] = None  # the draft model (catalogue name): method draft_model only
    acceptance_rates: Optional[list[Annotated[float, Field(ge=0, le=1)]]] = None
    # vLLM's "mean acceptance length": tokens emitted per sequence per step, bonus token included
    acceptance_length: Optional[float] = Field(None, ge=1, le=MAX_FIGURE)
    # method eagle3: the head's draft_vocab_size (its config.json); unset: the published heads'
    # 32,000 (sim/cost/speculative.py EAGLE3_DRAFT_VOCAB_TOKENS), at most the target's vocabulary
    draft_vocab_size: Optional[int] = Field(None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _complete(self) -> "SpeculativeConfig":
        k = self.num_speculative_tokens
        if (self.model is None) == (self.method == "draft_model"):
            raise ValueError("model (the draft model) is given with method draft_model, and only with it")
        if self.draft_vocab_size is not None and self.method != "eagle3":
            raise ValueError("draft_vocab_size (an EAGLE-3 head's draft vocabulary) is given with method eagle3 only")
        if (self.acceptance_rates is None) == (self.acceptance_length is None):
            raise ValueError("give acceptance_rates (one per draft position) or acceptance_length (mean tokens "
                             "per step, as vLLM reports it), one of the two: there is no default")
        if self.acceptance_rates is not None and len(self.acceptance_rates) != k:
            raise ValueError(f"acceptance_rates: {len(self.acceptance_rates)} rates for num_speculative_tokens {k}")
        if self.acceptance_length is not None and self.acceptance_length > k + 1:
            raise ValueError(f"acceptance_length: {self.acceptance_length} is more than num_speculative_tokens + 1 "
                             f"({k + 1}), the most a step can emit")
        return self


class Engine(_Strict):
    # a registered policy (sim/policies/registry.py); unset: chunked, as vLLM V1's OpenAI server
    # (chunked prefill on by default: vllm/engine/arg_utils.py EngineArgs._set_default_args)
    policy: str = "chunked"
    # unset: vLLM's defaults for the scenario's GPU (sim/policies/budget.py vllm_default_limits),
    # filled in by Scenario and kept out of model_fields_set; these are h100-sxm's (the default GPU)
    max_num_seqs: int = Field(1024, ge=1, le=MAX_COUNT)
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_TOKENS)
    # vLLM's name for chunked vs continuous: true = policy chunked, false = policy continuous
    enable_chunked_prefill: Optional[bool] = None
    max_model_len: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    # vLLM refuses a max_model_len above the model's context length unless
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/config: _get_and_verify_max_len); this key is that switch
    allow_long_max_model_len: bool = False
    block_size: int = Field(16, ge=1, le=MAX_TOKENS)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # vLLM's --quantization: weight quantization of the linear layers (same as model.quantization)
    quantization: Optional[Literal["fp8", "int8", "awq", "gptq", "modelopt_fp4", "mxfp4"]] = None
    enable_prefix_caching: bool = True   # vLLM V1 default
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    # vLLM's --kv-offloading-size (GiB of host memory, summed over the TP x PP ranks) and
    # --kv-offloading-backend: a CPU tier of KV blocks behind the prefix cache (sim/core/kv.py
    # CPUTier); null: off. NOTE: lmcache (LMCacheConnectorV1) is modelled as native
    kv_offloading_size: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)
    kv_offloading_backend: Literal["native", "lmcache"] = "native"
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_TOKENS)
    max_num_partial_prefills: int = Field(0, ge=0, le=MAX_COUNT)  # vLLM V0 knob; 0 = not enforced (V1)
    # vLLM 0.6 multi-step scheduling (--num-scheduler-steps): decode steps per scheduling round
    num_scheduler_steps: int = Field(1, ge=1, le=MAX_COUNT)
    # prompts in steps of their own that pause the decodes (vLLM V0 without chunked prefill,
    # SGLang without --enable-mixed-chunk); false: prompts join decode steps (vLLM V1)
    separate_prefill_steps: bool = False
    # TensorRT-LLM's capacity scheduler policy: max_utilization = KV on demand, preempt when short
    # (vLLM); guaranteed_no_evict = admit only requests whose whole length fits (TRT-LLM default)
    capacity_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = "max_utilization"
    # whose admission and retraction rules (sim/policies/admission.py): vllm = KV blocks needed now,
    # preempt the last admitted when short; sglang = SGLang 0.3's new_token_ratio admission and
    # retract_decode
    admission: Literal["vllm", "sglang"] = "vllm"
    # vLLM's --scheduling-policy: fcfs (arrival order) | priority (each request's priority, a lower
    # value first, then arrival; the lowest priority is preempted first: vLLM V1's scheduler)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    step_overhead_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    per_seq_overhead_ms: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    # host-side step cost of this serving engine (sim/cost/engine_profile.py): a catalogue entry
    # or a profile file (*.yaml, the catalogue's keys; simsrv fit writes one), made absolute by
    # Scenario._profile_file
    profile: str = "vllm-v1"
    # attention kernels (sim/catalog/attention_backends.yaml); default: the profile's
    attention_backend: Optional[str] = None
    overhead: EngineOverhead = EngineOverhead()
    # requests come through the engine's OpenAI-compatible HTTP server (vllm serve, as vllm bench
    # serve measures from the client): its front-end costs apply; false: offline (vLLM's LLM class,
    # trtllm-bench, gptSessionBenchmark), token ids in, none of them (sim/engine/frontend.py)
    api_server: bool = True
    # output tokens per streamed chunk (SGLang --stream-interval, TensorRT-LLM stream_interval);
    # the first token is sent alone
    stream_interval: int = Field(1, ge=1, le=MAX_COUNT)
    # speculative decoding (vLLM --speculative-config); unset: off
    speculative_config: Optional[SpeculativeConfig] = None

    @model_validator(mode="before")
    @classmethod
    def _policy_from_chunked_prefill(cls, data: Any) -> Any:
        """``enable_chunked_prefill`` without ``policy`` picks it: chunked or continuous."""
        if isinstance(data, dict) and isinstance(data.get("enable_chunked_prefill"), bool) and "policy" not in data:
            return {**data, "policy": chunked_prefill_policy(data["enable_chunked_prefill"])}
        return data

    @model_validator(mode="after")
    def _chunked_prefill_agrees(self) -> "Engine":
        """``enable_chunked_prefill`` beside a ``policy`` that says otherwise is refused."""
        flag = self.enable_chunked_prefill
        if flag is None:
            return self
        spec = get_policy(self.policy)
        if spec.pools or spec.chunked_prefill != flag:
            want = chunked_prefill_policy(flag)
            raise ValueError(f"engine.enable_chunked_prefill: {str(flag).lower()} means policy {want}, but "
                             f"engine.policy is {self.policy}: give one of the two")
        return self

    @field_validator("block_size")
    @classmethod
    def _block_size_power_of_two(cls, v: int) -> int:
        # vLLM's paged-attention kernels take power-of-two block sizes (CacheConfig.block_size:
        # 1, 8, 16, 32, 64, 128); the KV and prefix-hash arithmetic here assumes no more
        if v & (v - 1):
            raise ValueError(f"{v} is not a power of two (vLLM takes 8, 16, 32, 64 or 128)")
        return v

    @field_validator("attention_backend")
    @classmethod
    def _known_backend(cls, v: Optional[str]) -> Optional[str]:
        from sim.cost.attention_backend import backend_names

        names = backend_names()
        if v is not None and v not in names:
            raise ValueError("Input should be " + ", ".join(f"'{n}'" for n in names[:-1]) + f" or '{names[-1]}'")
        return v

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        from sim.cost.engine_profile import is_profile_path, profile_names

        names = profile_names()
        if v not in names and not is_profile_path(v):
            raise ValueError("Input should be " + ", ".join(f"'{n}'" for n in names) + " or a profile file (*.yaml)")
        return v

    @field_validator("policy")
    @classmethod
    def _registered_policy(cls, v: str) -> str:
        names = policy_names()
        if v not in names:
            raise ValueError("Input should be " + ", ".join(f"'{n}'" for n in names[:-1]) + f" or '{names[-1]}'")
        return v


class Pool(_Strict):
    """One pool of a disaggregated deployment; ``tensor_parallel_size`` and ``gpu`` default to
    ``cluster.tensor_parallel_size`` and ``hardware.gpu``."""

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    tensor_parallel_size: Optional[int] = Field(None, ge=1, le=MAX_REPLICAS)
    gpu: Optional[str] = None


class KVTransfer(_Strict):
    # each prefill replica's egress; unset: its TP GPUs' links of the pools' placement (sim/spec/nodes.py)
    bandwidth_gb_per_s: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)
    decode_bandwidth_gb_per_s: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)  # each decode replica's NIC (ingress)
    latency_ms: float = Field(0.05, ge=0, le=MAX_FIGURE)
    layerwise: bool = False   # pipeline the transfer layer by layer with the prefill compute


class Disaggregation(_Strict):
    prefill: Pool = Pool()
    decode: Pool = Pool()
    kv_transfer: KVTransfer = KVTransfer()
    # decode: vLLM P/D (proxy + KV connector), TTFT includes the transfer; prefill: DistServe
    first_token: Literal["prefill", "decode"] = "decode"


class TraceColumns(_Strict):
    """Column names of a ``format: generic`` trace."""

    arrival: str = "arrival_s"
    input: str = "input_tokens"
    output: str = "output_tokens"
    max_tokens: Optional[str] = None  # the max_tokens each request was sent with (optional)


class TraceSpec(_Strict):
    path: str
    format: str = AUTO  # auto or a registered format (sim/workload/formats.py)
    time_scale: float = Field(1.0, gt=0, le=MAX_FIGURE)
    target_rate: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)     # req/s; scales the gaps (exclusive with time_scale)
    start_s: Optional[float] = Field(None, ge=0, le=MAX_TIME_S)         # window of the trace to replay (trace seconds)
    duration_s: Optional[float] = Field(None, gt=0, le=MAX_TIME_S)
    sample: Optional[int] = Field(None, ge=1, le=MAX_REQUESTS)            # seeded subset of this many requests
    hash_block_size: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)   # tokens per hash id (default: the format's)
    spread_grid_s: Optional[float] = Field(None, gt=0, le=MAX_TIME_S)   # spread requests inside each grid bucket (Mooncake: 3)
    model_filter: Optional[str] = None                   # BurstGPT: keep this Model only
    keep_failed: bool = False                            # replay failed rows (0 output tokens) with 1 token
    time_unit: Literal[TIME_UNITS] = "s"  # generic format
    columns: TraceColumns = TraceColumns()               # generic format

    @field_validator("format")
    @classmethod
    def _registered_format(cls, v: str) -> str:
        choices = format_choices()  # read at validation: a format registered later is accepted
        if v not in choices:
            raise ValueError("Input should be " + ", ".join(f"'{n}'" for n in choices[:-1]) + f" or '{choices[-1]}'"
                             f" (got {short_repr(v)})")
        return v


class LengthDist(_Strict):
    dist: Literal["fixed", "uniform", "lognormal", "empirical", "mixture"]
    value: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    min: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    max: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    mean: Optional[float] = Field(None, gt=0, le=MAX_TOKENS)
    # NOTE: a lognormal's median is mean / exp(sigma^2 / 2): at sigma 5 it is 3.7e-6 x the mean,
    # so above it nearly every draw rounds to 1 token (real traces fit sigma 0.5-2)
    sigma: Optional[float] = Field(None, ge=0, le=5)
    path: Optional[str] = None
    column: Optional[str] = None
    weight: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)  # of a mixture component
    components: Optional[list["LengthDist"]] = None  # dist: mixture

    @model_validator(mode="after")
    def _needs(self) -> "LengthDist":
        need = {"fixed": ["value"], "uniform": ["min", "max"], "lognormal": ["mean", "sigma"],
                "empirical": ["path", "column"], "mixture": ["components"]}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist {self.dist} needs {', '.join(missing)}")
        if self.dist == "uniform" and self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class RateProfile(_Strict):
    """Arrival rate over time: ``piecewise`` segments [[duration_s, rate], ...] (the last rate
    holds after them), or ``diurnal``: a sine from ``min_rate`` to ``max_rate`` over ``period_s``,
    peaking at ``peak_s``."""

    shape: Literal["piecewise", "diurnal"]
    segments: Optional[list[FloatPair]] = Field(None, max_length=100_000)
    period_s: float = Field(86400.0, gt=0, le=MAX_TIME_S)
    min_rate: Optional[float] = Field(None, ge=0, le=MAX_FIGURE)
    max_rate: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)
    peak_s: float = Field(0.0, ge=0, le=MAX_TIME_S)

    @model_validator(mode="after")
    def _needs(self) -> "RateProfile":
        if self.shape == "piecewise":
            if not self.segments or any(d <= 0 or r < 0 for d, r in self.segments) or self.segments[-1][1] <= 0:
                raise ValueError("piecewise needs segments [[duration_s > 0, rate >= 0], ...], the last rate > 0")
        elif self.min_rate is None or self.max_rate is None or self.min_rate > self.max_rate:
            raise ValueError("diurnal needs min_rate <= max_rate")
        return self


class PrefixGroups(_Strict):
    """SGLang's generated-shared-prefix workload: groups sharing a system prompt."""

    num_groups: int = Field(64, ge=1, le=MAX_REQUESTS)
    prompts_per_group: int = Field(16, ge=1, le=MAX_REQUESTS)
    system_prompt_tokens: int = Field(2048, ge=1, le=MAX_TOKENS)
    question_tokens: int = Field(128, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _size(self) -> "PrefixGroups":
        if self.num_groups * self.prompts_per_group > MAX_REQUESTS:
            raise ValueError(f"num_groups x prompts_per_group = {self.num_groups * self.prompts_per_group:,} requests, "
                             f"more than {MAX_REQUESTS:,}")
        return self


class MultiTurn(_Strict):
    """Sessions whose turn k+1 prompt is turn k's prompt and answer plus a new message."""

    turns: "LengthDist" = LengthDist(dist="uniform", min=2, max=6)
    think_time_s: float = Field(10.0, ge=0, le=MAX_TIME_S)   # mean gap between a turn and the next (exponential)


class PriorityClass(_Strict):
    """One class of requests of a synthetic workload: the vLLM request priority its requests are
    sent with (a lower value is served first under ``engine.scheduling_policy: priority``) and its
    share of the requests (weights are normalised)."""

    priority: int = Field(ge=-MAX_COUNT, le=MAX_COUNT)
    weight: float = Field(gt=0, le=MAX_FIGURE)


class Synthetic(_Strict):
    num_requests: int = Field(1000, ge=1, le=MAX_REQUESTS)
    # inf = all at t=0, as vLLM bench (.inf, or the word inf as --set reads it)
    request_rate: Annotated[float, BeforeValidator(_inf_word)] = Field(4.0, gt=0, allow_inf_nan=True)
    burstiness: float = Field(1.0, gt=0, le=MAX_FIGURE)
    input_tokens: LengthDist = LengthDist(dist="lognormal", mean=900, sigma=0.8, max=8192)
    output_tokens: LengthDist = LengthDist(dist="lognormal", mean=300, sigma=0.8, max=2048)
    # A shared system prompt of this many tokens precedes each prompt (input_tokens is then
    # the question after it); requests pick one of num_prefixes distinct prompts uniformly.
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    num_prefixes: int = Field(1, ge=1, le=MAX_REQUESTS)
    # closed loop as vLLM bench --max-concurrency: at most this many requests in flight; a
    # client waits think_time_s after its request ends before sending its next
    max_concurrency: Optional[int] = Field(None, ge=1, le=MAX_REQUESTS)
    think_time_s: float = Field(0.0, ge=0, le=MAX_TIME_S)
    # the benchmark's warm-up (GenAI-Perf / AIPerf --warmup-request-count): the first this many
    # requests sent load the engine but are left out of the per-request latency figures
    # (sim/metrics/summary.py ``measured_rows``)
    warmup_requests: int = Field(0, ge=0, le=MAX_REQUESTS)
    rate_profile: Optional[RateProfile] = None
    prefix_groups: Optional[PrefixGroups] = None
    multi_turn: Optional[MultiTurn] = None
    hash_block_size: int = Field(16, ge=1, le=MAX_TOKENS)    # tokens per hash id of generated prompts
    # request priorities (vLLM's ``priority`` request field): each request (each session, with
    # multi_turn or prefix_groups) drawn into a class by weight; null: every request priority 0
    priority_classes: Optional[list[PriorityClass]] = Field(None, min_length=1, max_length=64)

    @field_validator("priority_classes")
    @classmethod
    def _distinct_priorities(cls, v: Optional[list[PriorityClass]]) -> Optional[list[PriorityClass]]:
        if v is not None and len({c.priority for c in v}) != len(v):
            raise ValueError("each class needs its own priority (a priority is listed twice)")
        return v


class Workload(_Strict):
    trace: Optional[TraceSpec] = None
    synthetic: Optional[Synthetic] = None
    # what each request's client sends as max_tokens (sim/workload/max_tokens.py): null = none
    # (the engine's default: the context left, max_model_len - prompt; a trace's max_tokens
    # column where it has one), a number (every request), or ``output``: each request's output
    # length, with ignore_eos (vLLM bench serve / SGLang bench_serving / trtllm-bench)
    max_tokens: Union[None, Literal["output"], Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Workload":
        if (self.trace is None) == (self.synthetic is None):
            raise ValueError("give exactly one of workload.trace or workload.synthetic")
        return self


class SLO(_Strict):
    ttft_ms: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)
    tpot_ms: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)
    e2el_ms: Optional[float] = Field(None, gt=0, le=MAX_FIGURE)


def _offload_error(e: "Engine", spec: PolicySpec, data_parallel_size: int) -> str | None:
    """What the CPU offloading tier (``engine.kv_offloading_size``) is not modelled with: it is
    modelled on a vLLM V1 scheduler of one colocated replica (sim/core/kv.py ``CPUTier``)."""
    if e.kv_offloading_size is None:
        return None
    if spec.pools or not spec.iteration_level or data_parallel_size > 1 or e.num_scheduler_steps > 1 or e.separate_prefill_steps \
            or e.capacity_scheduler_policy != "max_utilization" or e.admission != "vllm":
        return ("engine.kv_offloading_size is modelled on a colocated vLLM V1 engine: an iteration-level policy "
                "(continuous, chunked), no disaggregation pools, "
                "cluster.data_parallel_size 1, num_scheduler_steps 1, separate_prefill_steps false, "
                "capacity_scheduler_policy max_utilization, admission vllm")
    return None
class TokenBucketLimit(_Strict):
    """A token bucket: ``burst`` requests at once, refilled at ``rate_per_s`` (sim/engine/
    admission_control.py)."""

    rate_per_s: float = Field(gt=0, le=MAX_FIGURE)
    burst: int = Field(1, ge=1, le=MAX_REQUESTS)


class ClassLimit(_Strict):
    """Admission limits of one class of requests: those of ``priority`` (null: every request)."""

    priority: Optional[int] = Field(None, ge=-MAX_COUNT, le=MAX_COUNT)
    token_bucket: Optional[TokenBucketLimit] = None
    # requests of the class in the system (admitted, not yet ended) at most
    max_concurrency: Optional[int] = Field(None, ge=1, le=MAX_REQUESTS)

    @model_validator(mode="after")
    def _some_limit(self) -> "ClassLimit":
        if self.token_bucket is None and self.max_concurrency is None:
            raise ValueError("give token_bucket, max_concurrency or both")
        return self


class AdmissionControl(_Strict):
    """Limits in front of the engines (a gateway's 429s; vLLM has none): a request over a limit
    of its class is rejected, counted apart from failures (sim/engine/admission_control.py)."""

    limits: list[ClassLimit] = Field(min_length=1, max_length=64)

    @field_validator("limits")
    @classmethod
    def _one_per_class(cls, v: list[ClassLimit]) -> list[ClassLimit]:
        if len({c.priority for c in v}) != len(v):
            raise ValueError("one entry per priority (a priority, or null for all requests, is listed twice)")
        return v


def _capability_error(e: "Engine", spec: PolicySpec) -> str | None:
    """What ``e`` asks of its policy that the policy's spec does not declare (sim/policies/
    registry.py); the message names the policies that do."""
    if e.num_scheduler_steps > 1 and (not spec.multi_step or e.preemption_mode != "recompute"):
        # vLLM 0.6.0 refuses chunked prefill with multi-step (vllm/engine/arg_utils.py:
        # "Chunked prefill is not supported with multi-step"); swap is not modelled with it
        return (f"engine.num_scheduler_steps: {e.num_scheduler_steps} (multi-step) needs "
                f"engine.policy: {name_list(names_with(lambda p: p.multi_step))} and preemption_mode: recompute "
                "(vLLM 0.6.0 refuses chunked prefill with multi-step)")
    if e.capacity_scheduler_policy not in spec.capacity_scheduler_policies:
        takers = names_with(lambda p: e.capacity_scheduler_policy in p.capacity_scheduler_policies)
        return (f"engine.capacity_scheduler_policy: {e.capacity_scheduler_policy} applies to policies "
                f"{name_list(takers)}, not {e.policy}")
    if e.admission != "vllm" and (e.admission not in spec.admission_modes
                                  or e.capacity_scheduler_policy != "max_utilization"):
        takers = names_with(lambda p: e.admission in p.admission_modes)
        return (f"engine.admission: {e.admission} applies to policies {name_list(takers)} "
                f"with capacity_scheduler_policy max_utilization, not {e.policy} / {e.capacity_scheduler_policy}")
    if e.admission not in spec.admission_modes:
        return f"engine.admission: {e.admission} does not apply to policy {e.policy}"
    if e.scheduling_policy not in spec.scheduling_policies:
        takers = name_list(names_with(lambda p: e.scheduling_policy in p.scheduling_policies))
        return f"engine.scheduling_policy: {e.scheduling_policy} applies to policies {takers}, not {e.policy}"
    if e.scheduling_policy == "priority" and (e.admission != "vllm" or e.separate_prefill_steps
                                              or e.num_scheduler_steps > 1):
        # vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py) is the one modelled with priorities
        return ("engine.scheduling_policy: priority is vLLM V1's scheduler: it needs engine.admission: vllm, "
                "separate_prefill_steps: false and num_scheduler_steps: 1")
    if e.speculative_config is not None and (spec.pools or e.num_scheduler_steps > 1 or e.separate_prefill_steps
                                             or e.admission != "vllm" or e.stream_interval > 1):
        # what is modelled: vLLM V1's scheduler (speculative decoding is V1's: vllm/v1/spec_decode)
        return ("engine.speculative_config applies to colocated vLLM V1 scheduling (policy chunked or "
                "continuous, admission vllm, num_scheduler_steps 1, no separate_prefill_steps, stream_interval 1)")
    if e.stream_interval > 1 and (spec.pools or e.num_scheduler_steps > 1):
        # ITL per streamed chunk (sim/metrics/chunk_itl.py) follows a decode through its own
        # replica's steps; vLLM's --stream-interval is V1's, which has no multi-step scheduling
        return ("engine.stream_interval > 1 applies to colocated scheduling with num_scheduler_steps 1 "
                "(ITL per streamed chunk is not modelled across disaggregated pools or multi-step blocks)")
    if e.separate_prefill_steps and not spec.separate_prefill_steps:
        takers = name_list(names_with(lambda p: p.separate_prefill_steps))
        return f"engine.separate_prefill_steps applies to policy {takers} (whole prompts), not {e.policy}"
    return None


class Scenario(_Strict):
    name: str = "scenario"
    seed: int = Field(0, ge=0, le=MAX_SEED)
    model: Union[str, HFConfigRef] = "llama-3-8b"
    hardware: Hardware = Hardware()
    cluster: Cluster = Cluster()
    engine: Engine = Engine()
    workload: Workload
    slo: SLO = SLO()
    disaggregation: Optional[Disaggregation] = None
    admission_control: Optional[AdmissionControl] = None
    base_dir: str = "."  # directory of the scenario file: relative paths resolve against it

    @model_validator(mode="after")
    def _profile_file(self) -> "Scenario":
        """``engine.profile`` naming a file: looked up as other paths are (``resolve_path``: the
        current directory, then the scenario file's), read and checked now (one line naming the
        file and the key), and kept absolute, so the run and its resolved scenario find it. Runs
        before ``_engine_limits`` (pydantic runs after-validators in definition order): the
        limits check reads the file's rules (``budget_covers_max_model_len``) where it lies."""
        from sim.cost.engine_profile import is_profile_path, load_profile_file

        e = self.engine
        if not is_profile_path(e.profile):
            return self
        path = self.resolve_path(e.profile).resolve()
        load_profile_file(path)
        if str(path) != e.profile:
            filled = e.model_copy(update={"profile": str(path)})
            object.__setattr__(filled, "__pydantic_fields_set__", set(e.model_fields_set))
            object.__setattr__(self, "engine", filled)
        return self

    @model_validator(mode="after")
    def _engine_limits(self) -> "Scenario":
        e = self.engine
        if self.hardware.custom is not None and "gpu" in self.hardware.model_fields_set:
            raise ValueError("give hardware.gpu or hardware.custom, not both")
        c = self.cluster
        spec = get_policy(e.policy)
        if c.pipeline_parallel_size > 1 and not spec.pipeline_parallel:
            # a pool's replica is built with one stage (build_deployment), so num_gpus counts
            # tensor_parallel_size per pool replica: refused rather than silently dropped
            raise ValueError("cluster.pipeline_parallel_size applies to colocated replicas; disaggregation "
                             "pools take tensor_parallel_size only")
        if c.data_parallel_size > 1:
            if not c.enable_expert_parallel:
                raise ValueError("cluster.data_parallel_size > 1 needs cluster.enable_expert_parallel: true (a MoE "
                                 "model's experts spread over the data-parallel ranks); for independent copies "
                                 "use cluster.replicas")
            if c.pipeline_parallel_size > 1 or not spec.data_parallel:
                raise ValueError("cluster.data_parallel_size > 1 applies to colocated replicas of one pipeline "
                                 "stage (pipeline_parallel_size 1, no disaggregation pools)")
            if e.num_scheduler_steps > 1:
                # multi-step scheduling is vLLM 0.6's (V0); data-parallel expert parallelism is V1's
                raise ValueError("cluster.data_parallel_size > 1 runs steps in lockstep one at a time; "
                                 "engine.num_scheduler_steps (vLLM 0.6 multi-step) does not apply")
        if e.speculative_config is not None and (c.pipeline_parallel_size > 1 or c.data_parallel_size > 1):
            raise ValueError("engine.speculative_config is modelled with tensor parallelism only "
                             "(pipeline_parallel_size and data_parallel_size 1)")
        if c.expert_load_imbalance != 1.0 and not c.enable_expert_parallel:
            raise ValueError("cluster.expert_load_imbalance needs cluster.enable_expert_parallel: true "
                             "(without it every rank holds a slice of every expert and does equal work)")
        offload = _offload_error(e, spec, c.data_parallel_size)
        if offload:
            raise ValueError(offload)
        capability = _capability_error(e, spec)
        if capability:
            raise ValueError(capability)
        self._fill_gpu_defaults()
        budget = scenario_budget_error(self.engine, self._default_limits)  # vLLM's start-up rule (sim/policies/budget.py)
        if budget:
            raise ValueError(budget)
        return self

    def _default_limits(self, where: str) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) vLLM defaults to on the GPU of the engine
        ``where`` (``engine``, or a pool ``disaggregation.<pool>`` with its own ``gpu``); an
        unknown GPU is refused when the deployment is built, so its engine keeps h100-sxm's."""
        from sim.policies.budget import profile_release, vllm_default_limits
        from sim.spec.hardware import scenario_gpu

        pool = getattr(self.disaggregation, where.rpartition(".")[2], None) if where != "engine" else None
        try:
            gpu = scenario_gpu(self.hardware, getattr(pool, "gpu", None))
        except UserError:
            return Engine.model_fields["max_num_batched_tokens"].default, Engine.model_fields["max_num_seqs"].default
        # a profile file names its release: its path is absolute by now (_profile_file runs first)
        return vllm_default_limits(gpu, profile_release(self.engine.profile))

    def _fill_gpu_defaults(self) -> None:
        """``engine.max_num_batched_tokens`` and ``max_num_seqs`` left unset take the colocated
        GPU's defaults (``_default_limits``), still unset (model_fields_set), so that readers of
        the fields see the values of this GPU and the resolved scenario writes what the run used
        (sim/engine/deployment.py ``engine_lengths`` gives the final ones, ``max_model_len``
        known)."""
        e = self.engine
        defaults = self._default_limits("engine")
        chunked = dict(policy_engines(e.policy)).get("engine", True)
        budget, seqs = engine_limits(e, chunked, e.max_model_len, defaults)
        fill = {"max_num_batched_tokens": defaults[0] if budget is None else budget, "max_num_seqs": seqs}
        if all(getattr(e, k) == v for k, v in fill.items()):
            return
        filled = e.model_copy(update=fill)
        object.__setattr__(filled, "__pydantic_fields_set__", set(e.model_fields_set))
        object.__setattr__(self, "engine", filled)

    @property
    def dir_name(self) -> str:
        """``name`` as one safe directory name: never a path, never outside the reports folder."""
        return safe_dir_name(self.name)

    def resolve_path(self, p: str) -> Path:
        """A relative path is looked up from the current directory, then the scenario file's
        directory, then simsrv's own directory (the shipped scenarios name ``traces/...`` from
        there), so shipped scenarios and copies of them run from any directory."""
        path = Path(p)
        if path.is_absolute() or path.exists():
            return path
        beside = Path(os.path.normpath(Path(self.base_dir) / path))
        shipped = _PROJECT_DIR / path
        return shipped if not beside.exists() and shipped.exists() else beside

    def to_yaml(self) -> str:
        """``resolved()`` as YAML: a run's ``scenario.resolved.yaml``."""
        return yaml.safe_dump(self.resolved(), sort_keys=False)

    def resolved(self) -> dict:
        """The scenario as its run reads it, as a plain dict (README, Scenario files): every key
        with a value written, defaults filled, the values the run derives from the model or the
        workload written as it uses them, file paths absolute (it runs from any directory).
        Guarantee (tests/test_scenario_roundtrip.py): validated again it runs byte for byte as
        this scenario does, and resolves to the same dict. Left out: keys whose null means "the
        catalogue's or engine profile's value" (e.g. ``engine.attention_backend``, the fields of
        ``hardware.custom`` its ``based_on`` fills), and ``hardware.gpu`` beside ``custom``."""
        from sim.engine.deployment import engine_lengths

        # unset max_num_batched_tokens and max_num_seqs: vLLM's defaults on this GPU, the budget
        # max_model_len without chunked prefill (sim/policies/budget.py)
        lengths = dict(zip(("max_model_len", "max_num_batched_tokens", "max_num_seqs"), engine_lengths(self)))
        # an unset budget or max_num_seqs of a pools policy is each pool's own default
        # (sim/policies/budget.py): the prefill pool's without chunked prefill, the decode pool's
        # with it, each on its pool's GPU; left unset
        pool_defaults = [k for k in ("max_num_batched_tokens", "max_num_seqs")
                         if get_policy(self.engine.policy).pools and k not in self.engine.model_fields_set]
        for k in pool_defaults:
            del lengths[k]
        update: dict[str, Any] = {"engine": self.engine.model_copy(update=lengths)}
        syn = self.workload.synthetic
        if syn is not None and syn.prefix_groups is not None:
            # prefix_groups makes num_groups x prompts_per_group requests, whatever num_requests says
            n = syn.prefix_groups.num_groups * syn.prefix_groups.prompts_per_group
            synthetic = syn.model_copy(update={"num_requests": n})
            update["workload"] = self.workload.model_copy(update={"synthetic": synthetic})
        if get_policy(self.engine.policy).pools:
            update["disaggregation"] = self._resolved_pools()
        data = self.model_copy(update=update).model_dump(mode="json", exclude_none=True, exclude={"base_dir"})
        for k in pool_defaults:
            del data["engine"][k]
        if self.hardware.custom is not None:
            del data["hardware"]["gpu"]  # the inline GPU replaces the catalogue one (one of the two)
        _absolute_paths(data, self.resolve_path)
        return data

    def _resolved_pools(self) -> "Disaggregation":
        """``disaggregation`` as a pools policy runs it (sim/engine/topology.py
        ``DisaggregatedLayout``): the defaults when absent, each pool's tensor_parallel_size and
        (with a catalogue GPU) gpu filled from the cluster's."""
        d = self.disaggregation or Disaggregation()

        def filled(pool: Pool) -> Pool:
            fill = {"tensor_parallel_size": pool.tensor_parallel_size or self.cluster.tensor_parallel_size}
            if self.hardware.custom is None:
                fill["gpu"] = pool.gpu or self.hardware.gpu
            return pool.model_copy(update=fill)

        update: dict[str, Any] = {"prefill": filled(d.prefill), "decode": filled(d.decode)}
        if d.kv_transfer.bandwidth_gb_per_s is None:
            egress, ingress = self._kv_links_bytes_per_s(d)
            update["kv_transfer"] = d.kv_transfer.model_copy(update={
                "bandwidth_gb_per_s": egress / 1e9,
                "decode_bandwidth_gb_per_s": d.kv_transfer.decode_bandwidth_gb_per_s or ingress / 1e9})
        return d.model_copy(update=update)

    def _kv_links_bytes_per_s(self, d: "Disaggregation") -> tuple[float, float]:
        """(egress, ingress) bytes/s of the pools' KV links where ``kv_transfer`` gives no
        bandwidth: the placement's (sim/spec/nodes.py ``kv_transfer_links``)."""
        from sim.spec.hardware import scenario_gpu
        from sim.spec.nodes import kv_transfer_links

        tp = self.cluster.tensor_parallel_size
        pg, dg = scenario_gpu(self.hardware, d.prefill.gpu), scenario_gpu(self.hardware, d.decode.gpu)
        egress, ingress, _ = kv_transfer_links(self.cluster, pg, d.prefill.tensor_parallel_size or tp,
                                               d.prefill.replicas, dg, d.decode.tensor_parallel_size or tp,
                                               d.decode.replicas)
        return egress, ingress


def safe_dir_name(name: str, max_chars: int = 100) -> str:
    """Letters, digits, ``.``, ``_`` and ``-`` kept, anything else (``/``, ``\\``, spaces, control
    characters) becomes ``_``; no leading dot (so never ``..``); at most ``max_chars``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(name))[:max_chars].lstrip(".")
    return safe or "scenario"


def _absolute_paths(node: Any, resolve) -> None:
    """Replace every ``path`` / ``hf_config`` value in a scenario dict by its absolute path."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("path", "hf_config") and isinstance(v, str):
                node[k] = str(resolve(v).resolve())
            else:
                _absolute_paths(v, resolve)
    elif isinstance(node, list):
        for v in node:
            _absolute_paths(v, resolve)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class whose field list explains an error at ``loc``."""
    cls: Any = Scenario
    for part in loc[:-1]:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
        field = cls.model_fields.get(str(part))
        if field is None:
            return None
        cls = _model_in(field.annotation)
        if cls is None:
            return None
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _format_error(err: ValidationError, where: str, overrides: list[tuple[str, str]] | tuple = ()) -> str:
    # a value of the wrong type first: it is the problem the user made, where a missing key
    # beside it may only follow from it
    errors = err.errors()
    e = next((x for x in errors if x["type"] in _EXPECTED), errors[0])
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in _LOC_TAGS)))
    key = ".".join(str(p) for p in loc) or "(top level)"
    where = _with_flag(where, key, overrides)
    if e["type"] == "extra_forbidden":
        cls = _model_at(loc)
        valid = ", ".join(k for k in (cls.model_fields if cls else {}) if k != "base_dir")
        return f"{where}: unknown key '{key}'; valid keys here: {valid}"
    if loc and loc[0] == "model" and loc[-1] != "quantization":
        return (f"{where}: model: give a catalogue name, {{hf_config: path/to/config.json}} or "
                f"{{name: catalogue name}} (either mapping may add quantization: fp8 | int8 | awq | gptq | modelopt_fp4 | mxfp4)")
    if e["type"] in _EXPECTED:
        return f"{where}: {key}: {_EXPECTED[e['type']]} is expected, not {_describe(e.get('input'))}"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    if isinstance(got, (int, float, str)) and not isinstance(got, bool) and e["type"] not in ("missing", "value_error"):
        msg += f" (got {short_repr(got)})"
    return f"{where}: {key}: {msg}"


# pydantic's names of the validators an error passed through, not keys of the scenario
_LOC_TAGS = ("str", "function-after", "function-before")
# strict mode's type errors (sim.scenario._Strict): what the key takes
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "string_type": "a string", "tuple_type": "a list", "list_type": "a list", "model_type": "a mapping",
             "dict_type": "a mapping"}


def _describe(value: Any) -> str:
    """A wrong-typed value as an error line names it: its kind and (short) value."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()}: YAML reads true, false, yes, no, on and off as booleans)"
    if isinstance(value, str):
        return f"the string {short_repr(value)}"
    if isinstance(value, (int, float)):
        return f"the number {short_repr(value)}"
    kind = {dict: "a mapping", list: "a list", tuple: "a list", type(None): "null"}.get(type(value))
    return kind or f"a {type(value).__name__}"


def short_repr(value: Any, max_chars: int = 40) -> str:
    """``repr(value)`` cut to ``max_chars`` (an error line never echoes a long or binary value)."""
    text = repr(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """``--set a.b.c=value``: create intermediate mappings as needed."""
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {} if nxt is None or not isinstance(nxt, dict) else nxt
            node[p] = nxt
        node = nxt
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise UserError(f"--set {text!r}: expected dotted.key=value (no key before '=')")
    from sim.files.yamlfile import parse_yaml_text

    value = parse_yaml_text(raw, f"--set {key.strip()}") if raw.strip() else ""
    if isinstance(value, str) and value.lower() in ("inf", "+inf", ".inf"):
        value = math.inf
    return key.strip(), value


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read, override and validate a scenario file."""
    path = Path(path)
    raw = read_scenario_raw(path)
    given = apply_overrides(raw, overrides)
    return scenario_from_dict(raw, str(path), base_dir=str(path.parent), overrides=given)


def read_scenario_raw(path: Path) -> dict:
    """A scenario file's mapping as written (an empty file: no keys), not yet validated."""
    from sim.files.yamlfile import read_yaml

    raw = read_yaml(path, "scenario file")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a scenario is a YAML mapping of keys, got {type(raw).__name__}")
    raw.pop("base_dir", None)
    return raw


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...],
                    check: Callable[[str], None] | None = None) -> list[tuple[str, str]]:
    """Each ``--set`` (``key=value``) written into ``raw``, in order (``check(key)`` first, if
    given, may refuse a key); the (key, text) pairs, for error lines naming the flag."""
    given: list[tuple[str, str]] = []
    for text in overrides:
        key, value = parse_override(text)
        if check is not None:
            check(key)
        set_dotted(raw, key, value)
        given.append((key, text))
    _policy_override_wins(raw, [k for k, _ in given])
    return given


def _policy_override_wins(raw: dict, keys: list[str]) -> None:
    """A policy set from the command line (``--policy``, ``--set engine.policy=``, ``compare``'s
    runs) replaces the file's ``engine.enable_chunked_prefill``, its other name, rather than
    contradicting it; both set on the command line are still checked against each other."""
    engine = raw.get("engine")
    if ("engine.policy" in keys and "engine.enable_chunked_prefill" not in keys and isinstance(engine, dict)
            and "enable_chunked_prefill" in engine):
        raw["engine"] = {k: v for k, v in engine.items() if k != "enable_chunked_prefill"}


def scenario_from_dict(raw: dict, where: str = "scenario", base_dir: str = ".",
                       overrides: list[tuple[str, str]] | tuple = ()) -> Scenario:
    """The validated scenario; an invalid one is one ``UserError`` line naming ``where`` and the
    key. ``overrides``: (dotted key, its ``key=value`` text) set from the command line (``--set``,
    ``--policy``, ``--chunk``), the last of which the error's key lies in (or under) is named
    too, so a bad flag is not blamed on the file."""
    try:
        return Scenario(**raw, base_dir=base_dir)
    except ValidationError as err:
        raise UserError(_format_error(err, where, overrides)) from None
    except TypeError as err:
        raise UserError(f"{where}: {err}") from None


def _with_flag(where: str, key: str, overrides: list[tuple[str, str]] | tuple) -> str:
    """``where``, and the last command-line override whose key ``key`` lies in or under (or
    the reverse), if any."""
    flag = next((text for k, text in reversed(overrides)
                 if k == key or key.startswith(k + ".") or k.startswith(key + ".")), None)
    return where if flag is None else f"{where} with {short_repr(flag, 60)} from the command line"
