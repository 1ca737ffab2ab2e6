"""Model architectures: the catalogue and HuggingFace ``config.json`` reading.

Why: every cost and memory figure derives from a handful of architecture numbers; keeping them
as data (``catalog/models.yaml``, copied from each model's config.json) makes them checkable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from sim.errors import UserError

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, in HuggingFace config terms."""

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
    attention_bias: bool = False
    num_experts: int = 1  # experts per MoE layer (1 = dense MLP)
    num_experts_per_tok: int = 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # Parameter counts follow the Llama/Mistral/Qwen2 layout (Touvron et al. 2023, "Llama 2",
    # section 2; HF modeling_llama.py): q,k,v,o projections; gated MLP with three matrices.
    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        bias = (self.q_size + 2 * self.kv_size) if self.attention_bias else 0
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h + bias

    @property
    def expert_params(self) -> int:
        """One gated MLP (gate, up, down): 3 * hidden * intermediate."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts' MLP weights (resident in memory), plus the router for MoE."""
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return self.num_experts * self.expert_params + router

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP weights one token touches: top-k experts (Jiang et al. 2024, "Mixtral of Experts")."""
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return min(self.num_experts_per_tok, self.num_experts) * self.expert_params + router

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer
        return self.num_layers * per_layer + self.embedding_params + self.lm_head_params + self.hidden_size

    @property
    def num_active_params(self) -> int:
        per_layer = (
            self.attn_params_per_layer + self.active_mlp_params_per_layer + self.norm_params_per_layer
        )
        return self.num_layers * per_layer + self.embedding_params + self.lm_head_params + self.hidden_size

    def params_read(self, num_tokens: int) -> float:
        """Weights a forward pass over ``num_tokens`` tokens reads, without the embedding table
        (only its looked-up rows): all of them for a dense model; for an MoE the experts touched,
        E * (1 - (1 - k/E)^T) per layer in expectation under uniform routing (Jiang et al. 2024)."""
        dense = self.num_params - self.embedding_params
        if self.num_experts <= 1:
            return float(dense)
        e, k = self.num_experts, min(self.num_experts_per_tok, self.num_experts)
        touched = e * (1.0 - (1.0 - k / e) ** num_tokens)
        return dense - self.num_layers * (e - touched) * self.expert_params

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """K and V for every layer: 2 * L * H_kv * d_head * bytes (Kwon et al. 2023, PagedAttention)."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * b


def _from_config(name: str, cfg: dict, where: str) -> ModelSpec:
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        experts = cfg.get("num_local_experts", cfg.get("num_experts")) or 1
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        if dtype not in DTYPE_BYTES:
            raise UserError(f"{where}: torch_dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        return ModelSpec(
            name=name,
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            dtype=dtype,
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 8192),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            num_experts=int(experts),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 1),
        )
    except KeyError as e:
        raise UserError(f"{where}: missing config key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: bad config value ({e})") from None


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    text = resources.files("sim.catalog").joinpath("models.yaml").read_text()
    return yaml.safe_load(text)


def get_model(ref: str | dict, base_dir: Path | None = None) -> ModelSpec:
    """A catalogue name, or ``{hf_config: path}`` to a HuggingFace config.json."""
    if isinstance(ref, dict):
        path = Path(ref["hf_config"])
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"model.hf_config: file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        return _from_config(ref.get("name") or path.parent.name or path.stem, cfg, str(path))
    cat = catalogue()
    if ref not in cat:
        raise UserError(f"model: unknown model {ref!r}; known: {', '.join(sorted(cat))}")
    return _from_config(ref, cat[ref], f"catalog/models.yaml:{ref}")
