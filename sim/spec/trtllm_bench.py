"""The engine settings ``trtllm-bench throughput`` picks for itself: max_batch_size, max_num_tokens
and max_seq_len from its tuning heuristic, when the user passes none of them, and the CUDA-graph
batch sizes its PyTorch backend then captures.

Why: TensorRT-LLM's perf-overview tables (validation VC-14, VC-15, VC-24) were measured with
``trtllm-bench --model M throughput --dataset D --backend pytorch --extra_llm_api_options
llm_options.yml`` (docs/source/performance/perf-overview.md, v0.21 and v1.0: "Running the
Benchmark"; the yml sets only ``cuda_graph_config``, and "In many cases" adds
``--kv_cache_free_gpu_mem_fraction 0.95``). No ``--max_batch_size`` / ``--max_num_tokens`` is
given, so each row runs with the values trtllm-bench derives from its own dataset, not with one
fixed pair.

The chain, in TensorRT-LLM's source (NVIDIA/TensorRT-LLM, the v0.21-v1.0 files):

- tensorrt_llm/bench/benchmark/throughput.py: the PyTorch path calls ``get_settings(params,
  metadata, ...)`` and then sets ``kwargs["max_seq_len"] = max_seq_len or
  metadata.max_sequence_length`` (the dataset's longest ISL + OSL).
- tensorrt_llm/bench/benchmark/utils/general.py ``get_settings``: unless both
  ``max_batch_size`` and ``max_num_tokens`` are given, ``get_benchmark_engine_settings(
  model_config, quant_config, tp, pp, dataset_metadata.avg_isl, dataset_metadata.avg_osl,
  kv_cache_free_gpu_mem_fraction)``; then, chunked prefill being off (its default),
  ``max_num_tokens = max(max_num_tokens, dataset_metadata.max_isl + max_batch_size)``.
- tensorrt_llm/bench/build/build.py ``get_benchmark_engine_settings``: quantizations in
  ``TUNED_QUANTS`` (NVFP4, FP8, FP8_BLOCK_SCALES, NO_QUANT, None) go to ``calc_engine_setting``;
  any other keeps ``BuildConfig``'s defaults (max_batch_size 2048, max_num_tokens 8192).
- tensorrt_llm/bench/build/tuning.py ``calc_engine_setting`` and ``finetune_setting``:
  transcribed line by line in ``kv_cache_max_requests`` and ``finetune_setting`` below (the
  dense-model branch; the Mamba-hybrid terms are zero for the models here).
- tensorrt_llm/bench/build/utils.py ``get_device_memory``: NVML's total of GPU 0, in GiB; the
  catalogue's ``memory_bytes`` is that figure (sim/catalog/gpus.yaml: nvidia-smi's total).
- tensorrt_llm/bench/build/dataclasses.py ``ModelConfig.get_param_count``: the parameter count
  is ``sum(metadata.parameter_count.values())`` of the checkpoint's safetensors headers, i.e. the
  number of stored ELEMENTS of every dtype (``checkpoint_element_count``). For an NVFP4
  checkpoint that is not the number of weights: two FP4 values share one U8 element, and the
  per-block FP8 scales are elements too. TensorRT-LLM later fixed this ("Fix NVFP4 engine size
  estimation ... in trtllm-bench", PR #13498, 2026); v1.0, which measured VC-24, counts
  elements.

NOTE: the stored copies of these files could not be tied to the v0.21 / v1.0 tags commit by commit.
Every version with ``BYTES_PER_ELEM`` (NVFP4 tuned at 0.5 byte) computes the same numbers for a
dense model (the Mamba-hybrid terms and later MLA branches are zero or unused for Llama); the
earliest tuning.py (``param_count / 1000**3``, FP8 the only narrow type) predates NVFP4 support
and is not modelled. The v0.21 perf-overview's own options file (``cuda_graph_config:
enable_padding``) postdates the ``padding_enabled`` get_settings, which already raised
max_num_tokens for the longest prompt.

The KV cache memory and the engine size here are the heuristic's own estimates, used only to
pick the two limits; the simulated run still sizes its KV cache from its memory model
(sim/spec/memory.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.spec.hardware import GPUSpec
from sim.spec.model_spec import ModelSpec

GIB = 1024 ** 3

# tuning.py BYTES_PER_ELEM: {NO_QUANT: 2.0, FP8: 1.0, FP8_BLOCK_SCALES: 1.0, NVFP4: .5}, keyed
# here by this project's quantization names (sim/spec/quantization.py): None is NO_QUANT, ``fp8``
# the ModelOpt FP8 checkpoints' QuantAlgo.FP8, ``modelopt_fp4`` QuantAlgo.NVFP4.
BYTES_PER_ELEM: dict[str | None, float] = {None: 2.0, "fp8": 1.0, "modelopt_fp4": 0.5}
# tuning.py: ``BYTES_PER_ELEM.get(quant_config.kv_cache_quant_algo, 2)``: an FP8 cache 1 byte,
# anything else 2
KV_BYTES_PER_ELEM: dict[str | None, float] = {"fp8": 1.0}
# build.py DEFAULT_MAX_BATCH_SIZE / DEFAULT_MAX_NUM_TOKENS = BuildConfig.max_batch_size /
# max_num_tokens (tensorrt_llm/builder.py BuildConfig: 2048, 8192): a quantization outside
# TUNED_QUANTS keeps them
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
# the perf-overview's runs: ``--kv_cache_free_gpu_mem_fraction 0.95`` (its "Running the Benchmark")
PERF_OVERVIEW_KV_FRACTION = 0.95
# NVFP4 checkpoints (ModelOpt; vLLM modelopt.py ModelOptNvFp4LinearMethod.create_weights):
# ``weight`` U8 [out, in/2] (two FP4 values per element), ``weight_scale`` F8_E4M3 [out, in/16]
NVFP4_VALUES_PER_ELEMENT = 2
NVFP4_BLOCK = 16


# The perf-overview's llm_options.yml (docs/source/performance/perf-overview.md, v0.21 and v1.0,
# "Running the Benchmark", dense models): ``cuda_graph_config: enable_padding: true, batch_sizes:
# [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192]``
PERF_OVERVIEW_CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class BenchSettings:
    """What one trtllm-bench run gives the engine: its scheduler's two limits, max_seq_len, and
    the largest decode batch its PyTorch backend replays a CUDA graph for (a row's
    ``engine.overhead.cuda_graph_max_batch``)."""

    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    cuda_graph_max_batch: int


def filter_cuda_graph_batch_sizes(batch_sizes: tuple[int, ...], max_batch_size: int, max_num_tokens: int,
                                  max_draft_len: int, enable_padding: bool) -> list[int]:
    """The decode batch sizes the PyTorch backend captures CUDA graphs for, of the sorted
    ``batch_sizes`` asked: tensorrt_llm/_torch/pyexecutor/model_engine.py
    ``_filter_cuda_graph_batch_sizes`` (v0.21-v1.0), line by line. A pure decode batch holds at
    most ``min(max_batch_size, int(max_num_tokens / (1 + max_draft_len)))`` requests; sizes above
    it are dropped, except that with padding the first one above it is replaced by that bound
    ("if the user is OK padding to a batch size B, they should also be OK with padding to some
    size B' < B"). PyTorchModelEngine keeps the result as ``_cuda_graph_batch_sizes`` and its
    last entry as ``_max_cuda_graph_batch_size``: a decode-only batch above it runs eager
    (``_get_padded_batch`` returns no padding past it, ``_maybe_get_cuda_graph`` finds no graph)."""
    max_cuda_graph_bs = min(max_batch_size, int(max_num_tokens / (1 + max_draft_len)))
    result: list[int] = []
    for i, bs in enumerate(batch_sizes):
        if bs <= max_cuda_graph_bs:
            result.append(bs)
        else:
            if enable_padding and (i == 0 or result[i - 1] != max_cuda_graph_bs):
                result.append(max_cuda_graph_bs)
            break
    return result


def checkpoint_element_count(model: ModelSpec) -> int:
    """``sum(metadata.parameter_count.values())`` of the checkpoint's safetensors (build/
    dataclasses.py ``get_param_count``): elements stored, every dtype. Unquantized and FP8
    checkpoints store one element per weight (FP8: F8_E4M3 linear weights); NVFP4 stores each
    linear weight matrix as ``in/2`` U8 elements per output row plus ``in/16`` FP8 block scales.
    The embedding, LM head and norms stay one element per weight in every format.
    NOTE: the per-tensor scalars (weight_scale_2 / input_scale / k_scale / v_scale, a handful per
    layer) are left out: under 1e-6 of the count, they move no limit's rounding."""
    lin = model.quantized_params
    rest = model.num_params - lin
    if model.quantization == "modelopt_fp4":
        return rest + lin // NVFP4_VALUES_PER_ELEMENT + lin // NVFP4_BLOCK
    return model.num_params


