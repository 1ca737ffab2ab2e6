"""Weight quantization: bytes per linear-layer weight and the tensor-core peak its GEMMs run at.

Why: a quantized checkpoint changes the two things a serving step is bound by: the weight
bytes every decode step streams (and the memory left for KV blocks), and, where activations
are quantized too (W8A8), the GEMM's compute peak. Names follow vLLM's ``--quantization``
(vllm/model_executor/layers/quantization/__init__.py: ``fp8``, ``awq``, ``gptq``; W8A8 int8
checkpoints load through ``compressed-tensors``, named ``int8`` here).

Only the linear layers (q/k/v/o, gate/up/down, MoE experts) are quantized; the embedding, the
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


@dataclass(frozen=True)
class Quantization:
    """How one method stores and multiplies linear-layer weights."""

    name: str
    weight_bytes: float   # bytes per linear weight, scales included
    compute: str          # "fp8" | "int8": W8A8 on that tensor-core peak; "bf16": weight-only (dequant)

    def gemm_peak_flops_per_s(self, gpu) -> float:
        """The tensor-core peak this method's GEMMs run at on ``gpu``.
        fp8 W8A8 (cutlass_scaled_mm) needs FP8 tensor cores (Ada/Hopper/Blackwell); on older GPUs
        vLLM runs fp8 checkpoints weight-only through the FP8 Marlin kernel (fp8.py:
        ``use_marlin`` when the capability is below 8.9), dequantizing to bf16.
        int8 W8A8 runs on INT8 tensor cores (all catalogue NVIDIA GPUs have them)."""
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
}


def get_quantization(name: str | None, where: str = "quantization") -> Quantization | None:
    if name is None or name in ("none", "auto"):
        return None
    q = METHODS.get(str(name).lower())
    if q is None:
        raise UserError(f"{where}: unknown quantization {name!r}; known: {', '.join(METHODS)}")
    return q
