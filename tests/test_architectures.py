"""Model breadth (issue 11): catalogue entries and HF architectures against published figures,
KV bytes per token and sliding windows computed by hand from each config.json."""

from pathlib import Path

import pytest

from sim.errors import UserError
from sim.spec.models import get_model

HF = Path(__file__).parent / "fixtures" / "hf"


def hf(name):
    return get_model({"hf_config": str(HF / name / "config.json")})


@pytest.mark.parametrize("name, params", [
    # exact counts of the HF checkpoints (model.num_parameters()), fixtures hand-written from
    # each published config.json
    ("opt-125m", 125_239_296),     # learned positions (2048 + 2 rows), biases, LayerNorms, tied
    ("bloom-560m", 559_214_592),   # ALiBi, embedding LayerNorm, non-gated 4h MLP
    ("falcon-7b", 6_921_720_704),  # parallel attn+MLP, multi-query (1 KV head), one LayerNorm
    ("gpt2", 124_439_808),         # learned positions, tied
    ("pythia-1b", 1_011_781_632),  # GPT-NeoX: parallel residual, untied, biased
    ("phi-2", 2_779_683_840),      # parallel attn+MLP, one LayerNorm, biased LM head
])
def test_hf_architectures_count_exactly(name, params):
    assert hf(name).num_params == params


def test_gptj_parallel_non_gated_biased_head():
    m = hf("gpt-j-6b")
    assert (m.parallel_attn_mlp, m.mlp_gated, m.norms_per_layer, m.lm_head_bias) == (True, False, 1, True)
    assert m.num_params / 6.053e9 == pytest.approx(1, rel=1e-3)  # EleutherAI model card: 6,053,381,344
    assert m.dtype_bytes == 2  # a float32 config is served in 16 bits by vLLM


@pytest.mark.parametrize("name, billions, active", [
    ("llama-3.1-8b", 8.03, None), ("llama-3.1-70b", 70.55, None), ("llama-3.3-70b", 70.55, None),
    ("llama-3.1-405b", 405.85, None), ("llama-3.2-1b", 1.24, None), ("llama-3.2-3b", 3.21, None),
    ("qwen2.5-32b", 32.76, None), ("qwen3-8b", 8.19, None), ("qwen3-32b", 32.76, None),
    ("qwen3-30b-a3b", 30.53, 3.35), ("qwen3-235b-a22b", 235.09, 22.19),   # Qwen3 report: 30.5B/3.3B, 235B/22B
    ("mixtral-8x22b", 140.6, 39.2),                                     # Mistral AI: 141B / 39B
    ("deepseek-v3", 671.0, 37.5),                                       # DeepSeek-V3 report: 671B / 37B
    ("gemma-2-9b", 9.24, None), ("gemma-2-27b", 27.23, None), ("gemma-3-1b", 1.00, None),
    ("falcon-180b", 179.5, None),
])
def test_catalogue_counts_match_published(name, billions, active):
    m = get_model(name)
    assert m.num_params / 1e9 == pytest.approx(billions, rel=0.01)
    if active is not None:
        assert m.num_active_params / 1e9 == pytest.approx(active, rel=0.02)


def test_gpt_oss_counts_match_model_card():
    # OpenAI gpt-oss model card: 20.9B total / 3.6B active, 116.8B / 5.1B; "active" there
    # leaves out the input embedding table (201,088 x 2,880 = 0.58B)
    for name, total, active in (("gpt-oss-20b", 20.91, 3.61), ("gpt-oss-120b", 116.83, 5.13)):
        m = get_model(name)
        assert m.num_params / 1e9 == pytest.approx(total, rel=0.005)
        assert (m.num_active_params - m.embedding_params) / 1e9 == pytest.approx(active, rel=0.01)


def test_deepseek_mla_kv_bytes_by_hand():
    m = get_model("deepseek-v3")
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes, not per-head K and V
    assert m.kv_bytes_per_token() == (512 + 64) * 61 * 2 == 70_272
    assert m.kv_bytes_per_token_per_gpu(8) == 70_272  # the latent is replicated on every TP rank
    assert hf("deepseek-v3").kv_bytes_per_token() == 70_272
    # MoE layout: 3 dense layers (intermediate 18432), 58 MoE layers of 256 experts + 1 shared (2048)
    assert (m.num_dense_layers, m.num_moe_layers, m.shared_expert_intermediate_size) == (3, 58, 2048)


def test_kv_bytes_per_token_by_hand():
    assert get_model("llama-3.1-405b").kv_bytes_per_token() == 2 * 126 * 8 * 128 * 2 == 516_096
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token() == 2 * 48 * 4 * 128 * 2 == 98_304
    assert get_model("falcon-180b").kv_bytes_per_token() == 2 * 80 * 8 * 64 * 2 == 163_840
    assert hf("falcon-7b").kv_bytes_per_token() == 2 * 32 * 1 * 64 * 2  # multi-query
    # TP 16 > 8 KV heads: each rank holds one head (replicated), 1/8 of the cache
    assert get_model("llama-3.1-405b").kv_bytes_per_token_per_gpu(16) == 516_096 / 8


def test_sliding_window_layers_hold_only_the_window():
    g = get_model("gemma-2-9b")  # 21 of 42 layers slide over 4096 tokens
    layer = 2 * 8 * 256 * 2
    assert g.num_sliding_layers == 21 and g.kv_layer_bytes_per_token() == layer
    assert g.kv_bytes_for_context(1000) == 42 * 1000 * layer
    assert g.kv_bytes_for_context(8192) == 21 * 8192 * layer + 21 * 4096 * layer
    o = get_model("gpt-oss-120b")  # 18 of 36 layers slide over 128 tokens
    assert o.kv_bytes_for_context(100_000) == (18 * 100_000 + 18 * 128) * 2 * 8 * 64 * 2
    assert get_model("gemma-3-1b").num_sliding_layers == 26 - 26 // 6
    assert get_model("mistral-7b-v0.1-window").num_sliding_layers == 32
    assert hf("qwen3-30b-a3b").num_sliding_layers == 0  # use_sliding_window: false


def test_unmodelled_architectures_are_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="model_type 'mamba' is not modelled"):
        hf("mamba-130m")
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "gemma3", "text_config": {}, "vision_config": {}}')
    with pytest.raises(UserError, match="multimodal"):
        get_model({"hf_config": str(p)})
    p.write_text('{"model_type": "t5", "is_encoder_decoder": true}')
    with pytest.raises(UserError, match="encoder-decoder"):
        get_model({"hf_config": str(p)})


def test_relative_hf_config_looked_up_from_cwd_then_scenario_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(HF.parent.parent.parent)  # the repository root
    m = get_model({"hf_config": "tests/fixtures/hf/gpt2/config.json"}, base_dir=tmp_path)
    assert m.architecture == "gpt2"
    monkeypatch.chdir(tmp_path)
    assert get_model({"hf_config": "gpt2/config.json"}, base_dir=HF).architecture == "gpt2"


def test_linear_params_leave_out_embeddings_norms_and_routers():
    m = get_model("llama-3-8b")
    assert m.num_params - m.linear_params == 2 * 128_256 * 4096 + (2 * 32 + 1) * 4096
    x = get_model("mixtral-8x7b")  # routers: 32 layers x 4096 x 8
    assert x.num_params - x.linear_params == 32_000 * 4096 * 2 + (2 * 32 + 1) * 4096 + 32 * 4096 * 8
