"""Calibrated efficiencies of one GPU, loaded from ``sim/catalog/calibration/<gpu>.json``.

Why: the roofline bound is a first principle, but real kernels reach different fractions of
it at different shapes (small GEMMs, short attention, decode at small batch). The calibration
file, written by ``simsrv calibrate`` from measured kernels (``kernels_profile/``), holds
per-operator tables of log(efficiency) over log(shape); the cost model divides its roofline
bound by the efficiency at the step's shape: ``time = bound / efficiency(shape)``.
"""

from __future__ import annotations

import base64
import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from sim.cost.shapes import wave_padding
from sim.cost.tables import Axis, Curve, Grid2, bracket
from sim.spec.quantization import NVFP4_BYTES_PER_WEIGHT

CALIBRATED_OPS = ("gemm", "gemm_fp8", "gemm_nvfp4", "attn_prefill", "attn_decode", "allreduce", "custom_allreduce", "elementwise", "overhead")
# An engine's own attention kernels, measured where the engine ran them (kernels_profile/README.md,
# aiconfigurator-core): ``attn_{prefill,decode}_<tables>`` with ``<tables>`` an attention
# backend's ``tables`` (sim/catalog/attention_backends.yaml); ``_fp8``: FP8 context FMHA,
# ``_fp8kv``: decode with an fp8 KV cache. TensorRT-LLM's context FMHA and XQA generation kernel;
# FlashInfer's prefill and decode kernels under SGLang.
ENGINE_ATTN_OPS = ("attn_prefill_trtllm", "attn_prefill_trtllm_fp8", "attn_decode_trtllm", "attn_decode_trtllm_fp8kv",
                   "attn_prefill_flashinfer", "attn_decode_flashinfer", "attn_decode_flashinfer_fp8kv")


# Elementwise work a measured attention table's timed call already includes, by the engine whose
# kernels it measured (``tables``: sim/catalog/attention_backends.yaml; "" for the GPU's main
# tables); the step does not charge these ops again (sim/cost/calibrated.py ``CalibratedOps``).
#   "rope": rotary embedding of q and k; "kv_write": appending the step's K/V to the paged cache.
# trtllm: aiconfigurator collector/trtllm/collect_attn.py builds TrtllmAttention with
#   pos_embd_params rope_gpt_neox and times attn.forward on the fused, unrotated qkv (q, k, v
#   random; k=v=None). TensorRT-LLM's attention op preprocesses it inside the op:
#   cpp/tensorrt_llm/kernels/unfusedAttentionKernels.h ``invokeQKVPreprocessing`` ->
#   ``invokeApplyBiasRopeUpdateKVCacheDispatch`` (bias, RoPE, K/V appended to the KV cache),
#   called by cpp/tensorrt_llm/common/attentionOp.cpp ``enqueueContext`` (context FMHA) and by
#   the XQA dispatch for generation (or RoPE inside the XQA kernel itself, decoderXQAImplJIT.cpp
#   ``applyRoPEInXqaKernel``). The engine runs Llama so: tensorrt_llm/_torch/modules/attention.py
#   ``Attention.__init__`` ("If rope_fusion is not specified, enable if the attention backend
#   supports it"; attention_backend/trtllm.py ``TrtllmAttention.support_fused_rope`` -> True),
#   models/modeling_llama.py ``LlamaAttention`` passes pos_embd_params and no rope_fusion, and
#   the separate RotaryEmbedding is built only when rope_fusion is off.
# flashinfer: collector/sglang/collect_attn.py (SGLang 0.5.14) times ``layer(q, k, v,
#   forward_batch)`` (RadixAttention) on q and k given as random tensors: no rotary in the timed
#   call (SGLang's models apply ``self.rotary_emb`` before ``self.attn``); SGLang's
#   layers/attention/flashinfer_backend.py ``forward_extend`` / ``forward_decode``
#   (save_kv_cache=True by default) write K/V with ``token_to_kv_pool.set_kv_buffer`` inside it.
# "" (the main tables, aiconfigurator collector/vllm/collect_attn.py): times ``impl.forward``
#   only. vLLM moved the cache write out of FlashAttention's forward into ``do_kv_cache_update``
#   (vllm-project/vllm#25954, ``forward_includes_kv_cache_update = False``; FlashInfer and the
#   other backends followed, #32335), so the 0.24.0 tables (H100, H200, B200, L40S) hold no
#   KV write and no rotary. NOTE: A100's table is vLLM 0.14.0 FA2; whether that release
#   predates #25954 (forward then called reshape_and_cache_flash itself) is not settled from
#   the sources at hand, so its KV write stays charged (an open question, not a fit).
TABLES_INCLUDE: dict[str, frozenset[str]] = {
    "trtllm": frozenset(("rope", "kv_write")),
    "flashinfer": frozenset(("kv_write",)),
}


