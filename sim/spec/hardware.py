"""GPU peaks: the catalogue of ``catalog/gpus.yaml`` (sources in kernels_profile/hardware.md),
a GPU described inline in a scenario (``hardware.custom``), and power/clock caps.

Why: published benchmarks run on many parts, some of them power-capped; a deployment must be
describable without editing the package. ``memory_bytes`` is what the driver exposes
(nvidia-smi ``memory.total``), the figure vLLM's ``gpu_memory_utilization`` multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from sim.errors import UserError
from sim.catalog.packed import load_catalog


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
    int8_ops_per_s: float | None = None
    num_sms: int | None = None
    driver_reserved_bytes: int = 0
    # every GPU pair linked directly (NVLink/NVSwitch, Infinity Fabric): vLLM's custom
    # all-reduce needs it beyond two GPUs (custom_all_reduce.py ``full_nvlink``)
    full_nvlink: bool = True
    # the node this part usually ships in (catalog/gpus.yaml): GPUs sharing the GPU-GPU link,
    # each GPU's share of the node's network (one direction) and that link's per-message latency
    gpus_per_node: int = 8
    inter_node_bw_bytes_per_s: float = 50.0e9
    inter_node_latency_s: float = 10e-6
    # dense FP4 tensor-core peak (Blackwell: NVFP4 / MXFP4 MMA); None: no FP4 tensor cores
    fp4_flops_per_s: float | None = None
    # "nvidia" | "amd": the platform vLLM runs on (CUDA or ROCm), which decides the quantization
    # methods it accepts (sim/spec/quantization.py ``check_gpu``)
    vendor: str = "nvidia"
    # the L2 cache's read bandwidth where the vendor publishes it (catalog/gpus.yaml); None: not
    # published. Prices data that many thread blocks load again after one of them brought it
    # from HBM (sim/cost/attention_backend.py, TensorRT-LLM's pre-XQA decode kernel).
    l2_read_bw_bytes_per_s: float | None = None

    @property
    def cuda_total_bytes(self) -> int:
        """What CUDA reports as the device's total (``cudaMemGetInfo``, vLLM's
        ``total_gpu_memory``): nvidia-smi's Total less the driver's Reserved."""
        return self.memory_bytes - self.driver_reserved_bytes

    @property
    def ridge_flops_per_byte(self) -> float:
        """Roofline ridge point (Williams et al. 2009, "Roofline"): peak FLOP/s / bandwidth."""
        return self.bf16_flops_per_s / self.hbm_bw_bytes_per_s


# Fields a catalogue entry or ``hardware.custom`` gives; the first three are required.
REQUIRED = ("bf16_flops_per_s", "hbm_bw_bytes_per_s", "memory_bytes")
OPTIONAL = ("fp8_flops_per_s", "fp4_flops_per_s", "vendor", "int8_ops_per_s", "nvlink_bw_bytes_per_s", "pcie_bw_bytes_per_s", "tdp_w",
            "num_sms", "driver_reserved_bytes", "full_nvlink", "gpus_per_node", "inter_node_bw_bytes_per_s",
            "inter_node_latency_s", "l2_read_bw_bytes_per_s")
# NOTE: nvidia-smi -q "FB Memory Usage / Reserved" on H100 80GB is 328-551 MiB across drivers; with
# 551 MiB, 81,559 - 551 = 81,008 MiB = 79.11 GiB, the total_gpu_memory vLLM logs on that part
# (kernels_profile/hardware.md). Used for NVIDIA parts without their own figure.
DEFAULT_NVIDIA_RESERVED_BYTES = 551 * 2**20
# NOTE: a part whose entry does not say: an 8-GPU HGX/DGX-class node with one 400 Gb/s NIC per GPU
# (DGX H100: 8 x ConnectX-7 NDR 400 Gb/s; aiconfigurator systems/h100_sxm.yaml inter_node_bw 50e9),
# 10 us per message across it (aiconfigurator p2p_latency; NCCL src/graph/tuning.cc hwLat of the
# network for the ring's Simple protocol, 9.6 us).
DEFAULT_GPUS_PER_NODE = 8
VENDORS = ("nvidia", "amd")
DEFAULT_INTER_NODE_BW_BYTES_PER_S = 50.0e9
DEFAULT_INTER_NODE_LATENCY_S = 10e-6


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    return load_catalog("gpus.yaml")


def _opt(d: dict, k: str, cast=float):
    v = d.get(k)
    return None if v is None else cast(v)


def _spec(key: str, d: dict, where: str) -> GPUSpec:
    missing = [k for k in REQUIRED if d.get(k) is None]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}")
    try:
        pcie = float(d.get("pcie_bw_bytes_per_s") or 32.0e9)  # NOTE: PCIe Gen4 x16 when not given
        spec = GPUSpec(
            key=key,
            name=str(d.get("name") or key),
            bf16_flops_per_s=float(d["bf16_flops_per_s"]),
            fp8_flops_per_s=_opt(d, "fp8_flops_per_s"),
            memory_bytes=int(d["memory_bytes"]),
            hbm_bw_bytes_per_s=float(d["hbm_bw_bytes_per_s"]),
            # a part without a GPU-GPU link talks over PCIe
            nvlink_bw_bytes_per_s=float(d.get("nvlink_bw_bytes_per_s") or pcie),
            pcie_bw_bytes_per_s=pcie,
            tdp_w=float(d.get("tdp_w") or 0.0),
            source=str(d.get("source", "")),
            int8_ops_per_s=_opt(d, "int8_ops_per_s"),
            num_sms=_opt(d, "num_sms", int),
            # a GPU-GPU link no faster than the host link is PCIe, not an NVLink/NVSwitch fabric
            full_nvlink=bool(d["full_nvlink"]) if d.get("full_nvlink") is not None
            else float(d.get("nvlink_bw_bytes_per_s") or pcie) > pcie,
            driver_reserved_bytes=int(d["driver_reserved_bytes"]) if d.get("driver_reserved_bytes") is not None
            else DEFAULT_NVIDIA_RESERVED_BYTES,
            gpus_per_node=int(d.get("gpus_per_node") or DEFAULT_GPUS_PER_NODE),
            inter_node_bw_bytes_per_s=float(d.get("inter_node_bw_bytes_per_s") or DEFAULT_INTER_NODE_BW_BYTES_PER_S),
            inter_node_latency_s=float(d["inter_node_latency_s"]) if d.get("inter_node_latency_s") is not None
            else DEFAULT_INTER_NODE_LATENCY_S,
            fp4_flops_per_s=_opt(d, "fp4_flops_per_s"),
            vendor=str(d.get("vendor") or "nvidia"),
            l2_read_bw_bytes_per_s=_opt(d, "l2_read_bw_bytes_per_s"),
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: bad value ({e})") from None
    if spec.vendor not in VENDORS:
        raise UserError(f"{where}.vendor: {spec.vendor!r}; known: {', '.join(VENDORS)}")
    for k in (*REQUIRED, "nvlink_bw_bytes_per_s", "pcie_bw_bytes_per_s", "cuda_total_bytes", "gpus_per_node",
              "inter_node_bw_bytes_per_s"):
        if not getattr(spec, k) > 0:
            raise UserError(f"{where}.{k}: must be > 0, got {getattr(spec, k)}")
    if spec.l2_read_bw_bytes_per_s is not None and not spec.l2_read_bw_bytes_per_s > 0:
        raise UserError(f"{where}.l2_read_bw_bytes_per_s: must be > 0, got {spec.l2_read_bw_bytes_per_s}")
    return spec


def get_gpu(key: str) -> GPUSpec:
    cat = catalogue()
    if key not in cat:
        raise UserError(f"hardware.gpu: unknown GPU {key!r}; known: {', '.join(sorted(cat))}")
    return _spec(key, cat[key], f"catalog/gpus.yaml:{key}")


def custom_gpu(custom: dict) -> GPUSpec:
    """A GPU described inline: ``based_on`` a catalogue GPU (optional) with fields overridden,
    or every required field given. Its key ``custom:<name>`` has no calibration (roofline)."""
    d = {k: v for k, v in custom.items() if v is not None}
    base = d.pop("based_on", None)
    if base is not None and base not in catalogue():
        raise UserError(f"hardware.custom.based_on: unknown GPU {base!r}; known: {', '.join(sorted(catalogue()))}")
    fields = dict(catalogue()[base]) if base is not None else {}
    fields.update(d)
    name = str(d.get("name") or (f"{base} (custom)" if base else "custom"))
    fields["name"] = name
    fields["source"] = "scenario hardware.custom" + (f" based on {base}" if base else "")
    return _spec(f"custom:{name}", fields, "hardware.custom")


def capped(gpu: GPUSpec, flops_factor: float = 1.0, bandwidth_factor: float = 1.0) -> GPUSpec:
    """A power- or clock-capped part: peak FLOP/s (all dtypes) times ``flops_factor``, memory
    bandwidth times ``bandwidth_factor``.

    NOTE: tensor-core throughput scales with the SM clock, which a power cap lowers (NVIDIA
    nvidia-smi ``--power-limit`` / ``--lock-gpu-clocks``); HBM bandwidth follows the memory
    clock, which power caps usually leave alone, hence two factors. Links are not scaled.
    """
    if flops_factor == 1.0 and bandwidth_factor == 1.0:
        return gpu

    def f(v):
        return None if v is None else v * flops_factor

    return replace(gpu, bf16_flops_per_s=gpu.bf16_flops_per_s * flops_factor,
                   fp8_flops_per_s=f(gpu.fp8_flops_per_s), int8_ops_per_s=f(gpu.int8_ops_per_s),
                   fp4_flops_per_s=f(gpu.fp4_flops_per_s),
                   hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s * bandwidth_factor,
                   name=f"{gpu.name} (capped: FLOP/s x{flops_factor:g}, bandwidth x{bandwidth_factor:g})")


def scenario_gpu(hardware, key: str | None = None) -> GPUSpec:
    """The GPU of a scenario's ``hardware`` section, or the catalogue GPU ``key`` of a
    disaggregated pool; the caps apply to either."""
    if key is not None:
        gpu = get_gpu(key)
    elif getattr(hardware, "custom", None) is not None:
        gpu = custom_gpu(hardware.custom.model_dump())
    else:
        gpu = get_gpu(hardware.gpu)
    return capped(gpu, getattr(hardware, "flops_factor", 1.0), getattr(hardware, "bandwidth_factor", 1.0))
