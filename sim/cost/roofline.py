"""Roofline step-cost model: each operator takes max(compute time, memory time).

Why: an operator cannot run faster than its FLOPs at peak nor its bytes at peak bandwidth
(Williams, Waterman, Patterson 2009, "Roofline", CACM 52(4)). Prefill GEMMs are compute
bound, decode GEMMs and attention are bandwidth bound; the max() gives both regimes from one
formula. Achieved fractions of peak are named constants here (``Efficiencies``); with a
``calibration`` (``sim/cost/calibration.py``, fitted from measured kernels by ``simsrv
calibrate``) each calibrated operator takes ``raw roofline bound / measured efficiency(shape)``
instead (``sim/cost/calibrated.py``).

All quantities are per GPU of a tensor-parallel group (Megatron-LM sharding, Shoeybi et al.
2019: attention heads and MLP columns split across ``tp`` GPUs, two all-reduces per layer; the
LM head's columns over the vocabulary, its logits all-gathered before sampling, charged with the
all-reduces: ``_logits_gather_s``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from sim.core.batch import Batch, BatchValues
from sim.cost.arch import arch_shapes, moe_mlp_s, windowed_context, windowed_pairs
from sim.cost.attention_backend import get_backend
from sim.cost.calibrated import CalibratedDecodeAttention, CalibratedOps
from sim.cost.calibration import Calibration, carried_from, load_calibration
from sim.cost.decode_attention import DecodeAttention, NoDecodes, RooflineDecodeAttention
from sim.cost.engine_profile import EngineProfile, get_profile
from sim.cost.runs import FnCurve, RunCost, StepCurve, affine_steps, run_sum_s
from sim.cost.shapes import custom_allreduce_link_bytes, uses_custom_allreduce
from sim.cost.collectives import multinode_allgather_s, multinode_allreduce_s
from sim.cost.nccl_tuning import LINK_NVLINK, LINK_PCI
from sim.cost.nccl_tuning import allgather_s as nccl_allgather_within_node_s
from sim.cost.nccl_tuning import allreduce_s as nccl_allreduce_within_node_s
from sim.spec.hardware import GPUSpec
from sim.spec.nodes import NodeLinks
from sim.spec.model_spec import ModelSpec
from sim.spec.quantization import get_quantization

OPS = (
    "gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "attn_prefill", "attn_decode",
    "elementwise", "allreduce", "lm_head", "sampling", "overhead",
)
ATTN_DECODE = OPS.index("attn_decode")  # the only operator whose cost changes along a decode run
# A NamedTuple with every field given, built without its generated __new__ (a Python call per
# step on the hot path): what ``NamedTuple._make`` does, without the length check.
_new: Final = tuple.__new__
# _PLUS_OVERHEAD: a step's seconds from its GPU seconds g and the engine's (cpu, launch) terms
# (``_host``) are ``g + EngineProfile.overhead_fn(...)(g)``: g + (max(g, launch, cpu) - g) for an
# engine overlapping its CPU work with the GPU, g + (cpu + max(g, launch) - g) for a serial one.
# The per-step path (``run_cost``, ``_run_step_fn``'s step function) writes that out instead of
# calling the function (once or more per step): max(a, b, c) as ``m = b if b > a else a`` then
# ``c if c > m else m``, which is what ``max`` returns (it keeps the first of equals), with the
# same additions in the same order: the same floats to the bit.


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of peak reached by real kernels (defaults until calibrated).

    NOTE: GEMM compute 0.85 is aiconfigurator's measured large-shape H100 GEMM (875/989
    TFLOP/s, kernels_profile/hardware.md); memory 0.8 is aiconfigurator's bandwidth factor;
    FlashAttention-2 reaches about 50-70% of peak in the forward pass (Dao 2023).
    """

    gemm_compute: float = 0.85
    attn_compute: float = 0.6
    memory: float = 0.8
    link: float = 0.8
    # one NCCL call's latency where a collective spans nodes (sim/cost/collectives.py) and an
    # expert all-to-all's synchronisation: aiconfigurator p2p_latency, NCCL launch + sync
    allreduce_latency_s: float = 10e-6
    # an NCCL all-reduce within a node without a measured table: NCCL's own tuning model
    # (sim/cost/nccl_tuning.py); off, the ring's bytes plus ``allreduce_latency_s`` (``ideal``: 0)
    nccl_tuning: bool = True
    # vLLM custom all-reduce under CUDA graphs: the measured small-buffer floor at 8 GPUs is
    # 5.7 us on A100, 4.7 us on H100 (aiconfigurator custom_allreduce_perf, kernels_profile/)
    custom_allreduce_latency_s: float = 5e-6
    # Shortest time of one kernel on the roofline path (launch, ramp-up, tail under CUDA
    # graphs): the shortest kernels measured on every catalogue GPU take 1.7-2.5 us
    # (aiconfigurator GEMMs at m = 1 on tiny weights; vidur residual adds 1-2 us; kernels_profile/).
    # NOTE: applied per kernel to operators without a calibrated table.
    kernel_floor_s: float = 2e-6


@dataclass(frozen=True)
class StepCost:
    """Seconds per operator class for one step (summed over layers), and their total."""

    ops_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.ops_s.values())


class _Fixed(NamedTuple):
    """A batch's operators but decode attention and the overhead: they stay fixed along a run."""

    before: tuple[float, ...]  # OPS before decode attention (GEMMs, prefill attention)
    after: tuple[float, ...]   # OPS after it, but the overhead (elementwise, all-reduce and the logits' gather, LM head, sampling)
    head: float                # sum(before)
    tail: float                # sum(after)
    flag: bool                 # a calibrated operator's shape lies outside its table
    lm_flag: bool              # the LM head's does


class _Step:
    """Everything ``run_cost`` needs of a batch shape (decode sequences, sampled positions,
    prompt chunks) but its decode context: the ``_Fixed`` terms (head: the operators before
    decode attention; elem, ar, lm, sampling: ``_Fixed.after`` one by one, summed after decode
    attention in order; flag, lm_flag), decode attention as a function of the context
    (``_decode_fn``), the engine's (cpu, launch) seconds (``_host``; ``has_host`` False: a step
    of no tokens), (seqs, seqs) when ``_host`` says outside its range, and the run's step
    functions (``_run_step_fn`` of a decode-only batch; None: built per call). An object with
    typed fields, not a tuple (compiled, sim/compiled_core.py, the per-step read of a memoised
    shape is a field read each, where a tuple's items were unboxed and type-checked one by one)."""

    __slots__ = ("head", "elem", "ar", "lm", "sampling", "flag", "lm_flag", "decode", "has_host", "cpu", "launch",
                 "outside", "run_fns")

    def __init__(self, head: float, elem: float, ar: float, lm: float, sampling: float, flag: bool, lm_flag: bool,
                 decode: DecodeAttention, host: tuple[float, float] | None, outside: tuple[int, int] | None,
                 run_fns: _RunStep | None) -> None:
        self.head, self.elem, self.ar, self.lm, self.sampling = head, elem, ar, lm, sampling
        self.flag, self.lm_flag = flag, lm_flag
        self.decode = decode
        self.has_host = host is not None
        self.cpu, self.launch = host if host is not None else (0.0, 0.0)
        self.outside = outside
        self.run_fns = run_fns


# ``run_cost_values``: RunCost's fields as a plain tuple (the same reason)
RunCostValues = tuple[float, float, int, bool, bool, float, tuple[int, int] | None]

# the tuple class the public ``run_cost`` builds, as a constant (compiled, a class imported or
# defined at module level is otherwise looked up in the module's dict at each use)
_RunCost: Final = RunCost


_BITS_11: Final = 1 << 11
_BITS_12: Final = 1 << 12
_BITS_16: Final = 1 << 16
_BITS_33: Final = 1 << 33


def step_key(n: int, num_logits: int, chunks: tuple[tuple[int, int], ...]) -> int | tuple[int, int, tuple]:
    """``RooflineCostModel._step``'s memo key of a batch shape (``n`` decodes, ``num_logits``
    sampled positions, prompt chunks of c new tokens after x cached): without chunks, sampling
    every decode, the int n >= 0; for one chunk, with n < 2**11, num_logits n or n + 1,
    c < 2**16 and x < 2**33, the negative int -1 - (x << 28 | c << 12 | n << 1 | num_logits - n)
    (one to one on that range: the fields' bits do not overlap); else the tuple (n, num_logits,
    chunks). Compiled (sim/compiled_core.py), hashing and comparing a nested tuple was ~540
    instructions a look-up; every operation here stays on mypyc's fast path (shifts whose
    result fits 62 bits, no product)."""
    if not chunks:
        return n if num_logits == n else (n, num_logits, chunks)
    if len(chunks) == 1 and 0 <= n < _BITS_11 and 0 <= num_logits - n <= 1:
        c, x = chunks[0]
        if 0 < c < _BITS_16 and 0 <= x < _BITS_33:
            return -1 - ((x << 28) | (c << 12) | (n << 1) | (num_logits - n))
    return (n, num_logits, chunks)