def ops_inside_attention(tables: str, prefill_op: str, decode_op: str) -> frozenset[str]:
    """The elementwise ops the attention pricing in use already includes: those that both the
    prefill and the decode table (``Calibration.engine_attention``'s ops) include, since one
    step's elementwise kernels run over its prefill and decode tokens alike. A phase priced by
    the main tables (the engine's own table not measured on this GPU) includes none of them."""
    own = TABLES_INCLUDE.get(tables, frozenset())
    pre = own if prefill_op != "attn_prefill" else frozenset()
    dec = own if decode_op != "attn_decode" else frozenset()
    return pre & dec


def attn_base(op: str) -> str:
    """The attention operator a table measures (``attn_prefill`` or ``attn_decode``: an engine's
    own table, ``ENGINE_ATTN_OPS``, is one of them), else ``op``."""
    return "attn_prefill" if op.startswith("attn_prefill") else "attn_decode" if op.startswith("attn_decode") else op

# A table of PACK_MIN_VALUES or more efficiencies (the GEMM grids: 22 x 22 x 74 values; the
# attention grids: ~12 x 17 per head configuration) is stored packed, as
# {"format": PACKED_FORMAT, "shape", "scale", "data"}: the values times ``scale`` as
# little-endian int32 in base64, _MISSING for an unmeasured shape.
# Why: start-up. Parsing the H100 file's 84k decimals took 22-24 ms of CPU, for a run that
# reads ~2k of them (bench/README.md, "Calibration tables packed"); decoding takes ~1 ms.
# Exact: ``fit._r`` rounds every log(eff) to 5 decimals, so the value is k / 10^5 for an
# integer k, and IEEE division of two exact integers is correctly rounded, which is the
# double that parsing the decimal gives. A table that is not exact so stays a list.
PACKED_FORMAT = "int32-le-base64"
PACK_MIN_VALUES = 64
_SCALE = 100_000
_MISSING = -(2**31)


def pack_log_eff(values: list) -> list | dict:
    """``values`` (nested lists, None where unmeasured) in the file's packed form, or unchanged
    when small or not exactly k / _SCALE."""
    arr = np.array(values, dtype=np.float64)  # None -> nan
    if arr.size < PACK_MIN_VALUES:
        return values
    known = ~np.isnan(arr)
    scaled = np.round(arr[known] * _SCALE)
    if not (np.all(np.abs(scaled) < 2**31 - 1) and np.array_equal(scaled / _SCALE, arr[known])):
        return values
    ints = np.full(arr.shape, _MISSING, dtype="<i4")
    ints[known] = scaled
    return {"format": PACKED_FORMAT, "shape": list(arr.shape), "scale": _SCALE,
            "data": base64.b64encode(ints.tobytes()).decode("ascii")}


def pack_tables(d):
    """A copy of the calibration ``d`` (``sim.cost.fit.fit``) with every ``log_eff`` table packed
    where ``pack_log_eff`` packs it: what ``simsrv calibrate`` writes."""
    if isinstance(d, dict):
        return {k: pack_log_eff(v) if k == "log_eff" else pack_tables(v) for k, v in d.items()}
    if isinstance(d, list):
        return [pack_tables(v) for v in d]
    return d


def log_eff_array(v: list | dict) -> np.ndarray:
    """A ``log_eff`` table of the file, packed or nested lists, as float64 (nan: unmeasured)."""
    if isinstance(v, dict):
        if v.get("format") != PACKED_FORMAT:
            raise ValueError(f"log_eff table in an unknown format {v.get('format')!r}")
        ints = np.frombuffer(base64.b64decode(v["data"]), dtype="<i4").reshape(v["shape"])
        return np.where(ints == _MISSING, np.nan, ints / v["scale"])
    return np.array(v, dtype=np.float64)


def log_eff_values(v: list | dict) -> list:
    """A ``log_eff`` table as nested lists of floats, for ``Curve`` and ``Grid2``, which skip
    unmeasured values (None in a list, nan once unpacked)."""
    return v if isinstance(v, list) else log_eff_array(v).tolist()


def gemm_axis(n: float, k: float, peaks: dict, fp8: bool = False, nvfp4: bool = False) -> Axis:
    """The roofline axis of x[m,k] @ W[k,n] along m: max(2mnk / peak, 2 (mk + kn + mn) / bw);
    ``fp8`` (W8A8): max(2mnk / fp8 peak, (mk + kn + 2 mn) / bw); ``nvfp4`` (W4A4): max(2mnk /
    fp4 peak, (w mk + w kn + 2 mn) / bw), w = 0.5625 bytes (4.5 bits with the block scales)."""
    bw = peaks["hbm_bw_bytes_per_s"]
    if nvfp4:
        w = NVFP4_BYTES_PER_WEIGHT
        return Axis(a=2.0 * n * k / peaks["fp4_flops_per_s"], b=w * k * n / bw, c=(w * k + 2.0 * n) / bw)
    if fp8:
        return Axis(a=2.0 * n * k / peaks["fp8_flops_per_s"], b=k * n / bw, c=(k + 2.0 * n) / bw)
    return Axis(a=2.0 * n * k / peaks["bf16_flops_per_s"], b=2.0 * k * n / bw, c=2.0 * (k + n) / bw)


