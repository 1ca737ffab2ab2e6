"""Weight quantization: bytes per linear-layer weight and the tensor-core peak its GEMMs run at.

Why: a quantized checkpoint changes the two things a serving step is bound by: the weight
bytes every decode step streams (and the memory left for KV blocks), and, where activations
are quantized too (W8A8), the GEMM's compute peak. Names follow vLLM's ``--quantization``
(vllm/model_executor/layers/quantization/__init__.py: ``fp8``, ``awq``, ``gptq``; W8A8 int8
checkpoints load through ``compressed-tensors``, named ``int8`` here; ``modelopt_fp4`` for NVFP4
checkpoints, ModelOptNvFp4Config in modelopt.py; ``mxfp4`` for gpt-oss's experts, mxfp4.py).

Only the linear layers (q/k/v/o, gate/up/down, MoE experts) are quantized (``mxfp4``: the MoE
experts alone, vLLM's Mxfp4Config.get_quant_method gives every LinearBase the
UnquantizedLinearMethod); the embedding, the
LM head and the norms stay in the model dtype (vLLM's default for these methods: the LM head
is a ``ParallelLMHead`` left unquantized unless ``lm_head_quantized``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import UserError

# GPTQ / AWQ 4-bit: 8 weights packed per int32 (0.5 byte each), per group of 128 input rows one
# fp16 scale and one 4-bit zero point per output column (vLLM gptq.py / awq.py:
# ``pack_factor = 32 // weight_bits``, ``scales`` [in/group, out] fp16, ``qzeros`` packed int32);
# group_size 128 is the default of both quantizers (AutoGPTQ, AutoAWQ).
INT4_GROUP = 128
INT4_BYTES_PER_WEIGHT = 0.5 + (2.0 + 0.5) / INT4_GROUP

# NVFP4: 4-bit E2M1 values, one FP8 E4M3 scale per block of 16 values, one FP32 scale per tensor
# (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", developer blog,
# 2025; vLLM modelopt.py ModelOptNvFp4LinearMethod: ``weight`` packed 2 per byte, ``weight_scale``
# FP8-E4M3 [out, in/16], ``weight_scale_2`` one fp32): 4 + 8/16 = 4.5 bits per weight.
NVFP4_BLOCK = 16
NVFP4_BYTES_PER_WEIGHT = (4.0 + 8.0 / NVFP4_BLOCK) / 8.0
# MXFP4: 4-bit E2M1 values, one E8M0 (8-bit power-of-two) scale per block of 32 (OCP Microscaling
# Formats (MX) Specification v1.0, 2023, section 5: MXFP4 k = 32, scale E8M0; vLLM mxfp4.py
# Mxfp4MoEMethod.create_weights: ``w13_weight_scale`` uint8 [.., hidden/32]): 4 + 8/32 = 4.25 bits.
MXFP4_BLOCK = 32
MXFP4_BYTES_PER_WEIGHT = (4.0 + 8.0 / MXFP4_BLOCK) / 8.0


@dataclass(frozen=True)
class Quantization:
    """How one method stores and multiplies linear-layer weights."""

    name: str
    weight_bytes: float   # bytes per linear weight, scales included
    compute: str          # "fp8" | "int8" | "fp4": W8A8 / W4A4 on that peak; "bf16": weight-only (dequant)
    experts_only: bool = False  # only the routed MoE experts are stored quantized (mxfp4)
    cuda_only: bool = False     # vLLM lists it on CUDA only (not in ROCm's supported_quantization)

    @property
    def weight_bits(self) -> float:
        return self.weight_bytes * 8.0

    def check_gpu(self, gpu) -> None:
        """One line naming the key where vLLM refuses this method on ``gpu``.
        vllm/platforms/rocm.py ``supported_quantization`` lists ``mxfp4`` but not
        ``modelopt_fp4``; every catalogue NVIDIA part has compute capability >= 8.0, the
        ``get_min_capability`` of both (modelopt.py, mxfp4.py)."""
        if self.cuda_only and gpu.vendor != "nvidia":
            raise UserError(f"quantization: {self.name} is not supported on {gpu.key} ({gpu.vendor}): vLLM's "
                            f"ROCm platform does not list it (vllm/platforms/rocm.py supported_quantization)")

    def gemm_peak_flops_per_s(self, gpu) -> float:
        """The tensor-core peak this method's GEMMs run at on ``gpu``.
        fp8 W8A8 (cutlass_scaled_mm) needs FP8 tensor cores (Ada/Hopper/Blackwell); on older GPUs
        vLLM runs fp8 checkpoints weight-only through the FP8 Marlin kernel (fp8.py:
        ``use_marlin`` when the capability is below 8.9), dequantizing to bf16.
        int8 W8A8 runs on INT8 tensor cores (all catalogue NVIDIA GPUs have them).
        NVFP4 W4A4 needs FP4 tensor cores (Blackwell, ``cutlass_fp4_supported``: capability
        10.0+); below them vLLM picks the Marlin weight-only FP4 kernel
        (ModelOptNvFp4LinearMethod.__init__: flashinfer / cutlass, else ``is_fp4_marlin_supported``
        = capability >= 8.0, ``apply_fp4_marlin_linear``), dequantizing to bf16."""
        self.check_gpu(gpu)
        if self.compute == "fp4" and gpu.fp4_flops_per_s:
            return gpu.fp4_flops_per_s
        if self.compute == "fp8" and gpu.fp8_flops_per_s:
            return gpu.fp8_flops_per_s
        if self.compute == "int8" and gpu.int8_ops_per_s:
            return gpu.int8_ops_per_s
        return gpu.bf16_flops_per_s


METHODS = {
    # per-tensor (or per-channel) fp8 weights; scales are one float per tensor/channel: negligible
    "fp8": Quantization("fp8", 1.0, "fp8"),
    "int8": Quantization("int8", 1.0, "int8"),
    "awq": Quantization("awq", INT4_BYTES_PER_WEIGHT, "bf16"),
    "gptq": Quantization("gptq", INT4_BYTES_PER_WEIGHT, "bf16"),
    # NVFP4 W4A4: activations quantized to NVFP4 too (modelopt.py apply: ``scaled_fp4_quant`` of
    # the input, then ``cutlass_scaled_fp4_mm`` / flashinfer ``mm_fp4``) on FP4 tensor cores
    "modelopt_fp4": Quantization("modelopt_fp4", NVFP4_BYTES_PER_WEIGHT, "fp4", cuda_only=True),
    # MXFP4 experts with bf16 activations on every backend vLLM 0.11 picks by default
    # (mxfp4.py get_mxfp4_backend: SM100_FI_MXFP4_BF16 on Blackwell, SM90_FI_MXFP4_BF16 / Marlin /
    # Triton on Hopper and Ampere, Triton on ROCm; MXFP8 activations only behind
    # VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8*): weight-only, bf16 compute
    "mxfp4": Quantization("mxfp4", MXFP4_BYTES_PER_WEIGHT, "bf16", experts_only=True),
}


def get_quantization(name: str | None, where: str = "quantization") -> Quantization | None:
    if name is None or name in ("none", "auto"):
        return None
    q = METHODS.get(str(name).lower())
    if q is None:
        raise UserError(f"{where}: unknown quantization {name!r}; known: {', '.join(METHODS)}")
    return q
