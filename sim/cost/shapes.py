"""Kernel-shape helpers shared by the per-step cost model and the fitter (``sim/cost/fit.py``).

Why: the simulator's hot path (``roofline.py``, ``calibrated.py``) needs a few shape formulas
that the fit also uses; they live here so the hot path does not import the fitter (numpy,
polars, 300+ lines of table fitting). Plain Python, no dependencies.
"""

from __future__ import annotations

import math

# Bytes moved per token per unit of row width, 2-byte activations: a norm reads and writes the
# row; a residual add reads two rows and writes one; rotary reads and writes q and k; a gated
# activation reads gate and up (2 I) and writes I; a plain one reads I and writes I.
ELEM_BYTES_PER_WIDTH = {"norm": 4, "add": 6, "rope": 4, "act_gated": 6, "act": 4}
FA2_BLOCK_N = 128        # FA2 set_params_splitkv: block_n = 128 for head_dim 65..128


def prefill_pairs(c, x):
    """Causal (query, key) pairs of a chunk of c new tokens after x cached ones:
    c * (x + (c + 1) / 2) (FlashAttention-2, Dao 2023: causal attention is half the square)."""
    return c * (x + (c + 1) / 2.0)


def fa2_num_splits(bnh: int, slots: int, nblk: int, max_splits: int = 128) -> int:
    """FlashAttention-2's split-KV count (flash_api.cpp ``num_splits_heuristic``, Dao 2023;
    Flash-Decoding): no split when batch x heads x m-blocks fills 80% of the CTA slots
    (2 per SM); otherwise the fewest splits whose wave efficiency is within 85% of the best."""
    if bnh >= 0.8 * slots or nblk <= 1:
        return 1
    top = min(max_splits, slots, nblk)
    eff, best = [0.0] * (top + 1), 0.0
    for s in range(1, top + 1):
        if s == 1 or -(-nblk // s) != -(-nblk // (s - 1)):
            w = bnh * s / slots
            eff[s] = w / math.ceil(w)
            best = max(best, eff[s])
    for s in range(1, top + 1):
        if (s == 1 or -(-nblk // s) != -(-nblk // (s - 1))) and eff[s] >= 0.85 * best:
            return s
    return 1


def fa2_split_kv(batch: int, heads: float, kv_heads: float, kv_len: float, sms: int, block: int = FA2_BLOCK_N) -> bool:
    """Whether FA2 decode over ``kv_len`` cached tokens runs split-KV, i.e. launches the second
    (combine) kernel. vLLM's ``mha_varlen_fwd`` applies split-KV only to decode with grouped
    queries (``seqlenq_ngroups_swapped``: heads > kv_heads, the query groups folded into the
    m dimension, so batch x kv_heads x ceil(groups / 64) CTAs before splitting)."""
    if heads <= kv_heads:
        return False
    bnh = int(batch) * int(round(kv_heads)) * math.ceil(heads / kv_heads / 64.0)
    return fa2_num_splits(bnh, 2 * sms, math.ceil(kv_len / block)) > 1


def wave_padding(m: float, n: float, sms: int, tm: int, tn: int) -> float:
    """Wave quantization of a GEMM's output tiles (NVIDIA, "Matrix Multiplication Background
    User's Guide"): tiles = ceil(m/Tm) ceil(n/Tn) run in waves = ceil(tiles / SMs), so the GPU
    does the work of waves * SMs * Tm * Tn outputs; the factor is that over m * n (>= 1).
    A skinny GEMM (m < Tm: one row of tiles, decode batches) is charged a partial last wave for
    the tiles it has (waves = max(1, tiles / SMs)), not a whole one: its tiles stream weights,
    so a tail wave of 4 tiles on 108 SMs does not cost a full wave of tensor-core work (with a
    whole last wave, Llama-3-8B's gate+up, n = 28,672 = 112 tiles of 256, at one token became
    compute bound at twice the weight-read time, where the measured neighbours, n = 16,384 and
    65,536, stream weights at 67-78% of HBM bandwidth).
    NOTE: this is a shape feature of the tile the fit selected, not a bound: cuBLAS picks other
    tiles and split-K where they run faster, and measured kernels beat the padded FLOPs at peak
    (A100 4096 x 14336 at m = 8: 4x), so it never divides a roofline bound
    (``sim.cost.calibration.GemmEff``: it only adds time between measured token counts)."""
    mm = m if m > 1.0 else 1.0
    nn = n if n > 1.0 else 1.0
    tiles = math.ceil(mm / tm) * math.ceil(nn / tn)
    w = tiles / sms
    # (max written out: compiled, sim/compiled_core.py, native arithmetic)
    waves: float = (w if w > 1.0 else 1.0) if mm < tm else float(math.ceil(w))
    return waves * sms * tm * tn / (mm * nn)


# vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py): used for
# world sizes 2, 4, 6, 8 (``_SUPPORTED_WORLD_SIZES``), buffers under ``max_size`` = 8 MiB, on
# fully NVLink-connected GPUs (or any two GPUs); otherwise NCCL's ring.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024


def uses_custom_allreduce(tp: int, size_bytes: float, full_nvlink: bool) -> bool:
    """Whether vLLM routes this all-reduce through its custom kernel (``should_custom_ar``)."""
    return tp in CUSTOM_AR_WORLD_SIZES and size_bytes < CUSTOM_AR_MAX_BYTES and (full_nvlink or tp == 2)


def custom_allreduce_link_bytes(tp: float, size_bytes: float) -> float:
    """Bytes each GPU moves over its links in vLLM's custom all-reduce (csrc/custom_all_reduce.cuh
    dispatch): one-shot (``cross_device_reduce_1stage``: every rank reads all tp - 1 peers'
    whole buffers) for 2 GPUs, for <= 4 GPUs under 512 KiB and <= 8 GPUs under 256 KiB;
    otherwise two-shot (reduce-scatter then all-gather: 2 (tp - 1) / tp of the buffer)."""
    one = tp == 2 or (tp <= 4 and size_bytes < 512 * 1024) or (tp <= 8 and size_bytes < 256 * 1024)
    return float((tp - 1) * size_bytes if one else 2.0 * (tp - 1) / tp * size_bytes)