def wave_log_ratio(m: float, n: float, k: float, peaks: dict, wave: dict) -> float:
    """log of the bound of x[m,k] @ W[k,n] with its FLOPs padded to whole waves of tiles
    (``sim.cost.shapes.wave_padding``) over its roofline bound: >= 0, 0 where bytes limit it."""
    fl = 2.0 * m * n * k / peaks["bf16_flops_per_s"]
    by = 2.0 * (m * k + k * n + m * n) / peaks["hbm_bw_bytes_per_s"]
    tm, tn = wave["tile"]
    padded = fl * wave_padding(m, n, wave["sms"], tm, tn)
    return math.log(max(padded, by) / max(fl, by))


class GemmEff:
    """Efficiency of x[m,k] @ W[k,n] against its roofline bound max(FLOPs / peak, bytes /
    bandwidth), as a function of the token count m, for one weight shape (``GemmTable.eff_fn``).

    The measured efficiencies (<= 1: the fit keeps no row beyond the roofline,
    ``sim.cost.fit.fit_op``) are interpolated along m (``Curve``: log-linear in the log bound).
    With a wave term (``wave``: the GPU's SMs and the output tile the fit selected), a shape
    whose output tiles run in more padded waves than the measured kernels it is interpolated
    from (``wave_log_ratio`` at (m, n, k) above its interpolation at the measured token counts
    and weight shapes) takes that much more time: the efficiency is divided by exp(excess). The term only adds time; a token count
    that fills its waves better than its neighbours keeps their interpolated efficiency, so the
    result never exceeds 1 against the bound, whichever operation divides its bound by it (an
    MoE expert GEMM's weight reads, ``sim.cost.arch.moe_mlp_s``).
    NOTE: before, the efficiency was fitted against the padded bound itself; the padded FLOPs
    of skinny GEMMs are no floor (measured kernels beat them 4x at 8 tokens on A100, cuBLAS
    picking smaller tiles), so those efficiencies reached 4.09 and an MoE layer's weight reads,
    divided by them, ran 4x faster than HBM allows (issue 37: Mixtral TP2 on A100 decoded at
    19.3 ms against a 20.7 ms floor)."""

    __slots__ = ("curve", "waves", "n", "k", "peaks", "wave")

    def __init__(self, curve: Curve, n: float, k: float, peaks: dict, wave: dict | None, nodes: list,
                 ref: list | None = None):
        self.curve, self.n, self.k, self.peaks, self.wave = curve, n, k, peaks, wave
        # log(padded / roofline bound) of the measured kernels at the measured token counts
        # (``ref``, blended over the measured weight shapes as the efficiency is; else this
        # shape's own), on the same axis: the same bracket and weights as the efficiency's
        # interpolation
        self.waves: Curve | None = None if not wave else Curve(
            nodes, ref if ref is not None else [wave_log_ratio(x, n, k, peaks, wave) for x in nodes], curve.axis)

    def eff(self, m: float) -> tuple[float, bool]:
        """(efficiency <= 1 at m tokens, m outside the measured token counts)."""
        u = self.curve.axis.u(m)
        y, out = self.curve.at(u)
        if self.waves is not None:
            excess = wave_log_ratio(m, self.n, self.k, self.peaks, self.wave) - self.waves.at(u)[0]
            if excess > 0.0:
                y -= excess
        return math.exp(y), out