def chunk_key(n: int, c: int, x: int) -> int | tuple[int, int, int]:
    """``RooflineCostModel._chunk_attn``'s memo key of a chunk of c new tokens after x cached
    among n chunks: with n < 2**12, c < 2**16 and x < 2**33, the int x << 28 | c << 12 | n
    (one to one on that range: the fields' bits do not overlap); else the tuple (n, c, x)
    (compiled, hashed and compared at a fraction of a tuple's cost, as ``step_key``)."""
    if 0 <= n < _BITS_12 and 0 <= c < _BITS_16 and 0 <= x < _BITS_33:
        return (x << 28) | (c << 12) | n
    return (n, c, x)


class _RunStep(StepCurve):
    """A decode run's step seconds as a function of its total decode context
    (``_run_step_fn``): every kernel but decode attention (``rest``) is fixed along a run; the
    engine overhead follows the GPU time (``_host``'s cpu and launch seconds, written out as
    ``_PLUS_OVERHEAD`` for an overlapping engine and for a serial one). ``kinked`` says whether
    the GPU time at a context has overtaken the engine profile's ``knee``; ``has_knee`` is
    False where the other kernels alone reach it (no knee to find along the run). A shape
    outside a calibrated table sets the model's ``_flag``, as every costing does.
    (A class, not two closures: compiled, sim/compiled_core.py, calling ``at`` is native.)"""

    __slots__ = ("model", "rest", "attn", "cpu", "launch", "knee", "overlap", "has_knee")

    def __init__(self, model: RooflineCostModel, rest: float, attn: DecodeAttention, cpu: float, launch: float,
                 knee: float, overlap: bool) -> None:
        self.model, self.rest, self.attn = model, rest, attn
        self.cpu, self.launch, self.knee, self.overlap = cpu, launch, knee, overlap
        self.has_knee = not rest >= knee

    def at(self, context_tokens: int) -> float:
        t, out = self.attn.at(context_tokens)
        if out:
            self.model._flag = True
        g = self.rest + t
        cpu, launch = self.cpu, self.launch
        if self.overlap:
            m = launch if launch > g else g
            return g + ((cpu if cpu > m else m) - g)
        return g + (cpu + (launch if launch > g else g) - g)

    def kinked(self, context_tokens: int) -> bool:
        t, out = self.attn.at(context_tokens)
        if out:
            self.model._flag = True
        return self.rest + t >= self.knee