def kv_cache_max_requests(element_count: int, bytes_per_elem: float, kv_bytes_per_elem: float,
                          num_layers: int, num_kv_heads: int, head_dim: int, gpu_memory_gib: float,
                          tp: int, pp: int, target_input_len: int, target_output_len: int,
                          kv_fraction: float) -> float:
    """tuning.py ``calc_engine_setting`` up to ``kv_cache_max_requests``, line by line:

    - ``adjusted_num_kv_heads = max(tp_size, model_config.num_key_value_heads)``
    - ``byte_per_token = 2 * num_attention_layers * adjusted_num_kv_heads * head_size *
      byte_per_kv_elem / (1024 ** 3)`` (GiB per token, the whole TP group)
    - ``n_gpus = tp_size * pp_size``
    - ``engine_size = model_config.param_count * byte_per_elem / (1024**3)``
    - ``total_gpu_memory = get_device_memory() * n_gpus``
    - ``available_memory = total_gpu_memory - engine_size``
    - ``target_seq_len = target_input_len + target_output_len``
    - ``cache_memory = available_memory * kv_cache_gpu_mem_fraction``
    - ``kv_cache_max_requests = cache_memory / (byte_per_token * target_seq_len + 0)`` (the
      Mamba cache term is 0 for a model without Mamba layers)
    """
    adjusted_num_kv_heads = max(tp, num_kv_heads)
    gib_per_token = 2 * num_layers * adjusted_num_kv_heads * head_dim * kv_bytes_per_elem / GIB
    n_gpus = tp * pp
    engine_size_gib = element_count * bytes_per_elem / GIB
    total_gpu_memory_gib = gpu_memory_gib * n_gpus
    available_gib = total_gpu_memory_gib - engine_size_gib
    target_seq_len = target_input_len + target_output_len
    cache_gib = available_gib * kv_fraction
    return cache_gib / (gib_per_token * target_seq_len)


