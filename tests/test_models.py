"""Model catalogue: parameter counts and KV sizes against published figures."""

import json

import pytest

from sim.errors import UserError
from sim.spec.models import get_model


@pytest.mark.parametrize("name, billions", [
    # Published sizes: Llama 2 paper (6.7B, 69B~70B), Llama 3 model card (8.0B, 70.6B),
    # Mistral 7.24B, Qwen2.5 7.61B / 72.7B, CodeLlama 33.7B, Mixtral 46.7B.
    ("llama-2-7b", 6.74), ("llama-2-70b", 68.98), ("llama-3-8b", 8.03), ("llama-3-70b", 70.55),
    ("mistral-7b", 7.24), ("qwen2.5-7b", 7.62), ("qwen2.5-72b", 72.71), ("codellama-34b", 33.74),
    ("mixtral-8x7b", 46.70),
])
def test_param_counts_match_published(name, billions):
    assert get_model(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_mixtral_active_params_are_two_experts():
    m = get_model("mixtral-8x7b")
    assert m.num_active_params / 1e9 == pytest.approx(12.9, rel=0.02)  # Mistral AI: 12.9B active


def test_llama3_70b_kv_bytes_per_token():
    m = get_model("llama-3-70b")
    assert m.kv_bytes_per_token() == 327_680  # 2 * 80 layers * 8 kv heads * 128 * 2 bytes
    assert m.kv_bytes_per_token() * 8192 == 2.5 * 2**30
    assert m.kv_bytes_per_token(1) == 163_840  # fp8 KV halves it


def test_hf_config_is_read(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "float16", "num_local_experts": 4,
           "num_experts_per_tok": 2}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = get_model({"hf_config": str(p)})
    assert (m.num_layers, m.head_dim, m.num_kv_heads, m.num_experts, m.dtype_bytes) == (2, 64, 2, 4, 2)


def test_hf_config_missing_key(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 1}))
    with pytest.raises(UserError, match="missing config key 'num_attention_heads'"):
        get_model({"hf_config": str(p)})


def test_unknown_model_lists_catalogue():
    with pytest.raises(UserError, match="llama-3-8b"):
        get_model("llama-9")