class RooflineCostModel:
    """Per-step time of a batch on one replica of ``tp`` GPUs."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, kv_dtype_bytes: int | None = None,
                 eff: Efficiencies | None = None, weight_dtype_bytes: int | None = None,
                 calibration: Calibration | None = None, engine: EngineProfile | None = None,
                 enable_expert_parallel: bool = False, expert_load_imbalance: float = 1.0, dp: int = 1,
                 nodes: NodeLinks | None = None):
        self.model, self.gpu, self.tp = model, gpu, tp
        # Nodes the TP group spans (sim/spec/nodes.py: TP innermost); beyond one, its all-reduces
        # are NCCL's rings or trees through the network (sim/cost/collectives.py)
        self.nodes = nodes
        self.tp_nodes = 1 if nodes is None else nodes.nodes(tp)
        self._num_layers = model.num_layers
        self._hbm_bw: float = gpu.hbm_bw_bytes_per_s
        # EP size = TP x DP (vLLM FusedMoEParallelConfig: ep_size = dp_size x tp_size)
        self.ep = tp * dp if enable_expert_parallel and model.num_experts > 1 else 1
        self.expert_load_imbalance = expert_load_imbalance
        # Host-side step cost of the serving engine (sim/cost/engine_profile.py).
        self.engine = engine or get_profile()
        # speculative decoding (sim/cost/speculative.py SpeculativeCost): prices a step with
        # decodes in place of ``run_cost_values``; None: off
        self.spec_run: Callable[[BatchValues], RunCostValues] | None = None
        self.eff = eff or Efficiencies()
        # the GPU-to-GPU link's kind in NCCL's tuning model: NVLink (or another direct GPU link)
        # where it is faster than the GPU's PCIe, else PCI (sim/cost/nccl_tuning.py)
        self._nccl_link: int = LINK_NVLINK if gpu.nvlink_bw_bytes_per_s > gpu.pcie_bw_bytes_per_s else LINK_PCI
        m, e = model, self.eff
        self.dtype_bytes = weight_dtype_bytes or m.dtype_bytes
        self.kv_dtype_bytes = kv_dtype_bytes or m.dtype_bytes
        self.flops_s = gpu.bf16_flops_per_s
        # Weight quantization (sim/spec/quantization.py): the linear layers' weight bytes, and the
        # tensor-core peak their GEMMs run at, as a factor on their FLOPs so the calibrated
        # bf16 efficiency tables apply to the quantized bound (NOTE: fp8/int8 GEMM kernels are
        # assumed to reach the same fraction of their peak at a shape as bf16 ones do).
        q = get_quantization(m.quantization)
        self.quant = q
        self.linear_weight_bytes = m.linear_weight_bytes_per_param
        qpeak = self.flops_s if q is None else q.gemm_peak_flops_per_s(gpu)
        self.quant_flop_mult = 1.0 if qpeak == self.flops_s else self.flops_s / qpeak
        # mxfp4 stores the routed experts alone quantized (the attention, dense and shared-expert
        # GEMMs stay bf16: vLLM Mxfp4Config gives LinearBase the UnquantizedLinearMethod)
        self._quant_dense = q is not None and not q.experts_only
        self.mem_bw = gpu.hbm_bw_bytes_per_s * e.memory
        self.heads = m.num_heads / tp
        self.q_dim = m.q_size / tp
        self.kv_dim: float = float(max(1, m.num_kv_heads // tp) * m.head_dim)  # KV heads replicate when tp > H_kv
        self.mlp_dim = m.intermediate_size / tp
        # Linear layers as (input width, output width) per GPU.
        h = m.hidden_size
        hf = float(h)
        self._qkv: tuple[float, float] = (hf, self.q_dim + 2 * self.kv_dim)
        self._o: tuple[float, float] = (self.q_dim, hf)
        self._up: tuple[float, float] = (hf, 2 * self.mlp_dim)  # fused gate+up of a gated MLP
        self._eup: tuple[float, float] = (hf, 2 * self.mlp_dim)
        self._edown: tuple[float, float] = (self.mlp_dim, hf)
        self._shared: tuple[tuple[float, float], tuple[float, float]] | None = None
        self._slide: tuple[float, int] | None = None  # sim/cost/arch.py sets the MLA, MoE and window shapes
        self._down = (self.mlp_dim, h)
        self._lm = (h, m.vocab_size / tp)
        # Attention FLOPs per (query, key) pair per layer per GPU: QK^T over the q/k head width
        # and PV over the v width, 2 FLOPs per multiply-add (Dao 2023); MLA changes the widths
        # and reads decompressed K/V in prefill (sim/cost/arch.py ``mla_attention``).
        self._prefill_pair_flops: float = 4.0 * self.heads * m.head_dim
        self._decode_pair_flops: float = self._prefill_pair_flops
        self._ctx_upproj_flops = 0.0  # MLA: FLOPs per cached context token of a prefill chunk
        self._prefill_kv_bytes = 0.0  # set by MLA; else (0 here) the cache's K and V
        arch_shapes(self, m, h, tp)
        # KV bytes per cached token per layer per GPU (PagedAttention: K and V).
        self.kv_layer_bytes = 2 * self.kv_dim * self.kv_dtype_bytes
        # K and V bytes a prefill chunk's attention reads per key token (MLA: decompressed heads)
        if not self._prefill_kv_bytes:
            self._prefill_kv_bytes = self.kv_layer_bytes
        # Elementwise bytes per token per layer: 2 RMSNorms (read+write h), 2 residual adds
        # (2 reads + 1 write of h), rotary on q,k (read+write), SiLU*gate (read 2I, write I),
        # KV-cache write (k and v).
        self.elem_layer_bytes = self.dtype_bytes * (
            4 * h + 6 * h + 2 * (self.q_dim + self.kv_dim) + 3 * self.mlp_dim + 2 * self.kv_dim
        )
        # the same traffic per kernel (bytes per token): norm, norm, add, add, rotary, activation, KV write
        self._elem_kernel_bytes = tuple(self.dtype_bytes * x for x in (
            2 * h, 2 * h, 3 * h, 3 * h, 2 * (self.q_dim + self.kv_dim), 3 * self.mlp_dim, 2 * self.kv_dim))
        # (qkv, o, mlp_up, mlp_down seconds, whether a GEMM lies outside its measured table) by
        # token count: the flag is memoised with the seconds, so a warm memo notes what a cold
        # one does (a run's flags must not depend on what was costed before it)
        self._gemm_cache: dict[int, tuple[float, float, float, float, bool]] = {}
        self._tok_cache: dict[int, tuple[float, float, bool]] = {}
        self.calibration = calibration
        # Operators this GPU's profile lacks, carried from another GPU's measured curve
        # ({operator: donor GPU}; ``simsrv_calibration_carried_from`` in result.json).
        self.carried_from = carried_from(calibration)
        donor = load_calibration(self.carried_from["elementwise"]) if "elementwise" in self.carried_from else None
        fp8 = q is not None and q.compute == "fp8" and bool(gpu.fp8_flops_per_s)  # fp8 W8A8 GEMMs
        # NVFP4 W4A4 GEMMs on FP4 tensor cores (their own measured table where the GPU has one)
        nvfp4 = q is not None and q.compute == "fp4" and bool(gpu.fp4_flops_per_s)
        # the engine's attention kernels (sim/cost/attention_backend.py) and the KV heads of their
        # decode tiles: the model's per GPU, or its query heads for one block per query head
        backend = get_backend(self.engine.attention_backend)
        kv_heads = self.kv_dim / m.head_dim
        decode_kv_heads = backend.decode_tile_kv_heads(self.heads, kv_heads, self.kv_dtype_bytes)
        # FP8 context FMHA: TensorRT-LLM turns it on with FP8 (or NVFP4) quantization and an fp8
        # KV cache on SM >= 89 (NVIDIA/TensorRT-LLM tensorrt_llm/builder.py ``build``, "Logics to
        # control paged_context_fmha and fp8_context_fmha": disabled unless quant_algo is FP8,
        # W4A8_AWQ or NVFP4, disabled below Ada/Hopper, and enabled "to support FP8 Paged Context
        # FMHA" when the KV cache is fp8), in the releases that have it (the profile's
        # ``fp8_context_fmha``: not v0.5-v0.7, trt-llm-2023); only a backend with its own tables
        # has such a table
        fp8_context = (q is not None and q.compute in ("fp8", "fp4") and self.kv_dtype_bytes <= 1
                       and bool(gpu.fp8_flops_per_s) and self.engine.fp8_context_fmha)
        # The engine's own attention tables time its MHA/GQA kernels (head_dim 128, K and V per KV
        # head); an MLA model's attention runs other kernels (TensorRT-LLM's and FlashInfer's MLA
        # paths over the 576-wide latent; aiconfigurator measures them in separate mla tables),
        # so it keeps the main tables' pricing (sim/cost/arch.py ``mla_attention``).
        engine_tables = "" if m.is_mla else backend.tables
        self.cops = None if calibration is None else CalibratedOps(
            calibration, elem_donor=donor, fp8=fp8, nvfp4=nvfp4, fp8_kernel=self.engine.fp8_gemm, linear_shapes={"qkv": self._qkv, "o": self._o, "up": self._up, "down": self._down,
                                        "lm": self._lm},
            heads=self.heads, kv_heads=kv_heads, head_dim=m.head_dim, hidden=h, q_dim=self.q_dim,
            kv_dim=self.kv_dim, mlp_dim=self.mlp_dim, num_layers=m.num_layers, tp=tp, dtype_bytes=self.dtype_bytes,
            peak_flops_per_s=self.flops_s, hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s,
            link_bw_bytes_per_s=gpu.nvlink_bw_bytes_per_s, fp8_peak_flops_per_s=gpu.fp8_flops_per_s or 0.0,
            fp4_peak_flops_per_s=gpu.fp4_flops_per_s or 0.0, decode_kv_heads=decode_kv_heads,
            attn_tables=engine_tables, kv_8bit=self.kv_dtype_bytes <= 1, fp8_context=fp8_context)
        # the calibrated prefill attention's peak: FP8 context FMHA's table is measured against
        # the FP8 peak (sim/cost/fit.py ``bounds_s``), the others against bf16's
        self._prefill_peak: float = self.flops_s
        if self.cops is not None and self.cops.prefill_fp8 and gpu.fp8_flops_per_s:
            self._prefill_peak = gpu.fp8_flops_per_s
        self._gemm_cal = self.cops is not None and self.cops.gemm_curves is not None
        self._prefill_cal = self.cops is not None and self.cops.prefill_grid is not None
        # fp8 W8A8 on a GPU with FP8 tensor cores and a measured fp8 GEMM table
        self._fp8_cal = self.cops is not None and self.cops.fp8_curves is not None
        # NVFP4 W4A4 on a GPU with FP4 tensor cores and a measured NVFP4 GEMM table
        self._fp4_cal = self.cops is not None and self.cops.nvfp4_curves is not None
        # NOTE: the model is pure: a public call returns its flags with its durations. These two
        # are scratch registers of one synchronous call (reset on entry, never read afterwards):
        # an operator outside the measured range of its table sets them.
        self._flag = False      # the step's shape lies outside a calibrated table
        self._lm_flag = False   # the LM head's does (reported once per run, not per step)
        # How many times a decode step streams each cached K/V byte under the engine's attention
        # kernels (sim/cost/attention_backend.py): once, or once per query head of a GQA group
        # (TensorRT-LLM's pre-XQA masked multi-head attention). NOTE: an 8-bit cache's re-reads
        # are charged at HBM bandwidth, as the XQA blog's measured 2.4x gap on Llama-70B / H200
        # implies; a 16-bit cache's at the L2's read bandwidth where the GPU's is published.
        l2_bw = gpu.l2_read_bw_bytes_per_s
        hbm_per_l2 = 1.0 if l2_bw is None else gpu.hbm_bw_bytes_per_s / l2_bw
        self.decode_kv_reads = backend.decode_kv_read_factor(self.heads, kv_heads, self.kv_dtype_bytes, hbm_per_l2)
        # Decode attention is looked up on the table of the kernel's own shape (``decode_kv_heads``,
        # CalibratedOps): a kernel that folds a query-head group into one tile at the model's KV
        # heads and at the context of equal bytes in the tables' KV dtype; one of one block per
        # (sequence, query head) as the MHA kernel it is, at batch x query heads blocks, at the
        # context itself: its threads load 16 bytes of the compute type, an 8-bit cache as many
        # elements in half the bytes, so a block runs the loads and iterations of a 16-bit cache
        # of that context (decoderMaskedMultiheadAttentionTemplate.h K_VEC_SIZE = 16 / sizeof(T);
        # vLLM 0.2 paged_attention VEC_SIZE by scalar_t). The bytes charged stay the cache's.
        # A decode table measured with the 8-bit cache itself (an engine's ``_fp8kv`` table) is
        # looked up at the context too.
        self._kv_scale = 1.0 if backend.per_query_head_blocks(self.kv_dtype_bytes) or (
            self.cops is not None and self.cops.decode_8bit_table) else self.kv_dtype_bytes / self.dtype_bytes
        self._chunk_cache: dict[int | tuple[int, int, int], tuple[float, bool]] = {}  # calibrated prefill attention
        # the TTFT split's memo of chunks' seconds alone (``prefill_alone_s``, by
        # sim/core/ttft.py ``solo_key``), shared by every replica that shares this model
        # (sim/engine/cluster.py ``RooflineSolo``): its entries are pure functions of the key
        self.solo_cache: dict[int | tuple[int, int, bool], float] = {}
        self._lm_cache: dict[int, tuple[float, bool]] = {}
        self._gather_cache: dict[int, float] = {}  # the logits' all-gather by sampled positions
        # Memoised per batch shape (the per-step path, sim/engine/cluster.py): everything but
        # decode attention and the overhead (``_fixed``), decode attention as a function of the
        # context (``_decode_fn``) and the engine's host terms (``_host``).
        self._fixed_cache: dict[tuple[int, int], _Fixed] = {}
        self._token_cache: dict[int, tuple[float, float, float, float, float, float, bool]] = {}
        self._logit_cache: dict[int, tuple[float, float, bool]] = {}
        self._run_fns: dict[tuple[int, int], _RunStep] = {}
        self._decode_fns: dict[int, DecodeAttention] = {}
        self._host_cache: dict[int, tuple[Callable[[float], float], float, bool, tuple[float, float]]] = {}
        # run_cost's, per batch shape (decodes, sampled positions, chunks), keyed by ``step_key``
        # (an int for the frequent shapes: cheaper to hash and compare than a tuple)
        self._step_cache: dict[int | tuple[int, int, tuple], _Step] = {}
        self._overlap_cpu = self.engine.overlap_cpu  # (_PLUS_OVERHEAD)
        self._alone_tail: float | None = None  # prefill_alone_s's LM head, sampling and logits' gather of one position
        # _piece's cut at the decode table's nodes and FA2's split changes (``decode_smooth_end``
        # of these ops; None: no decode table). (The ops, not their bound method: compiled, a
        # native call.)
        self._smooth_ops: CalibratedOps | None = \
            self.cops if self.cops is not None and self.cops.decode_grid is not None else None

    @classmethod
    def ideal(cls, model: ModelSpec, gpu: GPUSpec, tp: int = 1, kv_dtype_bytes: int | None = None,
              bound: str = "both", **kwargs) -> "RooflineCostModel":
        """The same operators at 100% of the vendor peaks, no engine overhead, no latency terms:
        each operator's time is its pure roofline bound. ``bound="compute"`` gives FLOPs / peak
        only (bandwidths made unlimited), ``"memory"`` bytes / HBM bandwidth only (peaks made
        unlimited). ``simsrv explain`` reads its floors from these, so they count exactly what
        the simulator's steps count (e.g. the LM head on sampled positions only)."""
        from dataclasses import replace as _replace

        inf = float("inf")
        if bound == "compute":
            gpu = _replace(gpu, hbm_bw_bytes_per_s=inf, nvlink_bw_bytes_per_s=inf)
        elif bound == "memory":
            gpu = _replace(gpu, bf16_flops_per_s=inf, fp8_flops_per_s=inf, int8_ops_per_s=inf, fp4_flops_per_s=inf,
                           nvlink_bw_bytes_per_s=inf)
        eff = Efficiencies(gemm_compute=1.0, attn_compute=1.0, memory=1.0, link=1.0, allreduce_latency_s=0.0,
                           nccl_tuning=False, custom_allreduce_latency_s=0.0, kernel_floor_s=0.0)
        nodes = kwargs.get("nodes")
        if nodes is not None:  # the network as the GPU's own links: no latency; unlimited off the "both" bound
            kwargs["nodes"] = _replace(nodes, inter_latency_s=0.0,
                                       inter_bytes_per_s=nodes.inter_bytes_per_s if bound == "both" else inf)
        return cls(model, gpu, tp, kv_dtype_bytes, eff, **kwargs)

    # -- operators ------------------------------------------------------------------------------
    def _linear_s(self, tokens: float, shape: tuple[float, float], weight_reads: float = 1.0,
                  flop_mult: float = 1.0, name: str | None = None, expert: bool = False) -> float:
        """A GEMM of ``tokens`` x in -> out: 2*T*in*out FLOPs; weights + activations in bytes.
        A quantized linear layer (not the LM head) costs the bf16 GEMM of its shape times the
        ratio of its roofline bound to the bf16 one (fewer weight bytes; fp8/int8 peak for
        W8A8). NOTE: the quantized kernel is assumed to reach the fraction of its roofline that
        the measured bf16 kernel reaches at that shape. ``expert``: a routed expert's GEMM."""
        fin, fout = shape
        flops = 2.0 * tokens * fin * fout * flop_mult
        if self._fp4_cal and name != "lm":
            # NVFP4 W4A4 with a measured NVFP4 GEMM table: weights and activations at 4.5 bits
            # (the input quantized per 16 values, modelopt.py ``scaled_fp4_quant``), bf16 out
            wb = self.linear_weight_bytes
            b4 = fin * fout * weight_reads * wb + tokens * (fin * wb + 2.0 * fout) * flop_mult
            cops = self.cops
            assert cops is not None  # (_fp4_cal; typed: compiled, a native call)
            t, out = cops.linear_nvfp4_s(name, tokens, flops, b4)
            if out:
                self._flag = True
            return t
        if self._fp8_cal and name != "lm":
            # fp8 W8A8 with a measured fp8 GEMM table: 1-byte activations in and weights, bf16 out
            b8 = fin * fout * weight_reads + tokens * (fin + 2 * fout) * flop_mult
            cops = self.cops
            assert cops is not None  # (_fp8_cal; typed: compiled, a native call)
            t, out = cops.linear_fp8_s(name, tokens, flops, b8)
            if out:
                self._flag = True
            return t
        act_bytes = tokens * (fin + fout) * flop_mult * self.dtype_bytes
        bytes_ = fin * fout * weight_reads * self.dtype_bytes + act_bytes
        if name is not None and self._gemm_cal:
            # Calibrated: the raw bound (vendor peaks) over the efficiency measured at this
            # weight shape and token count. NOTE: an MoE expert GEMM uses the efficiency of
            # the whole batch's token count.
            cops = self.cops
            assert cops is not None  # (_gemm_cal; typed: compiled, a native call)
            t, out = cops.linear_s(name, tokens, flops, bytes_)
            if out:
                self._flag = True
        else:
            t = max(flops / (self.flops_s * self.eff.gemm_compute), bytes_ / self.mem_bw, self.eff.kernel_floor_s)
        if name != "lm" and self.quant is not None and (expert or self._quant_dense):
            bw, peak = self.gpu.hbm_bw_bytes_per_s, self.flops_s
            q_bytes = fin * fout * weight_reads * self.linear_weight_bytes + act_bytes
            t *= max(flops * self.quant_flop_mult / peak, q_bytes / bw) / max(flops / peak, bytes_ / bw)
        return t

    def _gemms(self, tokens: int) -> tuple[float, float, float, float]:
        """(qkv, o, mlp_up, mlp_down) seconds for all layers; cached by token count. Notes
        (``_flag``) a GEMM outside its measured table, from the memo as when computed."""
        hit = self._gemm_cache.get(tokens)
        if hit is None:
            hit = self._gemm_entry(tokens)
        if hit[4]:
            self._flag = True
        return hit[0], hit[1], hit[2], hit[3]

    def _gemm_entry(self, tokens: int) -> tuple[float, float, float, float, bool]:
        """``_gemms``' memo entry of ``tokens``: the seconds and whether any GEMM extrapolated."""
        saved, self._flag = self._flag, False
        m, L = self.model, self.model.num_layers
        Lm = m.num_moe_layers  # MoE layers; the others (all of a dense model) have a dense MLP
        up = down = 0.0
        if Lm:
            eu, ed = self._moe_layer_s(tokens)
            up, down = Lm * eu, Lm * ed
        if L - Lm:
            up += (L - Lm) * self._linear_s(tokens, self._up, name="up")
            down += (L - Lm) * self._linear_s(tokens, self._down, name="down")
        qkv, o = L * self._linear_s(tokens, self._qkv, name="qkv"), L * self._linear_s(tokens, self._o, name="o")
        out = (qkv, o, up, down, self._flag)
        self._flag = saved
        self._gemm_cache[tokens] = out
        return out

    def _moe_layer_s(self, tokens: int) -> tuple[float, float]:
        """(up, down) seconds of one MoE layer of ``tokens`` (sim/cost/dp_ep.py: the group's)."""
        return moe_mlp_s(self, tokens)

    def _lm_head_s(self, num_logits: int) -> float:
        """LM head GEMM over the sampled positions; cached by their count."""
        hit = self._lm_cache.get(num_logits)
        if hit is None:
            saved, self._flag = self._flag, False
            hit = self._lm_cache[num_logits] = (self._linear_s(num_logits, self._lm, name="lm"), self._flag)
            self._flag = saved
        # NOTE: the vocabulary-wide LM-head GEMM (n = vocab / TP) is wider than any measured
        # GEMM table row for most models; it takes the nearest measured efficiency on every
        # step, so it is reported once per run (``RunCost.lm_head_extrapolated``), not per step.
        self._lm_flag |= hit[1]
        return hit[0]

    def _logits_gather_s(self, num_logits: int) -> float:
        """The TP group's gather of the LM head's logits over ``num_logits`` sampled positions;
        cached by their count. 0 at TP 1 and without sampled positions (a pipeline's stages but
        the last run no LM head: sim/cost/pipeline.py ``replace_logits``).

        The LM head is column-parallel over the vocabulary (vLLM ``ParallelLMHead``, a
        ``VocabParallelEmbedding``): each rank computes logits for vocab / tp columns, and the
        engine gathers them before sampling, in the model's dtype (the head's GEMM output; fp32
        only after the gather):
        - vLLM V1 (0.11.0, 0.34.0): ``LogitsProcessor._gather_logits`` takes
          ``tensor_model_parallel_all_gather`` (``Platform.use_all_gather``: 0.11.0 returns
          ``envs.VLLM_USE_V1``, 0.34.0 True; CUDA does not override it), an NCCL all-gather
          (pynccl ``all_gather``); the sampler casts to fp32 afterwards;
        - vLLM 0.2 (sampler.py ``_get_logits``): ``gather_from_tensor_model_parallel_region``, an
          all-gather; vLLM V0 0.3-0.6 on CUDA: ``tensor_model_parallel_gather`` to rank 0 (NCCL
          sends and receives: rank 0 takes in the same (tp - 1) / tp of the logits over its link);
        - SGLang >= 0.3 (srt/layers/logits_processor.py ``_get_logits``): ``if
          self.do_tensor_parallel_all_gather: tensor_model_parallel_all_gather(logits)``, then
          ``.float()``;
        - TensorRT-LLM: ``lm_head = ColumnLinear(..., gather_output=True)``, whose forward runs the
          ``allgather`` plugin (ncclAllGather) in the network's dtype, cast to ``logits_dtype``
          after.
        So S = num_logits x vocab x dtype bytes is gathered, each rank sending S / tp; priced as
        NCCL's tuning model prices an AllGather (sim/cost/nccl_tuning.py ``allgather_s``: a
        ring's one pass of (tp - 1) / tp of S per rank, n - 1 steps of latency), across nodes
        its multi-node ring (sim/cost/collectives.py ``multinode_allgather_s``). NOTE: the model,
        not a measured table: the project holds no all-gather measurement, and an all-reduce
        table (all_reduce_perf) read at equal traffic per rank would charge an all-reduce's
        2 (tp - 1) steps of latency and its protocol choice, where NCCL's own model of the
        AllGather gives its n - 1 steps and LL at a third of the bus. V0's gather to rank 0 is
        priced as the all-gather (the same bytes into rank 0; its latency is one round of sends,
        a few microseconds below the ring's). The vocabulary is the model's, unpadded (vLLM pads
        each shard to a multiple of 64: < 0.1% more bytes), as the LM head's GEMM here."""
        if self.tp == 1 or not num_logits:
            return 0.0
        hit = self._gather_cache.get(num_logits)
        if hit is None:
            size = float(num_logits) * self.model.vocab_size * self.dtype_bytes
            link = self.gpu.nvlink_bw_bytes_per_s * self.eff.link
            nodes = self.nodes
            if nodes is not None and self.tp_nodes > 1:
                hit = multinode_allgather_s(size, self.tp, self.tp_nodes, link, self._nccl_link,
                                            nodes.inter_bytes_per_s * self.eff.link, nodes.inter_latency_s)
            elif self.eff.nccl_tuning:
                hit = nccl_allgather_within_node_s(size, self.tp, link, self._nccl_link)
            else:  # the ring's bytes alone plus one call's latency (``ideal``: the link's peak, no latency)
                hit = self.eff.allreduce_latency_s + (self.tp - 1) / self.tp * size / link
            self._gather_cache[num_logits] = hit
        return hit

    # Prompt-chunk shapes (chunks in the step, new tokens, cached tokens) whose calibrated prefill
    # attention is kept; the memo starts over when full (its entries are pure functions of their
    # key). ~180 bytes an entry (24 MB full). The bench workload (8 replicas, chunked 512) meets
    # 20.5k distinct shapes in 20k requests, 72k in 100k (all kept) and 140k in 250k (hit rate
    # 81.0% against 82.5% unbounded); a smaller memo misses more (65,536: +9.5% misses at 100k
    # requests, +32% at 250k).
    MAX_CHUNK_SHAPES = 131_072

    def _prefill_attn(self, chunks: tuple[tuple[int, int], ...]) -> tuple[float, bool]:
        """(seconds, outside a calibrated table) of causal attention of each chunk of c new
        tokens after x cached ones.

        FLOPs: QK^T and PV, 2 * 2 * heads * d_head per (query, key) pair (MLA: 2 * heads *
        (192 + 128), plus the up-projection of cached context, ``arch.mla_attention``); a chunk has
        c * (x + (c + 1) / 2) causal pairs (Dao 2023, "FlashAttention-2", causal FLOPs = half
        of the square). Bytes: K and V of x + c tokens read once, Q read and O written.
        """
        if not chunks:
            return 0.0, False
        L = self._num_layers
        if self._prefill_cal:
            # Calibrated: each chunk's raw bound over the efficiency measured for a batch of
            # len(chunks) prompts at the chunk's equivalent no-context length (sim/cost/fit.py).
            total, flag, n = 0.0, False, len(chunks)
            for c, x in chunks:
                hit = self._chunk_attn(n, c, x)
                flag |= hit[1]
                total += hit[0]
            return L * total, flag
        pairs = sum(windowed_pairs(self, c, x) for c, x in chunks)  # sliding layers: the window only
        kv_tokens = sum(c + x for c, x in chunks)
        new_tokens = sum(c for c, _ in chunks)
        flops = self._prefill_pair_flops * pairs + self._ctx_upproj_flops * sum(x for _, x in chunks)
        bytes_ = kv_tokens * self._prefill_kv_bytes + 2 * new_tokens * self.q_dim * self.dtype_bytes
        return L * max(flops / (self.flops_s * self.eff.attn_compute), bytes_ / self.mem_bw, self.eff.kernel_floor_s), False

    def _chunk_attn(self, n: int, c: int, x: int) -> tuple[float, bool]:
        """(one layer's seconds, outside a calibrated table) of a chunk of c new tokens after x
        cached ones among ``n`` chunks in a step, calibrated (``_prefill_attn``); memoised by
        (n, c, x)."""
        cache = self._chunk_cache
        key = chunk_key(n, c, x)
        hit = cache.get(key)
        if hit is None:
            cops = self.cops
            assert cops is not None  # (narrowed: compiled, a native call below)
            pairs = windowed_pairs(self, c, x)
            flops = self._prefill_pair_flops * pairs + self._ctx_upproj_flops * x
            # equivalent no-context length s with s (s + 1) / 2 = pairs (fit.equivalent_prefill_tokens)
            s = (math.sqrt(1.0 + 8.0 * pairs) - 1.0) / 2.0
            e, out = cops.prefill_eff(n, s)
            # The table's efficiency is measured against the bound of that no-context prompt of s
            # tokens (its own K, V, Q and O bytes), so it prices the chunk's work, not its reads of
            # the cached context: applied to the x + c tokens' bytes it divided a read of the
            # whole cache by the launch-bound efficiency of a short prompt (a 1-token chunk after
            # 512 cached tokens cost twice a 513-token prompt's attention).
            fb = flops / self._prefill_peak
            mb = (s * self._prefill_kv_bytes + 2 * s * self.q_dim * self.dtype_bytes) / self._hbm_bw
            t = (mb if mb > fb else fb) / e  # max(fb, mb), written out (compiled: native)
            # ... and a chunk after x cached tokens reads their K and V no faster than the
            # measured decode kernel reads that cache: its time per sequence and layer for n
            # sequences of x tokens (a query of 1 token is a decode: vLLM V1's backends split
            # decodes from prefills by query length, v1/attention/backends/utils.py
            # split_decodes_and_prefills; FlashAttention-2 runs both through one kernel, Dao 2023).
            # Without cached context the table measured the prompt itself.
            if x > 0:
                r, rout = self._decode_fn(n).at(float(n * x))
                r = r / (n * self._num_layers)
                hit = (t, out) if t >= r else (r, rout)
            else:
                hit = (t, out)
            if len(cache) >= self.MAX_CHUNK_SHAPES:
                cache.clear()
            cache[key] = hit
        return hit

    def _attn_decode_s(self, num_seqs: int, context_tokens: int) -> float:
        """Seconds of decode attention of ``num_seqs`` sequences over ``context_tokens`` cached
        tokens in all (``_decode_fn``); notes a shape outside a calibrated table."""
        t, out = self._decode_fn(num_seqs).at(context_tokens)
        self._flag |= out
        return t

    def _decode_fn(self, num_seqs: int) -> DecodeAttention:
        """Decode attention of ``num_seqs`` sequences as a function of their total context
        (``DecodeAttention.at``: context_tokens -> (seconds, outside a calibrated table));
        built once per batch size with the terms the batch fixes, so a step alone and every
        step of a fast-forwarded run evaluate the same expression (``run_cost``).

        Decode attention reads every cached K and V of the batch: bandwidth bound. With a
        calibration: the raw bound over the efficiency measured at this batch size and this
        step's own mean context per sequence (closed form per table cell,
        ``CalibratedDecodeAttention``), plus FA2's split-KV combine kernel when the step splits."""
        fn = self._decode_fns.get(num_seqs)
        if fn is None:
            fn = self._decode_fns[num_seqs] = self._make_decode_fn(num_seqs)
        return fn

    def _make_decode_fn(self, n: int) -> DecodeAttention:
        if not n:
            return NoDecodes()
        L = self.model.num_layers
        slide = self._slide  # sliding-window layers read at most the window (sim/cost/arch.py)
        window: Callable[[float], float] | None = \
            None if slide is None else (lambda context_tokens: windowed_context(self, n, context_tokens))
        flops_per_token = self._decode_pair_flops  # per cached token (sim/cost/arch.py for MLA)
        kv_bytes, kv_reads = self.kv_layer_bytes, self.decode_kv_reads
        q_bytes = 2 * n * self.q_dim * self.dtype_bytes  # the queries read, the outputs written
        if self.cops is not None and self.cops.decode_grid is not None:
            # The tables were measured with KV in the model's dtype; a kernel's efficiency follows
            # the bytes it moves, so an fp8 KV cache is looked up at the context of equal bytes
            # (at short contexts, latency-bound, its step then costs what a bf16 step does).
            # FA2's split decision counts KV blocks of tokens, whatever their dtype.
            # (CalibratedOps' peak and bandwidth are this model's flops_s and the GPU's HBM bandwidth)
            return CalibratedDecodeAttention(
                self.cops, n, num_layers=L, flops_per_token=flops_per_token, kv_bytes=kv_bytes, kv_reads=kv_reads,
                q_bytes=q_bytes, kv_scale=self._kv_scale, window=window)
        return RooflineDecodeAttention(num_layers=L, flops_per_token=flops_per_token, kv_bytes=kv_bytes,
                                       kv_reads=kv_reads, q_bytes=q_bytes, peak_flops_per_s=self.flops_s * self.eff.attn_compute,
                                       bw_bytes_per_s=self.mem_bw, floor_s=self.eff.kernel_floor_s, window=window)

    def _uses_custom_ar(self, tokens: int) -> bool:
        if self.tp_nodes > 1:
            return False  # vLLM's custom all-reduce runs within a node only (sim/cost/collectives.py)
        if not self.engine.custom_allreduce:
            return False  # an engine without one: NCCL at every size (EngineProfile.custom_allreduce)
        return uses_custom_allreduce(self.tp, tokens * self.model.hidden_size * self.dtype_bytes,
                                     self.gpu.full_nvlink)

    def _allreduce_s(self, tokens: int, allow_custom: bool = True) -> float:
        """Two all-reduces of T x hidden activations per layer under TP. NCCL within a node costs
        what NCCL's own tuning model gives for the algorithm x protocol it picks (sim/cost/nccl_tuning.py:
        a ring moves 2 (tp-1)/tp of the buffer over each GPU's link, Patarasuk & Yuan 2009, after a
        latency that grows with its 2 (tp-1) steps); small buffers take vLLM's custom one-/two-shot
        kernel instead (sim/cost/fit.py) unless ``allow_custom`` is off (NCCL alone, as nccl-tests or
        torch.distributed measure it)."""
        if self.tp == 1:
            return 0.0
        size = tokens * self.model.hidden_size * self.dtype_bytes
        link = self.gpu.nvlink_bw_bytes_per_s * self.eff.link
        nodes = self.nodes
        if nodes is not None and self.tp_nodes > 1:
            one = multinode_allreduce_s(float(size), self.tp, self.tp_nodes, link, self._nccl_link,
                                        nodes.inter_bytes_per_s * self.eff.link, nodes.inter_latency_s)
        elif allow_custom and self._uses_custom_ar(tokens):
            one = self.eff.custom_allreduce_latency_s + float(custom_allreduce_link_bytes(self.tp, size)) / link
        elif self.eff.nccl_tuning:
            one = nccl_allreduce_within_node_s(float(size), self.tp, link, self._nccl_link)
        else:
            one = self.eff.allreduce_latency_s + 2.0 * (self.tp - 1) / self.tp * size / link
        return 2 * self.model.num_layers * one

    def nccl_allreduce_s(self, tokens: int) -> float:
        """The step's all-reduces of ``tokens`` through NCCL alone (no custom kernel), calibrated
        where the GPU has an NCCL table: what torch.distributed / nccl-tests time."""
        if self.tp > 1 and self.tp_nodes == 1 and self.cops is not None and self.cops.allreduce_curve is not None:
            return self.cops.allreduce_s(tokens)[0]
        return self._allreduce_s(tokens, allow_custom=False)

    def _per_tokens(self, tokens: int) -> tuple[float, float, bool]:
        """(elementwise s, all-reduce s, extrapolated) of a step of ``tokens``; cached."""
        hit = self._tok_cache.get(tokens)
        if hit is not None:
            return hit
        flag = False
        if self.cops is not None and self.cops.elem_ops:
            elem, flag = self.cops.elementwise_s(tokens)
        else:
            # Per layer: 2 norms, 2 residual adds, rotary, the activation, the KV-cache write
            # (the calibrated path's 7 kernels), plus the embedding lookup (read+write h per
            # token); each kernel takes at least the launch floor.
            fl = self.eff.kernel_floor_s
            L = self.model.num_layers
            h, b = self.model.hidden_size, self.dtype_bytes
            layer = sum(max(tokens * nb / self.mem_bw, fl) for nb in self._elem_kernel_bytes)
            elem = L * layer + max(tokens * 2 * h * b / self.mem_bw, fl)
        custom = self.tp > 1 and self._uses_custom_ar(tokens)
        if self.tp_nodes > 1:
            # the calibrated curves were measured within one node: across nodes, NCCL's model of
            # a ring or tree through the network (sim/cost/collectives.py)
            ar = self._allreduce_s(tokens)
        elif custom and self.cops is not None and self.cops.custom_curve is not None:
            ar, out = self.cops.allreduce_s(tokens, custom=True)
            flag |= out
        elif not custom and self.cops is not None and self.cops.allreduce_curve is not None:
            ar, out = self.cops.allreduce_s(tokens)
            flag |= out
        else:
            ar = self._allreduce_s(tokens)
        self._tok_cache[tokens] = hit = (elem, ar, flag)
        return hit

    def _fixed(self, b: BatchValues) -> "_Fixed":
        """Every operator of ``b``'s steps but decode attention and the engine overhead (fixed
        along a decode run), with their flags; memoised for batches without prompt chunks."""
        # by position (``run_cost_values`` may pass a plain tuple); indexed, not unpacked into
        # ``_`` (compiled, sim/compiled_core.py, each ``_`` took a boxed int, made and freed)
        chunks, num_logits, num_tokens = b[2], b[3], b[6]
        key = None if chunks else (num_tokens, num_logits)
        if key is not None:
            hit = self._fixed_cache.get(key)
            if hit is not None:
                return hit
        qkv, o, up, down, elem, ar, flag = self._token_ops(num_tokens)
        lm, sampling, lm_flag = self._logit_ops(num_logits)
        # the LM head's logits gathered across the TP group, charged with its all-reduces (the
        # communication operator, sim/cost/floor.py COMMUNICATION; ``_logits_gather_s``)
        ar = ar + self._logits_gather_s(num_logits)
        if chunks:
            prefill, out = self._prefill_attn(chunks)
            flag |= out
        else:
            prefill = 0.0
        # summed left to right, as sum() of the parts
        fixed = _new(_Fixed, ((qkv, o, up, down, prefill), (elem, ar, lm, sampling), qkv + o + up + down + prefill,
                              elem + ar + lm + sampling, flag, lm_flag))
        if key is not None and len(self._fixed_cache) < 500_000:
            self._fixed_cache[key] = fixed
        return fixed

    def _token_ops(self, tokens: int) -> tuple[float, float, float, float, float, float, bool]:
        """(qkv, o, mlp_up, mlp_down, elementwise, all-reduce seconds, extrapolated) of a step of
        ``tokens``; memoised by token count."""
        hit = self._token_cache.get(tokens)
        if hit is not None:
            return hit
        if not tokens:
            hit = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)
        else:
            saved, self._flag = self._flag, False
            qkv, o, up, down = self._gemms(tokens)
            gemm_out = self._flag
            self._flag = saved
            elem, ar, out = self._per_tokens(tokens)
            hit = (qkv, o, up, down, elem, ar, gemm_out or out)
        self._token_cache[tokens] = hit
        return hit

    def _logit_ops(self, num_logits: int) -> tuple[float, float, bool]:
        """(LM head, sampling seconds, the LM head extrapolated) of ``num_logits`` sampled
        positions; memoised by their count."""
        hit = self._logit_cache.get(num_logits)
        if hit is not None:
            return hit
        if not num_logits:
            hit = (0.0, 0.0, False)
        else:
            saved, self._lm_flag = self._lm_flag, False
            lm = self._lm_head_s(num_logits)
            # Sampling: fp32 logits over the full vocabulary, written, then read by softmax and
            # the sampler (vLLM gathers the vocab shards before sampling).
            sampling = max(num_logits * self.model.vocab_size * 4 * 3 / self.mem_bw, self.eff.kernel_floor_s)
            hit = (lm, sampling, self._lm_flag)
            self._lm_flag = saved
        self._logit_cache[num_logits] = hit
        return hit

    def _components(self, b: Batch, decode_context: int) -> tuple[float, ...]:
        """Seconds per operator (``OPS``) of ``b``'s step at ``decode_context``."""
        fx = self._fixed(b)
        self._flag |= fx.flag
        self._lm_flag |= fx.lm_flag
        parts = (*fx.before, self._attn_decode_s(b.num_decode_seqs, decode_context), *fx.after)
        if not b.num_tokens:
            return (*parts, 0.0)
        chunks = b.prefill_chunks
        extra = self.engine.prompt_cpu_s(len(chunks), b.prefill_tokens) if chunks else 0.0
        if extra:  # _host's terms with the step's per-prompt host work added to its CPU (as _step)
            cpu, launch = self._host(b.num_decode_seqs + len(chunks), True)[3]
            g = sum(parts)
            m = launch if launch > g else g
            cpu += extra
            overhead = (cpu if cpu > m else m) - g if self._overlap_cpu else cpu + m - g
        else:
            overhead = self._host(b.num_decode_seqs + len(chunks), bool(chunks))[0](sum(parts))
        return (*parts, overhead)

    def _host(self, num_seqs: int, has_prefill: bool) -> tuple[Callable[[float], float], float, bool, tuple[float, float]]:
        """The engine profile's terms of a step of ``num_seqs`` scheduled sequences (the one place
        overhead enters a step): (GPU seconds -> overhead seconds, the knee: GPU seconds beyond
        which the host no longer adds to the step, whether the batch lies outside the profile's
        measured range, the (cpu, launch) seconds that function adds: _PLUS_OVERHEAD).
        Memoised (by 2 num_seqs + has_prefill: an int, hashed and compared natively): fixed along
        a decode run."""
        key = 2 * num_seqs + has_prefill
        hit = self._host_cache.get(key)
        if hit is None:
            eng, L = self.engine, self.model.num_layers
            # the step's total is max(gpu, knee) (+ serial CPU): it bends where gpu crosses the knee
            cpu, launch = eng.host_terms(num_seqs, has_prefill, self.tp, L)
            knee = max(launch, cpu) if eng.overlap_cpu else launch
            hit = self._host_cache[key] = (eng.overhead_fn(num_seqs, has_prefill, self.tp, L), knee,
                                           eng.outside_range(num_seqs), (cpu, launch))
        return hit

    # -- public ---------------------------------------------------------------------------------
    def prefill_alone_s(self, tokens: int, context_tokens: int, completing: bool) -> float:
        """Compute seconds of one prompt chunk run alone (no decodes, no engine overhead): the
        same operators as ``step_time`` of that one-chunk batch, without building it."""
        self._flag = self._lm_flag = False
        if tokens:
            # _gemms and _per_tokens through their per-token-count memo (``_token_ops``: the
            # same floats; it also records the GEMMs' extrapolation, as every other caller does)
            ops = self._token_cache.get(tokens)
            if ops is None:
                ops = self._token_ops(tokens)
            qkv, o, up, down, elem, ar, _ = ops
        else:  # _token_ops has a step of no tokens cost nothing; a chunk of none still runs its kernels
            qkv, o, up, down = self._gemms(tokens)
            elem, ar, _ = self._per_tokens(tokens)
        if not tokens:  # no queries attend: no attention work (the tables have no row for 0 tokens)
            attn = 0.0
        elif self._prefill_cal:  # _prefill_attn of the one chunk: L * (0.0 + its seconds), as there
            attn = self._num_layers * self._chunk_attn(1, tokens, context_tokens)[0]
        else:
            attn = self._prefill_attn(((tokens, context_tokens),))[0]
        t = qkv + o + up + down + elem + ar + attn
        if completing:
            tail = self._alone_tail
            if tail is None:  # the LM head of one position, its sampling and its logits' gather (pure: computed once)
                tail = self._alone_tail = (self._lm_head_s(1) + self.model.vocab_size * 4 * 3 / self.mem_bw
                                           + self._logits_gather_s(1))
            t += tail
        return t

    def overhead_s(self, num_seqs: int, has_prefill: bool = True) -> float:
        """Engine overhead reported for a step of ``num_seqs`` sequences whose total is known
        (TTFT breakdown; ``EngineProfile.attributed_s``)."""
        return self.engine.attributed_s(num_seqs, has_prefill, self.tp)

    def prompt_overhead_s(self, num_chunks: int, prompt_tokens: int) -> float:
        """Engine overhead reported for a step's per-prompt host work (TTFT breakdown, beside
        ``overhead_s``; ``EngineProfile.prompt_attributed_s``)."""
        return self.engine.prompt_attributed_s(num_chunks, prompt_tokens)

    def step_time(self, batch: Batch) -> StepCost:
        """Per-operator seconds of ``batch``; for a run of k decode steps, the k steps' total
        (decode attention and the engine overhead change along a run: summed over pieces)."""
        self._flag = self._lm_flag = False
        first = self._components(batch, batch.decode_context_tokens)
        ops = dict(zip(OPS, first))
        if batch.num_steps > 1:
            k = batch.num_steps
            ops = {op: k * t for op, t in ops.items()}
            n = batch.num_decode_seqs
            attn: float = sum(run_sum_s(j, a, z, j, q) for j, a, z, q in
                       self._pieces(batch, FnCurve(lambda c: self._attn_decode_s(n, c)), first[ATTN_DECODE]))
            fns = self._run_step_fn(batch, self._fixed(batch))
            total: float = sum(run_sum_s(j, a, z, j, q) for j, a, z, q in
                               self._pieces(batch, fns, sum(first), fns))
            # the sums apart from the subtraction: mypyc (sim/compiled_core.py) miscompiles x - sum(<floats>)
            others: float = sum(t for op, t in ops.items() if op not in ("attn_decode", "overhead"))
            ops["overhead"] = total - others - attn
            ops["attn_decode"] = attn
        return StepCost(ops)

    def run_cost(self, batch: Batch) -> RunCost:
        """``run_cost_values`` as a ``RunCost``."""
        return _new(_RunCost, self.run_cost_values(batch))

    def run_cost_values(self, batch: BatchValues) -> RunCostValues:
        """``RunCost``'s fields, as a plain tuple: what the replica loop reads by position each
        step (sim/engine/cluster.py; compiled, making a NamedTuple is a generic call).
        The first ``num_steps`` steps of ``batch`` (all of them, or the longest prefix along
        which step time follows one smooth curve of the context within ``RUN_REL_TOL``): first
        and last step seconds, their bend (``RunCost.curve_s``), whether the shape lies outside
        a calibrated table, and whether the engine overhead was taken outside the profile's
        measured batch range. The caller runs that prefix (``sim.cost.runs.run_sum_s``), then
        plans again. The same operators as ``_components``, summed in the same order; what the
        batch's shape fixes comes from ``_step`` (memoised), the decode context is costed here."""
        # the batch's fields by position (compiled, sim/compiled_core.py, a NamedTuple's field
        # read by name is a generic attribute look-up)
        n, context, chunks, num_logits, num_steps = batch[0], batch[1], batch[2], batch[3], batch[4]
        spec = self.spec_run
        if spec is not None and n:
            return spec(batch)
        key = step_key(n, num_logits, chunks)
        st = self._step_cache.get(key)
        if st is None:
            st = self._step(batch, key)
        d, out = st.decode.at(context)
        flag = out or st.flag
        lm_flag, outside = st.lm_flag, st.outside
        g = st.head + d + st.elem + st.ar + st.lm + st.sampling  # sum(parts) of _components, term by term
        if not st.has_host:
            first = g + 0.0
        else:  # g + overhead_fn(g) of _host, written out (_PLUS_OVERHEAD)
            cpu, launch = st.cpu, st.launch
            m = launch if launch > g else g
            if self._overlap_cpu:
                first = g + ((cpu if cpu > m else m) - g)
            else:
                first = g + (cpu + m - g)
        if num_steps == 1 or not n:
            return first, first, 1, flag, lm_flag, 0.0, outside
        self._flag, self._lm_flag = flag, False  # the step functions below may set _flag
        fns = st.run_fns
        if fns is None:
            fns = self._run_step_fn(batch, self._fixed(batch))
        j, z, q = self._piece(n, context, num_steps, fns, first, fns)
        return first, z, j, self._flag, lm_flag, q, outside

    # Batch shapes whose ``_Step`` is kept: decode-only shapes are few (one per batch size);
    # shapes with prompt chunks recur as chunk budgets and prompt lengths repeat, and the memo
    # starts over when full (its entries are pure functions of their key: nothing else changes).
    MAX_STEP_SHAPES = 50_000

    def _step(self, b: BatchValues, key: int | tuple[int, int, tuple]) -> _Step:
        """``run_cost``'s terms of ``b``'s shape (what ``_fixed``, ``_decode_fn`` and ``_host``
        give), memoised under ``key``: ``step_key`` of (decode sequences, sampled positions,
        prompt chunks), which fix them: the token count is the decodes plus the chunks' new
        tokens."""
        n, chunks, num_logits, num_tokens = b[0], b[2], b[3], b[6]  # (by position, as in _fixed)
        if chunks:
            # _fixed's terms, without building its tuple (it does not memoise these shapes).
            # Shapes with prompt chunks miss this memo often: on the bench workload 44% of them
            # (chunked 512; 83% of those bring a chunk never costed: its cached context moves on
            # with every chunk of its prompt) and 62% (continuous; two thirds of those a prompt
            # seen before beside another number of decodes). So the memos below are read in
            # place first, the method running on a miss (written as ``if hit is None``, not
            # ``cache.get(key) or method(key)``: compiled, sim/compiled_core.py, the ``or``
            # boxed the unboxed tuple into a new one and unboxed it again).
            ops = self._token_cache.get(num_tokens)
            if ops is None:
                ops = self._token_ops(num_tokens)
            qkv, o, up, down, elem, ar, flag = ops
            logit = self._logit_cache.get(num_logits)
            if logit is None:
                logit = self._logit_ops(num_logits)
            lm, sampling, lm_flag = logit
            ar = ar + self._logits_gather_s(num_logits)  # the logits' gather, with the all-reduces (as _fixed)
            if self._prefill_cal and len(chunks) == 1:  # _prefill_attn of one chunk: L * (0.0 + its seconds), as there
                c, x = chunks[0]
                hit = self._chunk_attn(1, c, x)
                prefill, out = self._num_layers * hit[0], hit[1]
            else:
                prefill, out = self._prefill_attn(chunks)
            head = qkv + o + up + down + prefill  # _Fixed.head, summed as there
            flag |= out
            run_fns = None
        else:
            fx = self._fixed(b)
            head, flag, lm_flag = fx.head, fx.flag, fx.lm_flag
            elem, ar, lm, sampling = fx.after
            run_fns = self._run_step_fn(b, fx) if n else None
        host, outside = None, None
        if num_tokens:
            seqs = n + len(chunks)
            has_prefill = bool(chunks)
            terms = self._host_cache.get(2 * seqs + has_prefill)  # (``_host``'s key)
            if terms is None:
                terms = self._host(seqs, has_prefill)
            out, host = terms[2], terms[3]
            if out:
                outside = (seqs, seqs)
            if chunks:  # the step's per-prompt host work (EngineProfile.prompt_cpu_s)
                extra = self.engine.prompt_cpu_s(len(chunks), num_tokens - n)
                if extra:
                    host = (host[0] + extra, host[1])
        decode = self._decode_fns.get(n)
        if decode is None:
            decode = self._decode_fn(n)
        st = _Step(head, elem, ar, lm, sampling, flag, lm_flag, decode, host, outside, run_fns)
        cache = self._step_cache
        if len(cache) >= self.MAX_STEP_SHAPES:
            cache.clear()
        cache[key] = st
        return st

    def run_durations_s(self, batch: Batch) -> tuple[float, float]:
        """(first step, last step) seconds of ``batch``, each at its own context."""
        self._flag = self._lm_flag = False
        parts = self._components(batch, batch.decode_context_tokens)
        last = batch.decode_context_tokens + (batch.num_steps - 1) * batch.num_decode_seqs
        return sum(parts), self._run_step_fn(batch, self._fixed(batch)).at(last)

    def _run_step_fn(self, b: BatchValues, fx: _Fixed) -> _RunStep:
        """Step seconds of ``b`` as a function of its total decode context, and where that
        function has a kink (``_RunStep``): every kernel but decode attention is fixed along a
        run; the engine overhead follows the GPU time. Memoised for batches without prompt
        chunks (one per decode batch shape)."""
        n, chunks, num_logits, num_tokens = b[0], b[2], b[3], b[6]  # by position, as in _fixed
        has_prefill = bool(chunks)
        key = None if has_prefill else (num_tokens, num_logits)
        if key is not None:
            hit = self._run_fns.get(key)
            if hit is not None:
                return hit
        _, knee, _, (cpu, launch) = self._host(n, has_prefill)
        fns = _RunStep(self, fx.head + fx.tail, self._decode_fn(n), cpu, launch, knee, self._overlap_cpu)
        if key is not None and len(self._run_fns) < 100_000:
            self._run_fns[key] = fns
        return fns

    def _pieces(self, b: Batch, f: StepCurve, f0: float,
                kinked: _RunStep | None = None) -> Iterator[tuple[int, float, float, float]]:
        """(steps, f at the first, f at the last step, curve_s) of each piece of a decode run
        (``_piece``), for ``f`` (seconds as a function of the total decode context; ``f0`` at
        the first step)."""
        n, c, left = b.num_decode_seqs, b.decode_context_tokens, b.num_steps
        a = f0
        while left:
            j, z, q = self._piece(n, c, left, f, a, kinked)
            yield j, a, z, q
            c += j * n
            left -= j
            if left:
                a = f.at(c)

    def _piece(self, n: int, c: int, left: int, f: StepCurve, a: float,
               kinked: _RunStep | None = None) -> tuple[int, float, float]:
        """(steps, f at the last step, curve_s) of the first piece of a run of ``left`` decode
        steps of ``n`` sequences from total context ``c`` (``a``: f at its first step). A piece
        never crosses a node of the efficiency table, a change of FA2's split decision (where
        decode attention bends or jumps) or the engine overhead's knee (``kinked``, the run's
        step function: where the GPU time overtakes the host's, if it ever does: ``has_knee``),
        and within one its steps deviate from the straight
        line between its ends by at most ``RUN_REL_TOL`` (``affine_steps``)."""
        j = left
        smooth = self._smooth_ops
        if smooth is not None:
            x0 = c / n
            end = smooth.decode_smooth_end(n, x0, x0 + (left - 1), self._kv_scale)
            j = min(left, int(end - x0 + 1e-9) + 1)
        if kinked is not None and kinked.has_knee and j > 1:
            side = kinked.kinked(c)
            if kinked.kinked(c + (j - 1) * n) != side:  # the last step on the first side (monotone)
                lo, hi = 1, j - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if kinked.kinked(c + (mid - 1) * n) == side:
                        lo = mid
                    else:
                        hi = mid - 1
                j = lo
        return affine_steps(f, c, n, j, a, a)