def _round_up(value: float, floor: int, bands: tuple[tuple[float, int], ...]) -> int:
    """``value`` rounded up to a multiple of the step of the first band it lies below, and at
    least ``floor``: finetune_setting's two ladders (if value < 256: max(64, 32 * ceil(value /
    32)); elif < 1024: 128 * ceil(...); else 256 * ceil(...), and 2048 / 256, 512, 1024 for
    tokens; above the first band the floor never binds, so applying it throughout is the same)."""
    step = next(s for below, s in bands if value < below)
    return max(floor, step * math.ceil(value / step))


def finetune_setting(kv_cache_max_requests: float, input_len: int, output_len: int,
                     pp: int) -> tuple[int, int]:
    """tuning.py ``finetune_setting`` with optimistic tuning (every model but a Mamba hybrid),
    line by line, its two rounding ladders through ``_round_up``: (max_batch_size, max_num_tokens)."""
    # "Cap total batch size to avoid decoder buffer size becoming too large."
    raw_bs = min(kv_cache_max_requests, 4096) / pp
    # "Cap num tokens to avoid TRT activation buffer becoming too large."
    raw_token = min(raw_bs * (1 + input_len / output_len), 32768)
    # "Set min BS to be 64."
    max_bs = _round_up(raw_bs, 64, ((256, 32), (1024, 128), (math.inf, 256)))
    # "Set min to 2048 to ensure Ctx/Gen overlap efficiency"
    max_token = _round_up(raw_token, 2048, ((4096, 256), (8192, 512), (math.inf, 1024)))
    return max_bs, max_token


def trtllm_bench_settings(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int, kv_cache_dtype: str | None,
                          avg_isl: int, avg_osl: int, max_isl: int, max_seq_len: int,
                          kv_fraction: float = PERF_OVERVIEW_KV_FRACTION,
                          chunked_prefill: bool = False) -> BenchSettings:
    """The settings ``trtllm-bench throughput --backend pytorch`` runs ``model`` (its
    ``quantization`` the checkpoint's) with on ``tp`` x ``pp`` ``gpu``s for a dataset of
    average lengths ``avg_isl`` / ``avg_osl``, longest prompt ``max_isl`` and longest
    ISL + OSL ``max_seq_len``, no limit given on the command line (module docstring)."""
    if model.quantization in BYTES_PER_ELEM:  # build.py: ``quant_algo in TUNED_QUANTS``
        requests = kv_cache_max_requests(
            checkpoint_element_count(model), BYTES_PER_ELEM[model.quantization],
            KV_BYTES_PER_ELEM.get(kv_cache_dtype, 2.0), model.num_layers, model.num_kv_heads,
            model.head_dim, gpu.memory_bytes / GIB, tp, pp, avg_isl, avg_osl, kv_fraction)
        max_bs, max_tokens = finetune_setting(requests, avg_isl, avg_osl, pp)
    else:
        max_bs, max_tokens = DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_NUM_TOKENS
    if not chunked_prefill:
        # general.py: "If chunked prefill is disabled, we need to ensure that the max_num_tokens
        # is at least the max_isl"
        max_tokens = max(max_tokens, max_isl + max_bs)
    # CUDA graphs: get_settings gives ``cuda_graph_config`` padding on and ``max_batch_size`` the
    # run's max_batch_size (CudaGraphConfig then generates sizes ending at it:
    # llmapi/llm_args.py ``_generate_cuda_graph_batch_sizes`` appends max_batch_size); the
    # perf-overview's --extra_llm_api_options file replaces that cuda_graph_config with its own
    # list (llm_args.py ``update_llm_args_with_extra_dict``: the file's fields override). Either
    # way the engine keeps the sizes up to its own max_batch_size and max_num_tokens and, padding
    # on, pads to that bound (``filter_cuda_graph_batch_sizes``): every decode batch the engine
    # can schedule replays a graph. No speculative decoding in these runs (draft length 0).
    graphs = filter_cuda_graph_batch_sizes(PERF_OVERVIEW_CUDA_GRAPH_BATCH_SIZES, max_bs, max_tokens, 0, True)
    return BenchSettings(max_bs, max_tokens, max_seq_len, graphs[-1] if graphs else 0)
