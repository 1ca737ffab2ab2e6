"""Attention backends: what an engine's attention kernels do that changes their cost.

Why: the same attention costs differently under different kernels. A GQA model's decode step
reads each KV head's cache once when the kernel serves a whole query-head group per thread
block (FlashAttention-2, FlashInfer, TensorRT-LLM's XQA), but once per query head when it
launches one block per (sequence, query head) and each block converts an 8-bit cache itself
(TensorRT-LLM's masked multi-head attention before XQA): group-size times the KV bytes, which
the XQA blog measures as a 2.4x throughput gap on Llama-70B with an fp8 cache. The figures live in ``sim/catalog/attention_backends.yaml``, each with its
source; ``engine.attention_backend`` names one (default: the engine profile's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.errors import UserError
from sim.catalog.packed import load_catalog

KV_LOADS = ("per_kv_head", "per_query_head", "per_query_head_8bit_kv")


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    decode_kv_loads: str
    description: str = ""
    sources: tuple[str, ...] = ()

    def decode_kv_read_factor(self, q_heads: float, kv_heads: float, kv_dtype_bytes: float) -> float:
        """How many times a decode step streams each cached K/V byte: once, or once per
        query head of its group (``q_heads / kv_heads`` per GPU; for ``per_query_head_8bit_kv``
        only with a 1-byte KV cache)."""
        per_q = self.decode_kv_loads == "per_query_head" or (
            self.decode_kv_loads == "per_query_head_8bit_kv" and kv_dtype_bytes <= 1)
        if per_q and kv_heads > 0:
            return max(1.0, q_heads / kv_heads)
        return 1.0


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
    return AttentionBackend(name, d["decode_kv_loads"], d.get("description", ""), tuple(d.get("sources") or ()))