class GemmTable:
    """Efficiency of x[m,k] @ W[k,n] over measured (m, n, k); ``curve(n, k)`` gives the
    efficiency against m for one weight shape (interpolated along its roofline bound),
    bilinear in (log n, log k) between the four measured weight shapes around it."""

    def __init__(self, d: dict, peaks: dict, fp8: bool = False, nvfp4: bool = False):
        self.m, self.n, self.k = d["m"], d["n"], d["k"]
        self.peaks, self.fp8, self.nvfp4 = peaks, fp8, nvfp4
        # Wave quantization term (``GemmEff``): the output tile the fit selected, whose padded
        # waves add time between measured token counts; None when no tile helps. The
        # efficiencies themselves are against the roofline bound, never the padded one.
        self.wave = d.get("wave")
        self.ln = [math.log(x) for x in self.n]
        self.lk = [math.log(x) for x in self.k]
        # (n, k) weight shape -> its curve along m, built when first used (start-up: a model
        # reads the 4 corners around each of its few weight shapes, out of ~500 measured)
        self._log_eff = log_eff_array(d["log_eff"])
        self._curves: dict[tuple[int, int], Curve] = {}

    def _at(self, i: int, j: int) -> Curve:
        c = self._curves.get((i, j))
        if c is None:
            c = self._curves[i, j] = Curve(self.m, self._row(i, j),
                                           gemm_axis(self.n[i], self.k[j], self.peaks, self.fp8, self.nvfp4))
        return c

    def _row(self, i: int, j: int) -> list:
        """log(eff) of measured weight shape (i, j) along the measured token counts."""
        return self._log_eff[i, j].tolist()

    def _corners(self, n: float, k: float) -> tuple[list[tuple[float, int, int]], bool]:
        """(weight, n index, k index) of the measured weight shapes around (n, k), bilinear in
        (log n, log k), and whether (n, k) lies outside them."""
        i, wn, on = bracket(self.ln, math.log(n))
        j, wk, ok = bracket(self.lk, math.log(k))
        corners = []
        for di, wi in ((0, 1 - wn), (1, wn)):
            for dj, wj in ((0, 1 - wk), (1, wk)):
                ii, jj = min(i + di, len(self.n) - 1), min(j + dj, len(self.k) - 1)
                if self._at(ii, jj) and wi * wj > 0:
                    corners.append((wi * wj, ii, jj))
        if not corners:  # every surrounding shape unmeasured: the nearest measured one
            ii, jj = min(((a, b) for a in range(len(self.n)) for b in range(len(self.k)) if self._at(a, b)),
                         key=lambda ab: abs(self.ln[ab[0]] - math.log(n)) + abs(self.lk[ab[1]] - math.log(k)))
            corners = [(1.0, ii, jj)]
        return corners, on or ok

    def curve(self, n: float, k: float) -> tuple[Curve, bool]:
        corners, out = self._corners(n, k)
        tot = sum(w for w, _, _ in corners)
        ys = [sum(w * self._at(ii, jj).log_eff(m)[0] for w, ii, jj in corners) / tot for m in self.m]
        return Curve(self.m, ys, gemm_axis(n, k, self.peaks, self.fp8, self.nvfp4)), out

    def eff_fn(self, n: float, k: float) -> tuple[GemmEff, bool]:
        """(the efficiency along m of weight shape (n, k), with the wave term, ``GemmEff``;
        whether the shape lies outside the measured ones). The wave term's reference at the
        measured token counts is blended from the same measured weight shapes as the
        efficiency, each at its own (n, k)."""
        c, out = self.curve(n, k)
        wave = None if (self.fp8 or self.nvfp4) else self.wave
        ref = None
        if wave:
            corners, _ = self._corners(n, k)
            tot = sum(w for w, _, _ in corners)
            ref = [sum(w * wave_log_ratio(m, self.n[ii], self.k[jj], self.peaks, wave) for w, ii, jj in corners) / tot
                   for m in self.m]
        return GemmEff(c, n, k, self.peaks, wave, self.m, ref), out

    def eff(self, m: float, n: float, k: float) -> tuple[float, bool]:
        g, out = self.eff_fn(n, k)
        e, out_m = g.eff(m)
        return e, out or out_m


# The measured fp8 grid's token counts one past a band of 256 rows (m = 256 j + 1, j >= 1).
# vLLM's CUTLASS FP8 kernel (``CutlassFP8ScaledMMLinearKernel``, the kernel the fp8 tables
# measure) takes there the time of the whole next band or more: across the H100 shapes with n, k
# >= 4,096 and m >= 769, t(256 j + 1) is 1.27x t(256 j) (median; H200 1.30x) and 1.12x
# t(256 j + 256), where cuBLAS's BF16 GEMMs of the same shapes, in the same files, take 1.01x
# t(256 j) (kernels_profile/README.md, "fp8 GEMMs under cuBLASLt"): a band staircase of that
# kernel, which the interpolation along m spreads over every token count of the band (Llama-3-8B's
# gate+up at m = 520 took 1.97x its time at 512).
FP8_BAND_ROWS = 256


def is_band_start(m: float) -> bool:
    """Whether ``m`` is a measured token count one past a band of ``FP8_BAND_ROWS`` rows."""
    return m > FP8_BAND_ROWS and m % FP8_BAND_ROWS == 1


