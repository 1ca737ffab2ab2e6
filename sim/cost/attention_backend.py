"""Attention backends: what an engine's attention kernels do that changes their cost.

Why: the same attention costs differently under different kernels. A GQA model's decode step
reads each KV head's cache once when the kernel serves a whole query-head group per thread
block (FlashAttention-2, FlashInfer, TensorRT-LLM's XQA), but once per query head when it
launches one block per (sequence, query head) and each block converts an 8-bit cache itself
(TensorRT-LLM's masked multi-head attention before XQA): group-size times the KV bytes, which
the XQA blog measures as a 2.4x throughput gap on Llama-70B with an fp8 cache. With a 16-bit
cache the same blocks load the same lines without converting them: the first load brings them
from HBM and the group's others find them in L2, so the re-reads cost the L2's read bandwidth,
not HBM's (``per_query_head_l2``). Such a kernel is priced at its own shape: the calibrated
decode table of an MHA kernel (one query head per block) at batch x query heads, at the context
itself whatever the cache dtype (``decode_tile_kv_heads``, ``per_query_head_blocks``; sim/cost/
roofline.py). The figures live in ``sim/catalog/attention_backends.yaml``,
each with its source; ``engine.attention_backend`` names one (default: the engine profile's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.errors import UserError
from sim.catalog.packed import load_catalog

KV_LOADS = ("per_kv_head", "per_query_head", "per_query_head_8bit_kv", "per_query_head_l2")


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    decode_kv_loads: str
    description: str = ""
    sources: tuple[str, ...] = ()
    # the engine whose own measured attention tables price these kernels where a GPU has them
    # (sim/cost/calibration.py ``ENGINE_ATTN_OPS``: attn_{prefill,decode}_<tables>); "": the
    # GPU's main tables (vLLM's kernels)
    tables: str = ""

    def decode_kv_read_factor(self, q_heads: float, kv_heads: float, kv_dtype_bytes: float,
                              hbm_per_l2: float = 1.0) -> float:
        """How many times a decode step streams each cached K/V byte, in HBM-equivalent bytes:
        once, or once per query head of its group (``q_heads / kv_heads`` per GPU; for
        ``per_query_head_8bit_kv`` only with a 1-byte KV cache). ``per_query_head_l2``: an 8-bit
        cache's loads each convert in their own block (per query head, at HBM bandwidth, as the
        XQA blog's measured gap implies); a 16-bit cache's group reads its lines ``group`` times
        from L2, ``hbm_per_l2`` (HBM over L2 read bandwidth, 1 where the GPU's L2 figure is not
        published) pricing each L2 read in HBM time, and never less than the one load from HBM."""
        group = q_heads / kv_heads if kv_heads > 0 else 1.0
        loads = self.decode_kv_loads
        if loads == "per_query_head" or (loads in ("per_query_head_8bit_kv", "per_query_head_l2")
                                         and kv_dtype_bytes <= 1):
            return max(1.0, group)
        if loads == "per_query_head_l2":
            return max(1.0, group * hbm_per_l2)
        return 1.0

    def per_query_head_blocks(self, kv_dtype_bytes: float) -> bool:
        """Whether the decode kernel runs one thread block per (sequence, query head) for this
        cache dtype (``per_kv_head``: a block per KV head serves its whole query-head group)."""
        loads = self.decode_kv_loads
        return loads in ("per_query_head", "per_query_head_l2") or (
            loads == "per_query_head_8bit_kv" and kv_dtype_bytes <= 1)

    def decode_tile_kv_heads(self, q_heads: float, kv_heads: float, kv_dtype_bytes: float) -> float:
        """The KV heads of the decode kernel's own shape, per GPU: a kernel of one block per
        (sequence, query head) is an MHA kernel (each block one query head and the cache of its
        KV head, no group folded into a tile): ``q_heads``; else the model's ``kv_heads``."""
        return q_heads if self.per_query_head_blocks(kv_dtype_bytes) else kv_heads


@lru_cache(maxsize=1)
def _catalog() -> dict:
    return load_catalog("attention_backends.yaml")


def backend_names() -> tuple[str, ...]:
    return tuple(_catalog())


def get_backend(name: str, where: str = "engine.attention_backend") -> AttentionBackend:
    cat = _catalog()
    if name not in cat:
        raise UserError(f"{where}: unknown attention backend '{name}'; valid: {', '.join(cat)}")
    d = cat[name]
    if d["decode_kv_loads"] not in KV_LOADS:  # catalogue integrity (a shipped file)
        raise UserError(f"sim/catalog/attention_backends.yaml: {name}.decode_kv_loads must be one of {', '.join(KV_LOADS)}")
    return AttentionBackend(name, d["decode_kv_loads"], d.get("description", ""), tuple(d.get("sources") or ()),
                            str(d.get("tables") or ""))
