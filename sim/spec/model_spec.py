"""A decoder-only transformer's architecture numbers (``ModelSpec``) and what follows from them:
parameters, weight bytes, KV bytes per token.

Why: its own module so that the catalogue and config readers (``sim/spec/models.py``,
``sim/spec/hf_config.py``) both build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, in HuggingFace config terms.

    Defaults describe the Llama layout (Touvron et al. 2023; HF modeling_llama.py): RoPE, q/k/v/o
    projections without bias, a gated (SwiGLU) MLP of three matrices, two RMSNorms per layer.
    The other fields describe the departures of other architectures (``sim/spec/hf_config.py``).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q, k, v biases
    num_experts: int = 1  # experts per MoE layer (1 = dense MLP)
    num_experts_per_tok: int = 1
    architecture: str = "llama"
    o_bias: bool = False          # attention output projection bias
    mlp_gated: bool = True        # gate*up (SwiGLU/GeGLU, 3 matrices) or up->act->down (2 matrices)
    mlp_bias: bool = False        # MLP (and expert) biases
    norm_bias: bool = False       # LayerNorm (weight + bias) rather than RMSNorm (weight)
    norms_per_layer: int = 2
    qk_norm: bool = False         # per-head RMSNorm on q and k (Qwen3, Gemma-3)
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    parallel_attn_mlp: bool = False  # attention and MLP read the same input (GPT-J, Falcon, NeoX)
    position: str = "rope"        # rope | alibi | learned
    extra_params: int = 0         # learned position table, embedding LayerNorm, projections
    lm_head_bias: bool = False
    sliding_window: int | None = None
    num_sliding_layers: int = 0   # layers whose attention (and KV) is limited to the window
    moe_intermediate_size: int | None = None  # one routed expert's width (default intermediate_size)
    shared_expert_intermediate_size: int = 0  # total width of the always-on shared expert(s)
    num_dense_layers: int = 0     # MoE models: leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    router_bias: bool = False
    kv_lora_rank: int = 0         # MLA (DeepSeek-V2/V3): compressed latent KV width
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    quantization: str | None = None  # linear-layer weights (sim/spec/quantization.py); None = dtype

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # -- parameters -----------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            # DeepSeek-V2 paper section 2.1.2 / HF modeling_deepseek_v3.py: q_a (h -> q_lora) + norm
            # + q_b (q_lora -> heads * (nope + rope)); kv_a (h -> kv_lora + rope) + norm; kv_b
            # (kv_lora -> heads * (nope + v)); o (heads * v -> h).
            nope = self.head_dim - self.qk_rope_head_dim
            qh = self.num_heads * self.head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qh) if self.q_lora_rank else h * qh
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * self.num_heads * (nope + self.v_head_dim)
            return q + kv + self.num_heads * self.v_head_dim * h
        p = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        p += (self.q_size + 2 * self.kv_size) if self.attention_bias else 0
        p += h if self.o_bias else 0
        p += 2 * self.head_dim if self.qk_norm else 0
        p += self.num_heads if self.attention_sinks else 0
        return p

    def _mlp(self, width: int) -> int:
        """One MLP of ``width`` intermediate units: 3 (gated) or 2 matrices, plus biases."""
        h = self.hidden_size
        p = (3 if self.mlp_gated else 2) * h * width
        if self.mlp_bias:
            p += (2 * width if self.mlp_gated else width) + h
        return p

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP (for a dense model: the MLP)."""
        return self._mlp(self.moe_intermediate_size or self.intermediate_size)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts > 1 else 0

    @property
    def _router_and_shared(self) -> int:
        h, e = self.hidden_size, self.num_experts
        shared = self._mlp(self.shared_expert_intermediate_size) if self.shared_expert_intermediate_size else 0
        return h * e + (e if self.router_bias else 0) + shared

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts' MLP weights (resident in memory), plus router and shared experts, of an
        MoE layer; the MLP of a dense layer."""
        if self.num_experts <= 1:
            return self._mlp(self.intermediate_size)
        return self.num_experts * self.expert_params + self._router_and_shared

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP weights one token touches: top-k experts (Jiang et al. 2024, "Mixtral of Experts")
        plus the shared ones (Dai et al. 2024, "DeepSeekMoE")."""
        if self.num_experts <= 1:
            return self._mlp(self.intermediate_size)
        return min(self.num_experts_per_tok, self.num_experts) * self.expert_params + self._router_and_shared

    @property
    def norm_params_per_layer(self) -> int:
        return self.norms_per_layer * self.hidden_size * (2 if self.norm_bias else 1)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return head + (self.vocab_size if self.lm_head_bias else 0)

    def _total(self, moe_mlp: int) -> int:
        L, h = self.num_layers, self.hidden_size
        dense_layers = L - self.num_moe_layers
        per_layer = self.attn_params_per_layer + self.norm_params_per_layer
        final_norm = h * (2 if self.norm_bias else 1)
        return (L * per_layer + dense_layers * self._mlp(self.intermediate_size) + self.num_moe_layers * moe_mlp
                + self.embedding_params + self.lm_head_params + final_norm + self.extra_params)

    @property
    def num_params(self) -> int:
        return self._total(self.mlp_params_per_layer)

    @property
    def linear_params(self) -> int:
        """Weights of the linear layers (attention projections, every MLP and expert matrix;
        no norms, biases, routers or embeddings): those weight quantization stores narrower."""
        h = self.hidden_size
        if self.is_mla:
            nope = self.head_dim - self.qk_rope_head_dim
            qh = self.num_heads * self.head_dim
            attn = (h * self.q_lora_rank + self.q_lora_rank * qh) if self.q_lora_rank else h * qh
            attn += h * (self.kv_lora_rank + self.qk_rope_head_dim)
            attn += self.kv_lora_rank * self.num_heads * (nope + self.v_head_dim) + self.num_heads * self.v_head_dim * h
        else:
            attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mats = 3 if self.mlp_gated else 2
        dense = mats * h * self.intermediate_size
        moe = mats * h * (self.num_experts * (self.moe_intermediate_size or self.intermediate_size)
                          + self.shared_expert_intermediate_size)
        return self.num_layers * attn + (self.num_layers - self.num_moe_layers) * dense + self.num_moe_layers * moe

    def layer_params(self, i: int) -> int:
        """Weights of decoder layer ``i`` (a leading dense layer of an MoE model has a dense MLP)."""
        moe = self.num_experts > 1 and i >= self.num_dense_layers
        mlp = self.mlp_params_per_layer if moe else self._mlp(self.intermediate_size)
        return self.attn_params_per_layer + self.norm_params_per_layer + mlp

    @property
    def num_active_params(self) -> int:
        return self._total(self.active_mlp_params_per_layer)

    @property
    def routed_expert_linear_params(self) -> int:
        """Weights of the routed experts' matrices (no biases), all MoE layers."""
        mats = 3 if self.mlp_gated else 2
        return self.num_moe_layers * mats * self.hidden_size * self.num_experts * (
            self.moe_intermediate_size or self.intermediate_size)

    @property
    def quantized_params(self) -> int:
        """Weights stored at the quantization's width: every linear layer's, or the routed
        experts' alone where the method quantizes only those (mxfp4, sim/spec/quantization.py)."""
        from sim.spec.quantization import get_quantization

        q = get_quantization(self.quantization)
        if q is None:
            return 0
        return self.routed_expert_linear_params if q.experts_only else self.linear_params

    @property
    def linear_weight_bytes_per_param(self) -> float:
        """Bytes per linear-layer weight: the quantization's (scales included) or the dtype's."""
        from sim.spec.quantization import get_quantization

        q = get_quantization(self.quantization)
        return float(self.dtype_bytes) if q is None else q.weight_bytes

    def weight_bytes(self) -> float:
        """Bytes of all weights: the linear layers at the quantized width (when quantized), the
        rest (embedding, LM head, norms, biases, routers) in the model dtype."""
        lin = self.quantized_params
        return lin * self.linear_weight_bytes_per_param + (self.num_params - lin) * self.dtype_bytes

    def bytes_read(self, num_tokens: int) -> float:
        """Bytes of the weights ``params_read(num_tokens)`` counts: the experts not touched are
        linear weights, so they leave at the linear width."""
        read = self.params_read(num_tokens)
        untouched = self.num_params - self.embedding_params - read
        # every untouched weight is a routed expert's, stored quantized whenever anything is
        qread = max(0.0, self.quantized_params - untouched)
        return qread * self.linear_weight_bytes_per_param + (read - qread) * self.dtype_bytes

    def params_read(self, num_tokens: int) -> float:
        """Weights a forward pass over ``num_tokens`` tokens reads, without the embedding table
        (only its looked-up rows): all of them for a dense model; for an MoE the experts touched,
        E * (1 - (1 - k/E)^T) per MoE layer in expectation under uniform routing (Jiang et al. 2024)."""
        dense = self.num_params - self.embedding_params
        if self.num_experts <= 1:
            return float(dense)
        e, k = self.num_experts, min(self.num_experts_per_tok, self.num_experts)
        touched = e * (1.0 - (1.0 - k / e) ** num_tokens)
        return dense - self.num_moe_layers * (e - touched) * self.expert_params

    # -- KV cache -------------------------------------------------------------------------------
    def kv_layer_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """One layer's cache per token: K and V of every KV head (Kwon et al. 2023,
        PagedAttention), or for MLA the compressed latent plus the shared RoPE key,
        (kv_lora_rank + qk_rope_head_dim) values (DeepSeek-V2 paper, section 2.1.2)."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b
        return 2 * self.num_kv_heads * self.head_dim * b

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """Every layer's cache per token of context (sliding-window layers included)."""
        return self.num_layers * self.kv_layer_bytes_per_token(kv_dtype_bytes)

    def kv_gpu_fraction(self, tp: int) -> float:
        """The share of the cache one GPU of a TP group holds: KV heads split over ranks and
        replicated when tp exceeds them (vLLM); the MLA latent has no head axis and is held whole
        on every rank (vLLM MLA attention backends)."""
        if self.is_mla:
            return 1.0
        return max(1, self.num_kv_heads // tp) / self.num_kv_heads

    def kv_bytes_per_token_per_gpu(self, tp: int, kv_dtype_bytes: int | None = None) -> float:
        """Every layer's cache per token of context on one GPU of a TP group."""
        return self.kv_bytes_per_token(kv_dtype_bytes) * self.kv_gpu_fraction(tp)

    def kv_bytes_for_context(self, num_tokens: int, kv_dtype_bytes: int | None = None) -> int:
        """One sequence's cache at ``num_tokens`` of context: sliding-window layers hold at most
        the window (Beltagy et al. 2020, "Longformer"; vLLM's sliding-window KV manager frees
        blocks that left it)."""
        layer = self.kv_layer_bytes_per_token(kv_dtype_bytes)
        s = self.num_sliding_layers if self.sliding_window else 0
        held = min(num_tokens, self.sliding_window) if s else 0
        return (self.num_layers - s) * num_tokens * layer + s * held * layer