class CublasLtFp8Table(GemmTable):
    """The fp8 table as cuBLASLt's FP8 GEMM runs it (TensorRT-LLM's ``cublas_scaled_mm``: its
    PyTorch backend's ``FP8QDQLinearMethod``, tensorrt_llm/_torch/modules/linear.py, for more than
    8 tokens): the efficiency the CUTLASS kernel measured at the token counts that fill whole
    bands (its trend), and at each band start the step that cuBLAS's own BF16 kernels measured at
    that shape (log efficiency at m = 256 j + 1 below their interpolation between the aligned
    token counts around it; never a gain), in place of CUTLASS's band staircase.
    NOTE: cuBLASLt's FP8 kernels are assumed to quantize the token dimension as its BF16
    kernels do at the same shape (as the quantized GEMMs are assumed to reach the fraction of
    their peak that the measured kernel reaches, sim/cost/roofline.py ``_linear_s``). Without a
    BF16 table on the same grid the band starts are left out (no step)."""

    def __init__(self, fp8: GemmTable, bf16: GemmTable | None):
        vars(self).update(vars(fp8))  # the measured fp8 table's grid, peaks and log efficiencies
        self._curves = {}  # its own curves: the rows below, not the measured table's
        same_grid = bf16 is not None and (list(bf16.m), list(bf16.n), list(bf16.k)) == (list(fp8.m), list(fp8.n), list(fp8.k))
        self._bf16 = bf16 if same_grid else None
        self._aligned = [t for t, m in enumerate(self.m) if not is_band_start(m)]
        self._starts = [t for t, m in enumerate(self.m) if is_band_start(m)]

    def _row(self, i: int, j: int) -> list:
        """log(eff) of weight shape (i, j) along the measured token counts, band starts replaced."""
        row = self._log_eff[i, j].tolist()
        ms = self.m
        trend = Curve([ms[t] for t in self._aligned], [row[t] for t in self._aligned],
                      gemm_axis(self.n[i], self.k[j], self.peaks, fp8=True))
        step = None
        if self._bf16 is not None:
            b = self._bf16._log_eff[i, j].tolist()
            step = (b, Curve([ms[t] for t in self._aligned], [b[t] for t in self._aligned],
                             gemm_axis(self.n[i], self.k[j], self._bf16.peaks)))
        for t in self._starts:
            if not trend:
                row[t] = math.nan
                continue
            y = trend.log_eff(ms[t])[0]
            if step is not None and step[1] and not math.isnan(step[0][t]):
                y += min(0.0, step[0][t] - step[1].log_eff(ms[t])[0])
            row[t] = y
        return row


def attention_axis(op: str, heads: float, kv_heads: float, peaks: dict) -> Axis:
    """Roofline axis of one sequence's attention along its length (``Axis``): decode reads
    K/V per cached token per KV head plus a query per head (bound ~ context + heads/kv_heads;
    an 8-bit cache, ``_fp8kv``: context + 2 heads/kv_heads, the 2-byte query against 1-byte
    K/V); causal prefill turns from bandwidth to compute bound at (s + 1) r = 1 (FP8 context
    FMHA, ``_fp8``: 1-byte K/V, 2-byte Q/O, the FP8 peak; ``sim.cost.fit.bounds_s``)."""
    if attn_base(op) == "attn_decode":
        return Axis(shift=(2.0 if op.endswith("_fp8kv") else 1.0) * heads / kv_heads)
    bw = peaks["hbm_bw_bytes_per_s"]
    if op.endswith("_fp8"):
        return Axis(r=heads * bw / ((2.0 * heads + kv_heads) * peaks["fp8_flops_per_s"]))
    return Axis(r=heads * bw / (2.0 * (heads + kv_heads) * peaks["bf16_flops_per_s"]))


class HeadTables:
    """Attention efficiency grids per (query heads, KV heads) on one GPU; ``pick`` returns the
    grid of the measured head configuration nearest to a model's (log distance). Along the
    sequence axis: prefill monotone cubic (PCHIP), decode piecewise linear, both in the log
    roofline bound (held-out prefill p90 12.7% against 14.5% linear on H100; decode linear
    12.7% against 14.1% cubic)."""

    def __init__(self, d: dict, op: str, peaks: dict):
        self.op, self.peaks = op, peaks
        # (heads, KV heads) -> its measured table; the grid is built when first picked (start-up)
        self.tables = {(t["num_heads"], t["num_kv_heads"]): t for t in d["tables"]}
        self._grids: dict[tuple[int, int], Grid2] = {}
        # (heads, KV heads) asked -> pick's answer (the fit's held-out checks ask it per row)
        self._picked: dict[tuple[float, float], tuple[Grid2, tuple[int, int], float]] = {}

    def grid(self, key: tuple[int, int]) -> Grid2:
        g = self._grids.get(key)
        if g is None:
            t, op = self.tables[key], self.op
            prefill = attn_base(op) == "attn_prefill"
            axes = ("batch", "seq_tokens") if prefill else ("batch", "context_tokens")
            g = self._grids[key] = Grid2(t[axes[0]], t[axes[1]], log_eff_values(t["log_eff"]),
                                         attention_axis(op, t["num_heads"], t["num_kv_heads"], self.peaks),
                                         prefill)
        return g

    def pick(self, heads: float, kv_heads: float) -> tuple[Grid2, tuple[int, int], float]:
        """(grid, its (heads, KV heads), batch scale). The measured configuration with the
        nearest query-group size heads / kv_heads (it sets the kernel's shape: FA2/FA3/FlashInfer
        fold a KV head's query group into one tile), then the nearest KV-head count. An
        attention kernel's grid runs batch x KV heads independent (sequence, KV head) tiles, so
        a model with kv_heads KV heads at batch b does the work of the table's KVH at batch
        b * kv_heads / KVH: the lookup takes that batch (``batch scale``), so both the bytes
        and the latency floor are the measured kernel's, never a floor scaled by bytes.
        NOTE: an MHA model (Llama-2-7B, 32/32) uses the 8/8 table at 4x the batch; it used to
        borrow 32/8 at equal context, its short-context latency then scaled 4x with its KV
        bytes (44 us against 13 us per layer at context 16 on A100)."""
        hit = self._picked.get((heads, kv_heads))
        if hit is not None:
            return hit
        ratio = heads / kv_heads
        key = min(self.tables, key=lambda hk: (round(abs(math.log(hk[0] / hk[1] / ratio)), 6),
                                               abs(math.log(hk[1] / kv_heads)), abs(math.log(hk[0] / heads))))
        hit = self._picked[heads, kv_heads] = (self.grid(key), key, kv_heads / key[1])
        return hit


