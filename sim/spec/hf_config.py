"""HuggingFace ``config.json`` -> ``ModelSpec``, architecture by architecture.

Why: each ``model_type`` names its sizes differently (``n_embd``, ``ffn_dim``, ``n_head_kv``) and
departs from the Llama layout in ways that change weights, KV and step time: non-gated MLPs,
biases, LayerNorm, parallel attention+MLP, ALiBi or learned positions, sliding-window layers,
MoE with shared experts, MLA. Each reader follows that architecture's HF modeling file; a
``model_type`` with none is refused with one line naming what is not modelled.
"""

from __future__ import annotations

from sim.errors import UserError
from sim.spec.model_spec import DTYPE_BYTES, ModelSpec


class _Cfg:
    def __init__(self, d: dict):
        self.d = d

    def get(self, *keys, default=None):
        """The first of ``keys`` present and not null."""
        for k in keys:
            v = self.d.get(k)
            if v is not None:
                return v
        return default

    def need(self, *keys):
        v = self.get(*keys)
        if v is None:
            raise KeyError(keys[0])
        return v


def _base(c: _Cfg, tie_default: bool) -> dict:
    heads = int(c.need("num_attention_heads", "n_head"))
    hidden = int(c.need("hidden_size", "n_embd", "n_embed", "d_model"))
    dtype = str(c.get("torch_dtype", "dtype", default="bfloat16"))
    if dtype == "float32":
        # vLLM (config.py _get_and_verify_dtype, dtype "auto") serves a float32 checkpoint in
        # 16 bits (bfloat16 for Gemma-2/3, float16 otherwise): 2 bytes either way.
        dtype = "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"torch_dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return dict(
        num_layers=int(c.need("num_hidden_layers", "n_layer", "num_layers")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads", default=heads)),
        head_dim=int(c.get("head_dim", default=hidden // heads)),
        vocab_size=int(c.need("vocab_size")),
        dtype=dtype,
        max_position_embeddings=int(c.get("max_position_embeddings", "n_positions", default=8192)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", default=tie_default)),
    )


def _sliding(c: _Cfg, num_layers: int, all_layers: bool) -> dict:
    """Sliding-window layers: ``layer_types`` when the config lists them, else every layer
    (Mistral, Phi-3) or those from ``max_window_layers`` on (Qwen2 with use_sliding_window)."""
    w = c.get("sliding_window")
    if w is None or c.get("use_sliding_window", default=True) is False:
        return {}
    types = c.get("layer_types")
    if types is not None:
        n = sum(t == "sliding_attention" for t in types)
    elif "max_window_layers" in c.d and "use_sliding_window" in c.d:
        n = max(0, num_layers - int(c.d["max_window_layers"]))
    else:
        n = num_layers if all_layers else 0
    if n == 0 or int(w) >= int(c.get("max_position_embeddings", default=0) or 0) > 0 and n == num_layers:
        return {}  # a window as long as the context is no window (Qwen2: 131072)
    return {"sliding_window": int(w), "num_sliding_layers": n}


def _llama(c: _Cfg, f: dict, model_type: str) -> dict:
    """Llama, Mistral, Mixtral, Phi-3, Qwen2/2-MoE/3/3-MoE, Gemma 1/2/3 (text)."""
    f["intermediate_size"] = int(c.need("intermediate_size"))
    bias = bool(c.get("attention_bias", default=False))
    f.update(attention_bias=bias, o_bias=bias, mlp_bias=bool(c.get("mlp_bias", default=False)))
    if model_type in ("qwen2", "qwen2_moe"):
        f.update(attention_bias=True, o_bias=False)  # Qwen2Attention: q/k/v biased, o_proj not
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        f["qk_norm"] = True
    if model_type in ("gemma2", "gemma3_text"):
        f["norms_per_layer"] = 4  # pre/post attention and pre/post feed-forward RMSNorms
    experts = c.get("num_local_experts", "num_experts", "n_routed_experts")
    if experts and int(experts) > 1:
        f.update(num_experts=int(experts), num_experts_per_tok=int(c.need("num_experts_per_tok", "experts_per_token")))
        if c.get("moe_intermediate_size") is not None:
            f["moe_intermediate_size"] = int(c.d["moe_intermediate_size"])
        if c.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert plus its gate
            f["shared_expert_intermediate_size"] = int(c.d["shared_expert_intermediate_size"])
            f["extra_params"] = f["num_layers"] * f["hidden_size"]
        if c.get("mlp_only_layers") or int(c.get("decoder_sparse_step", default=1)) != 1:
            raise UserError("MoE layers interleaved with dense ones (mlp_only_layers / decoder_sparse_step) are not modelled")
    if model_type == "gemma2":
        w = c.get("sliding_window")
        n = sum(t == "sliding_attention" for t in c.get("layer_types", default=[])) or (f["num_layers"] + 1) // 2
        return {**f, **({"sliding_window": int(w), "num_sliding_layers": n} if w else {})}  # even layers slide
    if model_type == "gemma3_text":
        w, pattern = c.get("sliding_window"), int(c.get("sliding_window_pattern", default=6))
        n = sum(t == "sliding_attention" for t in c.get("layer_types", default=[])) or f["num_layers"] - f["num_layers"] // pattern
        return {**f, **({"sliding_window": int(w), "num_sliding_layers": n} if w else {})}
    return {**f, **_sliding(c, f["num_layers"], all_layers=model_type in ("mistral", "mixtral", "phi3"))}


def _gpt_oss(c: _Cfg, f: dict, _: str) -> dict:
    """gpt-oss (HF modeling_gpt_oss.py): biased q/k/v/o, attention sinks, biased router and
    experts (SwiGLU), alternating sliding (128) and full attention layers."""
    f = _llama(c, f, "gpt_oss")
    f.update(attention_bias=True, o_bias=True, attention_sinks=True, router_bias=True, mlp_bias=True)
    return f


def _deepseek(c: _Cfg, f: dict, _: str) -> dict:
    """DeepSeek-V2/V3 (HF modeling_deepseek_v3.py): MLA attention; MoE with shared experts
    after ``first_k_dense_replace`` dense layers; V3's router has a score-correction bias."""
    if int(c.get("moe_layer_freq", default=1)) != 1:
        raise UserError("DeepSeek moe_layer_freq != 1 is not modelled")
    rope, nope = int(c.need("qk_rope_head_dim")), int(c.need("qk_nope_head_dim"))
    moe_i = int(c.need("moe_intermediate_size"))
    f.update(intermediate_size=int(c.need("intermediate_size")), num_kv_heads=f["num_heads"], head_dim=rope + nope,
             kv_lora_rank=int(c.need("kv_lora_rank")), qk_rope_head_dim=rope, q_lora_rank=int(c.get("q_lora_rank", default=0)),
             v_head_dim=int(c.need("v_head_dim")), num_experts=int(c.need("n_routed_experts")),
             num_experts_per_tok=int(c.need("num_experts_per_tok")), moe_intermediate_size=moe_i,
             shared_expert_intermediate_size=int(c.get("n_shared_experts", default=0)) * moe_i,
             num_dense_layers=int(c.get("first_k_dense_replace", default=0)),
             router_bias=c.get("topk_method") == "noaux_tc")
    return f


def _falcon(c: _Cfg, f: dict, _: str) -> dict:
    """Falcon (HF modeling_falcon.py): parallel attention+MLP, non-gated GELU MLP of
    ``ffn_hidden_size`` (4h), LayerNorms; new_decoder_architecture (40B/180B) has GQA and two
    norms per layer, the 7B one norm and multi-query attention; ``alibi`` or RoPE."""
    new = bool(c.get("new_decoder_architecture", default=False))
    heads = f["num_heads"]
    kv = int(c.get("num_kv_heads", "n_head_kv", default=heads)) if new else (1 if c.get("multi_query", default=True) else heads)
    bias = bool(c.get("bias", default=False))
    parallel = new or bool(c.get("parallel_attn", default=True))
    f.update(num_kv_heads=kv, intermediate_size=int(c.get("ffn_hidden_size", default=4 * f["hidden_size"])),
             mlp_gated=False, attention_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=True,
             norms_per_layer=2 if (new or not parallel) else 1, parallel_attn_mlp=parallel,
             position="alibi" if c.get("alibi") else "rope")
    return f


def _gptj(c: _Cfg, f: dict, _: str) -> dict:
    """GPT-J (HF modeling_gptj.py): one LayerNorm feeding attention and MLP in parallel,
    unbiased q/k/v/out, biased GELU MLP of n_inner (4h), biased untied LM head, RoPE."""
    f.update(intermediate_size=int(c.get("n_inner", default=4 * f["hidden_size"])), mlp_gated=False, mlp_bias=True,
             norm_bias=True, norms_per_layer=1, parallel_attn_mlp=True, lm_head_bias=True)
    return f


def _phi(c: _Cfg, f: dict, _: str) -> dict:
    """Phi-1/1.5/2 (HF modeling_phi.py): one LayerNorm feeding attention and MLP in parallel,
    biased q/k/v/dense, biased GELU MLP (fc1, fc2), biased untied LM head, partial RoPE."""
    f.update(intermediate_size=int(c.need("intermediate_size")), mlp_gated=False, mlp_bias=True, attention_bias=True,
             o_bias=True, norm_bias=True, norms_per_layer=1, parallel_attn_mlp=True, lm_head_bias=True)
    return f


def _gpt_neox(c: _Cfg, f: dict, _: str) -> dict:
    """GPT-NeoX / Pythia (HF modeling_gpt_neox.py): biased attention and GELU MLP, two
    LayerNorms, parallel residual by default, untied output embedding, (partial) RoPE."""
    bias = bool(c.get("attention_bias", default=True))
    f.update(intermediate_size=int(c.need("intermediate_size")), mlp_gated=False, mlp_bias=True, attention_bias=bias,
             o_bias=bias, norm_bias=True, parallel_attn_mlp=bool(c.get("use_parallel_residual", default=True)))
    return f


def _opt(c: _Cfg, f: dict, _: str) -> dict:
    """OPT (HF modeling_opt.py): learned positions (table of max_position_embeddings + 2),
    biased attention and ReLU MLP of ffn_dim, LayerNorms, tied embeddings; a
    word_embed_proj_dim narrower than hidden adds project_in/out."""
    h = f["hidden_size"]
    bias = bool(c.get("enable_bias", default=True))
    proj = int(c.get("word_embed_proj_dim", default=h))
    extra = (f["max_position_embeddings"] + 2) * h
    if proj != h:
        # embeddings are vocab x proj (counted as vocab x h below): correct, then add the projections
        extra += f["vocab_size"] * (proj - h) + 2 * proj * h
    f.update(intermediate_size=int(c.need("ffn_dim")), mlp_gated=False, attention_bias=bias, o_bias=bias, mlp_bias=bias,
             norm_bias=True, position="learned", extra_params=extra)
    return f


def _bloom(c: _Cfg, f: dict, _: str) -> dict:
    """BLOOM (HF modeling_bloom.py): ALiBi (no position table), LayerNorm after the word
    embeddings, biased fused qkv/dense and GELU MLP of 4h, tied embeddings."""
    h = f["hidden_size"]
    f.update(intermediate_size=4 * h, mlp_gated=False, attention_bias=True, o_bias=True, mlp_bias=True, norm_bias=True,
             position="alibi", extra_params=2 * h)
    return f


def _gpt2(c: _Cfg, f: dict, _: str) -> dict:
    """GPT-2 (HF modeling_gpt2.py): learned positions, biased attention and GELU MLP, tied."""
    h = f["hidden_size"]
    f.update(intermediate_size=int(c.get("n_inner", default=4 * h)), mlp_gated=False, attention_bias=True, o_bias=True,
             mlp_bias=True, norm_bias=True, position="learned", extra_params=f["max_position_embeddings"] * h)
    return f


# model_type -> (reader, tie_word_embeddings default of that architecture's HF config class)
READERS = {
    "llama": (_llama, False), "mistral": (_llama, False), "mixtral": (_llama, False), "phi3": (_llama, False),
    "qwen2": (_llama, False), "qwen2_moe": (_llama, False), "qwen3": (_llama, False), "qwen3_moe": (_llama, False),
    "gemma": (_llama, True), "gemma2": (_llama, True), "gemma3_text": (_llama, True),
    "gpt_oss": (_gpt_oss, False), "deepseek_v2": (_deepseek, False), "deepseek_v3": (_deepseek, False),
    "falcon": (_falcon, True), "RefinedWeb": (_falcon, True), "RefinedWebModel": (_falcon, True),
    "gptj": (_gptj, False), "phi": (_phi, False), "gpt_neox": (_gpt_neox, False), "opt": (_opt, True), "bloom": (_bloom, True),
    "gpt2": (_gpt2, True),
}


def from_config(name: str, cfg: dict, where: str) -> ModelSpec:
    """A ``ModelSpec`` from a config.json dict (a catalogue entry without ``model_type`` reads as
    Llama); anything this simulator cannot model is one ``UserError`` line."""
    c = _Cfg(cfg)
    model_type = str(cfg.get("model_type") or "llama")
    if cfg.get("is_encoder_decoder"):
        raise UserError(f"{where}: {model_type} is an encoder-decoder model; only decoder-only models are modelled")
    if "vision_config" in cfg or "audio_config" in cfg:
        raise UserError(f"{where}: {model_type} is multimodal: its vision/audio encoder is not modelled; "
                        f"give the language model's config (its text_config) instead")
    if model_type not in READERS:
        raise UserError(f"{where}: model_type {model_type!r} is not modelled (state-space, hybrid and other layer "
                        f"types have no cost model); supported: {', '.join(sorted(READERS))}")
    reader, tie_default = READERS[model_type]
    try:
        fields = reader(c, _base(c, tie_default), model_type)
        return ModelSpec(name=name, architecture=model_type, **fields)
    except KeyError as e:
        raise UserError(f"{where}: missing config key {e.args[0]!r}") from None
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: bad config value ({e})") from None
