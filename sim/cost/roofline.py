"""Roofline step-cost model: each operator takes max(compute time, memory time).

Why: an operator cannot run faster than its FLOPs at peak nor its bytes at peak bandwidth
(Williams, Waterman, Patterson 2009, "Roofline", CACM 52(4)). Prefill GEMMs are compute
bound, decode GEMMs and attention are bandwidth bound; the max() gives both regimes from one
formula. Achieved fractions of peak are named constants here (``Efficiencies``); with a
``calibration`` (``sim/cost/calibration.py``, fitted from measured kernels by ``simsrv
calibrate``) each calibrated operator takes ``raw roofline bound / measured efficiency(shape)``
instead (``sim/cost/calibrated.py``).

All quantities are per GPU of a tensor-parallel group (Megatron-LM sharding, Shoeybi et al.
2019: attention heads and MLP columns split across ``tp`` GPUs, two all-reduces per layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.batch import Batch
from sim.cost.calibrated import CalibratedOps
from sim.cost.calibration import Calibration
from sim.cost.engine_profile import EngineProfile, get_profile
from sim.cost.fit import prefill_pairs
from sim.hardware import GPUSpec
from sim.models import ModelSpec

OPS = (
    "gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "attn_prefill", "attn_decode",
    "elementwise", "allreduce", "lm_head", "sampling", "overhead",
)


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
    allreduce_latency_s: float = 10e-6  # aiconfigurator p2p_latency, NCCL launch + sync


@dataclass(frozen=True)
class StepCost:
    """Seconds per operator class for one step (summed over layers), and their total."""

    ops_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.ops_s.values())


class RooflineCostModel:
    """Per-step time of a batch on one replica of ``tp`` GPUs."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, kv_dtype_bytes: int | None = None,
                 eff: Efficiencies | None = None, weight_dtype_bytes: int | None = None,
                 calibration: Calibration | None = None, engine: EngineProfile | None = None):
        self.model, self.gpu, self.tp = model, gpu, tp
        # Host-side step cost of the serving engine (sim/cost/engine_profile.py).
        self.engine = engine or get_profile()
        # Largest / smallest scheduled-sequence count whose overhead used the per-sequence term
        # outside the profile's measured batch range (None: never); read into result.json.
        self.overhead_outside_seqs: tuple[int, int] | None = None
        self.eff = eff or Efficiencies()
        m, e = model, self.eff
        self.dtype_bytes = weight_dtype_bytes or m.dtype_bytes
        self.kv_dtype_bytes = kv_dtype_bytes or m.dtype_bytes
        self.flops_s = gpu.bf16_flops_per_s
        self.mem_bw = gpu.hbm_bw_bytes_per_s * e.memory
        self.heads = m.num_heads / tp
        self.q_dim = m.q_size / tp
        self.kv_dim = max(1, m.num_kv_heads // tp) * m.head_dim  # KV heads replicate when tp > H_kv
        self.mlp_dim = m.intermediate_size / tp
        # Linear layers as (input width, output width) per GPU.
        h = m.hidden_size
        self._qkv = (h, self.q_dim + 2 * self.kv_dim)
        self._o = (self.q_dim, h)
        self._up = (h, 2 * self.mlp_dim)     # fused gate+up of a gated MLP
        self._down = (self.mlp_dim, h)
        self._lm = (h, m.vocab_size / tp)
        # KV bytes per cached token per layer per GPU (PagedAttention: K and V).
        self.kv_layer_bytes = 2 * self.kv_dim * self.kv_dtype_bytes
        # Elementwise bytes per token per layer: 2 RMSNorms (read+write h), 2 residual adds
        # (2 reads + 1 write of h), rotary on q,k (read+write), SiLU*gate (read 2I, write I),
        # KV-cache write (k and v).
        self.elem_layer_bytes = self.dtype_bytes * (
            4 * h + 6 * h + 2 * (self.q_dim + self.kv_dim) + 3 * self.mlp_dim + 2 * self.kv_dim
        )
        self._gemm_cache: dict[int, tuple[float, float, float, float]] = {}
        self._tok_cache: dict[int, tuple[float, float, bool]] = {}
        self.calibration = calibration
        # Engine steps whose shapes fell outside the measured range of a calibrated operator
        # (they took the nearest measured efficiency); read into ``simsrv_extrapolated_steps``.
        self.num_extrapolated_steps = 0
        self.last_extrapolated = False
        self.lm_head_extrapolated = False
        self.cops = None if calibration is None else CalibratedOps(
            calibration, linear_shapes={"qkv": self._qkv, "o": self._o, "up": self._up, "down": self._down,
                                        "lm": self._lm},
            heads=self.heads, kv_heads=self.kv_dim / m.head_dim, head_dim=m.head_dim, hidden=h, q_dim=self.q_dim,
            kv_dim=self.kv_dim, mlp_dim=self.mlp_dim, num_layers=m.num_layers, tp=tp, dtype_bytes=self.dtype_bytes,
            peak_flops_per_s=self.flops_s, hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s,
            link_bw_bytes_per_s=gpu.nvlink_bw_bytes_per_s)
        self._gemm_cal = self.cops is not None and self.cops.gemm_curves is not None
        self._flag = False  # set by the operators of the step being computed
        self._gemm_extrap: set[int] = set()  # token counts beyond the measured GEMM range
        self._chunk_cache: dict[tuple[int, int, int], tuple[float, bool]] = {}  # calibrated prefill attention
        self._lm_cache: dict[int, tuple[float, bool]] = {}
        self._decode_cache: dict[tuple[int, int], tuple[float, float, bool]] = {}

    # -- operators ------------------------------------------------------------------------------
    def _linear_s(self, tokens: float, shape: tuple[float, float], weight_reads: float = 1.0,
                  flop_mult: float = 1.0, name: str | None = None) -> float:
        """A GEMM of ``tokens`` x in -> out: 2*T*in*out FLOPs; weights + activations in bytes."""
        fin, fout = shape
        flops = 2.0 * tokens * fin * fout * flop_mult
        bytes_ = (fin * fout * weight_reads + tokens * (fin + fout) * flop_mult) * self.dtype_bytes
        if name is not None and self._gemm_cal:
            # Calibrated: the raw bound (vendor peaks) over the efficiency measured at this
            # weight shape and token count. NOTE: an MoE expert GEMM uses the efficiency of
            # the whole batch's token count.
            t, out = self.cops.linear_s(name, tokens, flops, bytes_)
            self._flag |= out
            return t
        return max(flops / (self.flops_s * self.eff.gemm_compute), bytes_ / self.mem_bw)

    def _gemms(self, tokens: int) -> tuple[float, float, float, float]:
        """(qkv, o, mlp_up, mlp_down) seconds for all layers; cached by token count."""
        hit = self._gemm_cache.get(tokens)
        if hit is not None:
            return hit
        m, L = self.model, self.model.num_layers
        if m.num_experts > 1:
            # MoE: each token runs top-k experts (FLOPs); the weights read are those of the
            # experts touched, E * (1 - (1 - k/E)^T) in expectation under uniform routing
            # (Jiang et al. 2024, "Mixtral of Experts").
            k, E = m.num_experts_per_tok, m.num_experts
            touched = E * (1.0 - (1.0 - k / E) ** tokens)
            up = self._linear_s(tokens, self._up, touched, k, name="up")
            down = self._linear_s(tokens, self._down, touched, k, name="down")
        else:
            up = self._linear_s(tokens, self._up, name="up")
            down = self._linear_s(tokens, self._down, name="down")
        out = (L * self._linear_s(tokens, self._qkv, name="qkv"), L * self._linear_s(tokens, self._o, name="o"),
               L * up, L * down)
        self._gemm_cache[tokens] = out
        return out

    def _lm_head_s(self, num_logits: int) -> float:
        """LM head GEMM over the sampled positions; cached by their count."""
        hit = self._lm_cache.get(num_logits)
        if hit is None:
            saved, self._flag = self._flag, False
            hit = self._lm_cache[num_logits] = (self._linear_s(num_logits, self._lm, name="lm"), self._flag)
            self._flag = saved
        # NOTE: the vocabulary-wide LM-head GEMM (n = vocab / TP) is wider than any measured
        # GEMM table row for most models; it takes the nearest measured efficiency on every
        # step, so it is reported once (lm_head_extrapolated), not counted per step.
        self.lm_head_extrapolated |= hit[1]
        return hit[0]

    def _attn_prefill_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """Causal attention of each chunk of c new tokens after x cached ones.

        FLOPs: QK^T and PV, 2 * 2 * heads * d_head per (query, key) pair; a chunk has
        c * (x + (c + 1) / 2) causal pairs (Dao 2023, "FlashAttention-2", causal FLOPs = half
        of the square). Bytes: K and V of x + c tokens read once, Q read and O written.
        """
        if not chunks:
            return 0.0
        L = self.model.num_layers
        if self.cops is not None and self.cops.prefill_grid is not None:
            # Calibrated: each chunk's raw bound over the efficiency measured for a batch of
            # len(chunks) prompts at the chunk's equivalent no-context length (sim/cost/fit.py).
            total, n, cache = 0.0, len(chunks), self._chunk_cache
            for c, x in chunks:
                key = (n, c, x)
                hit = cache.get(key)
                if hit is None:
                    pairs = prefill_pairs(c, x)
                    flops = 4.0 * self.heads * self.model.head_dim * pairs
                    bytes_ = (c + x) * self.kv_layer_bytes + 2 * c * self.q_dim * self.dtype_bytes
                    # equivalent no-context length s with s (s + 1) / 2 = pairs (fit.equivalent_prefill_tokens)
                    e, out = self.cops.prefill_eff(n, (math.sqrt(1.0 + 8.0 * pairs) - 1.0) / 2.0)
                    hit = (max(flops / self.flops_s, bytes_ / self.gpu.hbm_bw_bytes_per_s) / e, out)
                    if len(cache) < 500_000:
                        cache[key] = hit
                self._flag |= hit[1]
                total += hit[0]
            return L * total
        pairs = sum(c * (x + (c + 1) / 2.0) for c, x in chunks)
        kv_tokens = sum(c + x for c, x in chunks)
        new_tokens = sum(c for c, _ in chunks)
        flops = 4.0 * self.heads * self.model.head_dim * pairs
        bytes_ = kv_tokens * self.kv_layer_bytes + 2 * new_tokens * self.q_dim * self.dtype_bytes
        return L * max(flops / (self.flops_s * self.eff.attn_compute), bytes_ / self.mem_bw)

    def _attn_decode_s(self, num_seqs: int, context_tokens: float, cal_eff: tuple[float, float] | None = None) -> float:
        """Decode attention reads every cached K and V of the batch: bandwidth bound. With a
        calibration, ``cal_eff`` = (efficiency, combine s): the raw bound over the efficiency
        measured at this batch size and mean context, plus FA2's split-KV combine kernel when
        the step splits (both held for a fast-forwarded run, so its steps stay affine)."""
        if not num_seqs:
            return 0.0
        flops = 4.0 * self.heads * self.model.head_dim * context_tokens
        bytes_ = context_tokens * self.kv_layer_bytes + 2 * num_seqs * self.q_dim * self.dtype_bytes
        L = self.model.num_layers
        if cal_eff is not None:
            return L * (max(flops / self.flops_s, bytes_ / self.gpu.hbm_bw_bytes_per_s) / cal_eff[0] + cal_eff[1])
        return L * max(flops / (self.flops_s * self.eff.attn_compute), bytes_ / self.mem_bw)

    def _allreduce_s(self, tokens: int) -> float:
        """Two all-reduces of T x hidden activations per layer under TP. A ring all-reduce moves
        2 (tp-1)/tp of the buffer over each GPU's link (Patarasuk & Yuan 2009; NCCL bus bandwidth)."""
        if self.tp == 1:
            return 0.0
        size = tokens * self.model.hidden_size * self.dtype_bytes
        link = self.gpu.nvlink_bw_bytes_per_s * self.eff.link
        one = self.eff.allreduce_latency_s + 2.0 * (self.tp - 1) / self.tp * size / link
        return 2 * self.model.num_layers * one

    def _per_tokens(self, tokens: int) -> tuple[float, float, bool]:
        """(elementwise s, all-reduce s, extrapolated) of a step of ``tokens``; cached."""
        hit = self._tok_cache.get(tokens)
        if hit is not None:
            return hit
        flag = False
        if self.cops is not None and self.cops.elem_ops:
            elem, flag = self.cops.elementwise_s(tokens)
        else:
            # Embedding lookup (read+write h per token) joins the per-layer elementwise traffic.
            elem = tokens * (self.model.num_layers * self.elem_layer_bytes
                             + 2 * self.model.hidden_size * self.dtype_bytes) / self.mem_bw
        if self.cops is not None and self.cops.allreduce_curve is not None:
            ar, out = self.cops.allreduce_s(tokens)
            flag |= out
        else:
            ar = self._allreduce_s(tokens)
        self._tok_cache[tokens] = hit = (elem, ar, flag)
        return hit

    DECODE_CTX_BUCKET = 16  # tokens

    def _decode_eff(self, b: Batch) -> tuple[float, float] | None:
        """(efficiency, combine s) measured at this batch size and mean context per sequence.
        NOTE: the mean context is rounded to 16 tokens (one KV block) so the lookup is memoised;
        the efficiency curve moves by well under 1% over 16 tokens of context."""
        if self.cops is None or self.cops.decode_grid is None or not b.num_decode_seqs:
            return None
        bucket = self.DECODE_CTX_BUCKET
        # The tables were measured with KV in the model's dtype; a kernel's efficiency follows
        # the bytes it moves, so an fp8 KV cache is looked up at the context of equal bytes
        # (at short contexts, latency-bound, its step then costs what a bf16 step does).
        scale = self.kv_dtype_bytes / self.dtype_bytes
        key = (b.num_decode_seqs, int(b.decode_context_tokens / b.num_decode_seqs * scale / bucket + 0.5))
        hit = self._decode_cache.get(key)
        if hit is None:
            ctx = max(1.0, key[1] * bucket)
            e, out = self.cops.decode_eff(b.num_decode_seqs, ctx)
            hit = self._decode_cache[key] = (e, self.cops.decode_combine_s(b.num_decode_seqs, ctx), out)
        self._flag |= hit[2]
        return hit[0], hit[1]

    def _components(self, b: Batch, decode_context: float, decode_eff: tuple[float, float] | None = None) -> tuple[float, ...]:
        tokens = b.num_tokens
        if tokens:
            if self._gemm_cal and tokens not in self._gemm_cache:
                saved, self._flag = self._flag, False
                qkv, o, up, down = self._gemms(tokens)
                if self._flag:
                    self._gemm_extrap.add(tokens)
                self._flag = saved
            else:
                qkv, o, up, down = self._gemms(tokens)
            if tokens in self._gemm_extrap:
                self._flag = True
            elem, ar, out = self._per_tokens(tokens)
            self._flag |= out
        else:
            qkv = o = up = down = elem = ar = 0.0
        lm = self._lm_head_s(b.num_logits) if b.num_logits else 0.0
        # Sampling: fp32 logits over the full vocabulary, written, then read by softmax and the
        # sampler (vLLM gathers the vocab shards before sampling).
        sampling = b.num_logits * self.model.vocab_size * 4 * 3 / self.mem_bw
        parts = (qkv, o, up, down, self._attn_prefill_s(b.prefill_chunks),
                 self._attn_decode_s(b.num_decode_seqs, decode_context, decode_eff), elem, ar, lm, sampling)
        overhead = self._step_overhead_s(sum(parts), b) if tokens else 0.0
        return (*parts, overhead)

    def _step_overhead_s(self, gpu_s: float, b: Batch) -> float:
        """The engine profile's cost of this step beyond its kernels (the one place overhead
        enters a step); notes a batch outside the profile's measured range."""
        n = b.num_decode_seqs + len(b.prefill_chunks)
        eng = self.engine
        if eng.outside_range(n):
            lo, hi = self.overhead_outside_seqs or (n, n)
            self.overhead_outside_seqs = (min(lo, n), max(hi, n))
        return eng.overhead_s(gpu_s, n, bool(b.prefill_chunks), self.tp, self.model.num_layers)

    # -- public ---------------------------------------------------------------------------------
    def prefill_alone_s(self, tokens: int, context_tokens: int, completing: bool) -> float:
        """Compute seconds of one prompt chunk run alone (no decodes, no engine overhead): the
        same operators as ``step_time`` of that one-chunk batch, without building it."""
        self._flag = False
        qkv, o, up, down = self._gemms(tokens)
        elem, ar, _ = self._per_tokens(tokens)
        t = qkv + o + up + down + elem + ar + self._attn_prefill_s(((tokens, context_tokens),))
        if completing:
            t += self._lm_head_s(1) + self.model.vocab_size * 4 * 3 / self.mem_bw
        return t

    def overhead_s(self, num_seqs: int, has_prefill: bool = True) -> float:
        """Engine overhead reported for a step of ``num_seqs`` sequences whose total is known
        (TTFT breakdown; ``EngineProfile.attributed_s``)."""
        return self.engine.attributed_s(num_seqs, has_prefill, self.tp)

    def step_time(self, batch: Batch) -> StepCost:
        """Per-operator seconds of ``batch``; for a run of k decode steps, the k steps' total."""
        self._flag = False
        de = self._decode_eff(batch)
        first = self._components(batch, batch.decode_context_tokens, de)
        self._count(batch)
        if batch.num_steps == 1:
            return StepCost(dict(zip(OPS, first)))
        last = self._components(batch, self._last_context(batch), de)
        k = batch.num_steps
        return StepCost({op: k * (a + z) / 2.0 for op, a, z in zip(OPS, first, last)})

    def run_durations_s(self, batch: Batch) -> tuple[float, float]:
        """(first step, last step) seconds. Step time is affine in the decode context, which
        grows by ``num_decode_seqs`` per step, so a run's steps are evenly spaced between them."""
        self._flag = False
        de = self._decode_eff(batch)
        first = sum(self._components(batch, batch.decode_context_tokens, de))
        # the caller counts the steps it actually runs (a run may be cut short by an arrival)
        self.last_extrapolated = self._flag
        if batch.num_steps == 1:
            return first, first
        return first, sum(self._components(batch, self._last_context(batch), de))

    def _count(self, batch: Batch) -> None:
        if self._flag:
            self.num_extrapolated_steps += batch.num_steps

    def count_extrapolated(self, num_steps: int) -> None:
        """Count ``num_steps`` run at the shape of the last ``run_durations_s`` call, if that
        shape lay outside the measured range."""
        if self.last_extrapolated:
            self.num_extrapolated_steps += num_steps

    @staticmethod
    def _last_context(b: Batch) -> float:
        return b.decode_context_tokens + (b.num_steps - 1) * b.num_decode_seqs