class Calibration:
    """Every calibrated table of one GPU; an operator absent from the file stays roofline-only."""

    def __init__(self, d: dict):
        self.raw = d
        self.gpu = d["gpu"]
        # the GPU whose kernels were measured: this one, or its same-architecture sibling
        # (``inherited_calibration``)
        self.measured_on: str = d.get("measured_on", self.gpu)
        self.architecture: str | None = d.get("architecture")
        peaks = d["peaks"]
        self.gemm = GemmTable(d["gemm"], peaks) if "gemm" in d else None
        # fp8 W8A8 GEMMs (CUTLASS scaled_mm), measured where the GPU has FP8 tensor cores
        self.gemm_fp8 = GemmTable(d["gemm_fp8"], peaks, fp8=True) if "gemm_fp8" in d else None
        # NVFP4 W4A4 GEMMs, measured where the GPU has FP4 tensor cores (B200)
        self.gemm_nvfp4 = GemmTable(d["gemm_nvfp4"], peaks, nvfp4=True) if "gemm_nvfp4" in d else None
        self._gemm_fp8_cublaslt: CublasLtFp8Table | None = None
        self.attn_prefill = HeadTables(d["attn_prefill"], "attn_prefill", peaks) if "attn_prefill" in d else None
        self.attn_decode = HeadTables(d["attn_decode"], "attn_decode", peaks) if "attn_decode" in d else None
        self.allreduce = ({int(t["tp"]): Curve(t["size_bytes"], log_eff_values(t["log_eff"])) for t in d["allreduce"]["tables"]}
                          if "allreduce" in d else None)
        self.custom_allreduce = ({int(t["tp"]): Curve(t["size_bytes"], log_eff_values(t["log_eff"]))
                                  for t in d["custom_allreduce"]["tables"]} if "custom_allreduce" in d else None)
        self.elementwise = ({kind: Curve(t["bytes"], log_eff_values(t["log_eff"])) for kind, t in d["elementwise"]["tables"].items()}
                            if "elementwise" in d else None)
        self.overhead = d.get("overhead")
        # FA2 split-KV combine kernel of decode attention (sim/cost/fit.py ``fa2_split_kv``).
        self.decode_split = d["attn_decode"].get("split_kv") if "attn_decode" in d else None
        # an engine's own attention tables (``ENGINE_ATTN_OPS``), where measured on this GPU
        self.engine_attn = {op: HeadTables(d[op], op, peaks) for op in ENGINE_ATTN_OPS if op in d}

    def attention(self, op: str) -> "HeadTables | None":
        """The attention table ``op`` (``attn_prefill``, ``attn_decode`` or one of
        ``ENGINE_ATTN_OPS``); None where not measured."""
        if op == "attn_prefill":
            return self.attn_prefill
        if op == "attn_decode":
            return self.attn_decode
        return self.engine_attn.get(op)

    def engine_attention(self, tables: str, kv_8bit: bool, fp8_context: bool
                         ) -> tuple["HeadTables | None", str, "HeadTables | None", str]:
        """(prefill table, its op, decode table, its op) of an attention backend whose kernels
        were measured as ``tables`` (sim/catalog/attention_backends.yaml; "" for none): that
        engine's own tables where this GPU has them, else the GPU's main tables
        (``attn_prefill`` / ``attn_decode``, vLLM's kernels). An 8-bit cache (``kv_8bit``) reads
        the ``_fp8kv`` decode table where measured, else the 16-bit one (looked up at equal
        bytes); FP8 context FMHA (``fp8_context``) the ``_fp8`` prefill table where measured."""
        pre, pre_op = self.attn_prefill, "attn_prefill"
        dec, dec_op = self.attn_decode, "attn_decode"
        if tables:
            for op in ((f"attn_prefill_{tables}_fp8",) if fp8_context else ()) + (f"attn_prefill_{tables}",):
                if op in self.engine_attn:
                    pre, pre_op = self.engine_attn[op], op
                    break
            for op in ((f"attn_decode_{tables}_fp8kv",) if kv_8bit else ()) + (f"attn_decode_{tables}",):
                if op in self.engine_attn:
                    dec, dec_op = self.engine_attn[op], op
                    break
        return pre, pre_op, dec, dec_op

    def fp8_table(self, kernel: str) -> GemmTable | None:
        """The fp8 GEMM table as ``kernel`` (an engine profile's ``fp8_gemm``) runs it: the
        measured CUTLASS kernel (``"cutlass"``) or cuBLASLt (``"cublaslt"``: ``CublasLtFp8Table``,
        built when first asked)."""
        if kernel != "cublaslt" or self.gemm_fp8 is None:
            return self.gemm_fp8
        if self._gemm_fp8_cublaslt is None:
            self._gemm_fp8_cublaslt = CublasLtFp8Table(self.gemm_fp8, self.gemm)
        return self._gemm_fp8_cublaslt

    @property
    def terms(self) -> dict:
        """The step terms the tables were fitted with (``sim.cost.fit.bounds_s`` / ``extra_s``)."""
        t = {}
        if self.gemm is not None and self.gemm.wave:
            t["gemm_wave"] = self.gemm.wave
        if self.decode_split:
            t["decode_split"] = self.decode_split
        return t

    @property
    def calibrated_ops(self) -> tuple[str, ...]:
        # NOTE: the file's "overhead" fit is no longer read by the cost model: a step's engine
        # overhead comes from the scenario's engine profile (sim/cost/engine_profile.py).
        return tuple(op for op in CALIBRATED_OPS if op in self.raw and op != "overhead")

    def allreduce_curve(self, tp: int, custom: bool = False) -> Curve | None:
        """The measured curve of the nearest measured world size: NCCL's ring, or with
        ``custom`` vLLM's custom all-reduce."""
        tabs = self.custom_allreduce if custom else self.allreduce
        if not tabs:
            return None
        key = min(tabs, key=lambda t: abs(math.log(t / tp)))
        return tabs[key]


