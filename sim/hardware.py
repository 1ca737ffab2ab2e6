"""GPU peaks: the catalogue of ``catalog/gpus.yaml`` (sources in kernels_profile/hardware.md)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from sim.errors import UserError


@dataclass(frozen=True)
class GPUSpec:
    """Dense vendor peaks of one GPU."""

    key: str
    name: str
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None
    memory_bytes: int
    hbm_bw_bytes_per_s: float
    nvlink_bw_bytes_per_s: float
    pcie_bw_bytes_per_s: float
    tdp_w: float
    source: str = ""

    @property
    def ridge_flops_per_byte(self) -> float:
        """Roofline ridge point (Williams et al. 2009, "Roofline"): peak FLOP/s / bandwidth."""
        return self.bf16_flops_per_s / self.hbm_bw_bytes_per_s


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    return yaml.safe_load(resources.files("sim.catalog").joinpath("gpus.yaml").read_text())


def get_gpu(key: str) -> GPUSpec:
    cat = catalogue()
    if key not in cat:
        raise UserError(f"hardware.gpu: unknown GPU {key!r}; known: {', '.join(sorted(cat))}")
    d = cat[key]
    return GPUSpec(
        key=key,
        name=d["name"],
        bf16_flops_per_s=float(d["bf16_flops_per_s"]),
        fp8_flops_per_s=None if d["fp8_flops_per_s"] is None else float(d["fp8_flops_per_s"]),
        memory_bytes=int(d["memory_bytes"]),
        hbm_bw_bytes_per_s=float(d["hbm_bw_bytes_per_s"]),
        nvlink_bw_bytes_per_s=float(d["nvlink_bw_bytes_per_s"]),
        pcie_bw_bytes_per_s=float(d["pcie_bw_bytes_per_s"]),
        tdp_w=float(d["tdp_w"]),
        source=d.get("source", ""),
    )