def calibration_dir() -> Path:
    return Path(str(resources.files("sim.catalog").joinpath("calibration")))


@lru_cache(maxsize=16)
def _load(path: str) -> Calibration:
    return Calibration(json.loads(Path(path).read_text()))


def load_calibration(gpu_key: str, path: Path | None = None) -> Calibration | None:
    """The default calibration of ``gpu_key`` (or the file ``path``): its own measured profile,
    else its same-architecture sibling's, inherited (``inherited_calibration``); None when
    neither exists."""
    p = Path(path) if path is not None else calibration_dir() / f"{gpu_key}.json"
    if p.is_file():
        return _load(str(p.resolve()))
    sibling = calibration_sibling(gpu_key) if path is None else None
    return None if sibling is None else inherited_calibration(gpu_key, sibling)


def calibration_sibling(gpu_key: str) -> str | None:
    """The catalogue GPU whose measured profile ``gpu_key`` inherits (``catalog/gpus.yaml``
    ``calibration_sibling``); None for a GPU with its own profile, none declared, or a part
    outside the catalogue (``hardware.custom``: roofline)."""
    from sim.spec.hardware import catalogue
    entry = catalogue().get(gpu_key)
    return None if entry is None else entry.get("calibration_sibling")


# Tables dropped when the inheriting GPU lacks the peak they are measured against.
_TABLE_PEAK = {"gemm_fp8": "fp8_flops_per_s", "gemm_nvfp4": "fp4_flops_per_s", "attn_prefill_trtllm_fp8": "fp8_flops_per_s"}
# Collective tables: measured over the sibling's GPU-GPU fabric.
COLLECTIVE_OPS = ("allreduce", "custom_allreduce")


@lru_cache(maxsize=16)
def inherited_calibration(gpu_key: str, sibling: str) -> Calibration:
    """``sibling``'s measured efficiencies priced at ``gpu_key``'s own peaks.

    Why: a GPU of the same architecture (the same CUDA compute capability: the same SM, tensor
    cores and compiled kernels; NVIDIA "CUDA GPUs" compute capability list,
    developer.nvidia.com/cuda-gpus) reaches the same fraction of its roofline bound at the same
    shape: GB200's GPU is the B200 die (sm_100, 148 SMs) at a higher power cap (1,200 vs
    1,000 W, NVIDIA GB200 NVL72 and HGX B200 datasheets; kernels_profile/hardware.md). Every
    efficiency is a fraction of ``max(FLOPs / peak, bytes / bandwidth)`` (module docstring), so
    the sibling's fractions apply to this GPU's peaks: the cost model prices each bound at the
    GPU's own peaks (``RooflineCostModel``, ``CalibratedOps``) and looks the efficiency up at the
    step's shape. The tables keep the measured GPU's ``peaks``, the axes they interpolate along
    between measured shapes, so the efficiency at a shape is the sibling's at that shape (on this
    GPU's peaks the axes' kinks would move and lookups between measured token counts drift by a
    few per cent either way); the wave and split-KV terms count this GPU's SMs. Without it such a GPU ran the roofline
    with default efficiencies: GB200 simulated 24-87% faster than TensorRT-LLM measured, B200
    at its measured profile within 12% (validation/VC-24.yaml, issue 40).
    NOTE: collective curves are kept only where both GPUs' GPU-GPU links are of one kind (an
    NVLink/NVSwitch fabric, or PCIe: ``GPUSpec.full_nvlink``): NCCL's efficiency is a property of
    the fabric, not of the SM; otherwise those operators stay roofline.
    """
    from sim.spec.hardware import catalogue, get_gpu
    cat = catalogue()
    own, sib = cat[gpu_key], cat[sibling]
    if own.get("architecture") is None or own.get("architecture") != sib.get("architecture"):
        raise ValueError(f"catalog/gpus.yaml:{gpu_key}: calibration_sibling {sibling!r} is not of its architecture "
                         f"({own.get('architecture')!r} vs {sib.get('architecture')!r})")
    path = calibration_dir() / f"{sibling}.json"
    if not path.is_file():
        raise ValueError(f"catalog/gpus.yaml:{gpu_key}: calibration_sibling {sibling!r} has no measured profile")
    d = json.loads(path.read_text())
    gpu, sib_gpu = get_gpu(gpu_key), get_gpu(sibling)
    d["gpu"], d["measured_on"], d["architecture"] = gpu_key, sibling, own["architecture"]
    for op, peak in _TABLE_PEAK.items():
        if op in d and getattr(gpu, peak) is None:
            del d[op]
    if gpu.full_nvlink != sib_gpu.full_nvlink:
        for op in COLLECTIVE_OPS:
            d.pop(op, None)
    if gpu.num_sms is not None:
        for term in (d.get("gemm", {}).get("wave"), d.get("attn_decode", {}).get("split_kv")):
            if term:
                term["sms"] = gpu.num_sms
    return Calibration(d)


# Calibrated GPUs that lend an operator's table to a GPU whose profile lacks it, in order of
# preference (H100: the newest GPU with every table; A100 next).
DONORS = ("h100-sxm", "a100-80g")
# Operators carried: bandwidth-bound ones, whose measured curve transfers by the bandwidth ratio
# (``carry_elementwise``). NOTE: vidur profiled elementwise kernels on A100 and H100 only.
CARRIED_OPS = ("elementwise",)


def carried_from(cal: Calibration | None) -> dict[str, str]:
    """{operator: donor GPU} for each carried operator this calibration lacks."""
    if cal is None:
        return {}
    out = {}
    for op in CARRIED_OPS:
        if op in cal.raw:
            continue
        for donor in DONORS:
            d = load_calibration(donor)
            if donor != cal.gpu and d is not None and op in d.raw:
                out[op] = donor
                break
    return out


def describe(cal: Calibration | None, carried: dict[str, str] | None = None) -> str:
    """One line for ``result.json`` and ``simsrv explain``: which operators are calibrated, and
    which carry another GPU's measured curve (``carried``: {operator: donor GPU})."""
    if cal is None:
        return "roofline (default efficiencies, uncalibrated; per-kernel launch floor)"
    carried = carried or {}
    # (an NVFP4 table exists only where the GPU has FP4 tensor cores: not listed as missing)
    rest = [op for op in CALIBRATED_OPS if op not in cal.calibrated_ops and op not in carried
            and op not in ("overhead", "gemm_nvfp4")]
    s = f"calibrated ({cal.gpu}): {', '.join(cal.calibrated_ops)}"
    if cal.measured_on != cal.gpu:
        s = (f"calibrated ({cal.gpu}: {cal.measured_on}'s measured efficiencies, same architecture "
             f"{cal.architecture}, at {cal.gpu}'s own peaks): {', '.join(cal.calibrated_ops)}")
    if carried:
        s += "; carried: " + ", ".join(f"{op} from {g} (bandwidth ratio)" for op, g in carried.items())
    return s + (f"; roofline only: {', '.join(rest)}" if rest else "")
