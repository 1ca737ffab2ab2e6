"""A draft head's pass under speculative decoding costs at least its host work (VC-41, issue 37):
the kernel launches of the head's layer when the pass replays no CUDA graph, and the eager PyTorch
ops vLLM's propose loop issues outside the model, by the engine profile's vLLM release
(sim/cost/speculative.py ``propose_loop_ops``, sim/cost/engine_profile.py ``draft_graphed``)."""

from pathlib import Path

import pytest

from sim.cost.engine_profile import get_profile, load_profile_file, profile_entry, profile_names
from sim.cost.speculative import EAGLE3_D2T_OPS, PROPOSE_LOOP_OPS_0_11, propose_loop_ops
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.files.yamlfile import read_yaml
from sim.scenario import scenario_from_dict

HEADS = ("eagle", "eagle3", "mtp")


def _raw(method: str, k: int = 3, **engine) -> dict:
    spec = {"method": method, "num_speculative_tokens": k, "acceptance_length": 2.0}
    return {"name": "d", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"policy": "chunked", "max_num_seqs": 4, "speculative_config": spec, **engine},
            "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0,
                                       "input_tokens": {"dist": "fixed", "value": 100},
                                       "output_tokens": {"dist": "fixed", "value": 16}}}}


def _spec(method: str, k: int = 3, **engine):
    return build_deployment(scenario_from_dict(_raw(method, k, **engine))).cost.spec_run


def test_vllm_011_drafter_replays_no_cuda_graph():
    """vLLM 0.11.0's EagleProposer enters its forward context without a CUDA graph mode, so its
    passes run un-graphed even where the target's decode steps replay graphs; vLLM 0.34's
    speculator captures them in the target's mode. With a long per-layer launch time a batch-1
    pass costs that launch under vllm-v1, and only its kernels under vllm-v1-0.34."""
    v011, v034 = get_profile("vllm-v1"), get_profile("vllm-v1-0.34")
    assert v011.graphed(1, False) and not v011.draft_graphed(1, False)
    assert v034.graphed(1, False) and v034.draft_graphed(1, False)
    slow = {"eager_launch_per_layer_ms": 5.0}
    for method in HEADS:
        eager = _spec(method, overhead=slow)
        graphed = _spec(method, profile="vllm-v1-0.34", overhead=slow)
        assert eager.head_pass_s(1, 1, 500, (), False) >= 5e-3
        assert graphed.head_pass_s(1, 1, 500, (), False) < 5e-3


@pytest.mark.parametrize("method", HEADS)
def test_propose_loop_ops_are_paid_per_pass(method):
    """Each pass costs at least the propose loop's eager ops at the profile's eager_op_ms (vLLM
    0.11.0: 20 per later pass, EAGLE-3 4 more for its d2t scatter); the draft's k passes add up."""
    op_ms = 1.0
    spec = _spec(method, k=4, overhead={"eager_op_ms": op_ms})
    later = PROPOSE_LOOP_OPS_0_11[1] + (EAGLE3_D2T_OPS if method == "eagle3" else 0)
    assert propose_loop_ops("0.11", method, False, False) == later
    first = propose_loop_ops("0.11", method, True, False)
    assert spec.head_pass_s(1, 1, 500, (), False) >= later * op_ms / 1e3
    assert spec.draft_s(1, 500, ()) >= (first + 3 * later) * op_ms / 1e3
    # vLLM 0.34's graphed passes issue none; its eager ones a few Triton kernels and the argmax
    assert propose_loop_ops("0.34", method, False, True) == 0 < propose_loop_ops("0.34", method, False, False)
    graphed = _spec(method, k=4, profile="vllm-v1-0.34", overhead={"eager_op_ms": op_ms})
    assert graphed.head_pass_s(1, 1, 500, (), False) < later * op_ms / 1e3


@pytest.mark.parametrize("profile", profile_names())
@pytest.mark.parametrize("method", HEADS)
def test_no_head_pass_is_cheaper_than_its_host_work(profile, method):
    """For every catalogue profile and head, at any batch and on either pass, a pass costs at
    least its host work, and an un-graphed pass at least the launch of the head's layer."""
    spec = _spec(method, profile=profile)
    e = spec.target.engine
    for n in (1, 8, 1024):
        for first in (True, False):
            tokens = n * (spec.k + 1) if first else n
            s = spec.head_pass_s(tokens, n, n * 300, (), first)
            host = spec.head_host_s(n, False, first)
            assert s >= host
            if not e.draft_graphed(n, False):
                assert host >= e.eager_launch_per_layer_s
            assert host >= propose_loop_ops(e.vllm_release, method, first, e.draft_graphed(n, False)) * e.eager_op_s


def test_draft_cuda_graph_is_a_profile_key(tmp_path: Path):
    """``draft_cuda_graph`` may be left out of a profile file (the target's rule, as files written
    before it), set true or false, or overridden under engine.overhead; any other value is one
    error line naming the file and the key."""
    entry = profile_entry("vllm-v1")
    assert entry["draft_cuda_graph"] is False and entry["eager_op_ms"] > 0
    base = read_yaml(Path(__file__).parents[1] / "sim/catalog/engine_profiles.yaml", "catalogue")["vllm-v1"]
    old = {k: v for k, v in base.items() if k not in ("draft_cuda_graph", "eager_op_ms")}
    import yaml

    f = tmp_path / "old.yaml"
    f.write_text(yaml.safe_dump(old))
    p = load_profile_file(f)
    assert p.draft_cuda_graph is None and p.draft_graphed(1, False) and p.eager_op_s == 0.0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**old, "draft_cuda_graph": "yes"}))
    with pytest.raises(UserError, match=r"bad.yaml: key draft_cuda_graph"):
        load_profile_file(bad)
    assert get_profile("vllm-v1", {"draft_cuda_graph": True}).draft_graphed(1, False)
    spec = _spec("eagle3", overhead={"draft_cuda_graph": True, "eager_launch_per_layer_ms": 5.0})
    assert spec.head_pass_s(1, 1, 500, (), False) < 5e-3


def test_eagle3_draft_vocabulary_is_the_heads():
    """An EAGLE-3 head's LM head and d2t map follow its ``draft_vocab_size`` (the head's
    config.json), not a fixed 32,000: a head over the target's whole vocabulary reads the
    target's LM-head bytes every pass and needs no d2t map; more than the target's is an error."""
    from sim.cost.speculative import D2T_ENTRY_BYTES, draft_weight_bytes_per_gpu
    from sim.spec.models import get_model

    m = get_model("llama-3.1-8b")
    small = _spec("eagle3", k=4)
    raw = _raw("eagle3", 4)
    raw["engine"]["speculative_config"]["draft_vocab_size"] = m.vocab_size
    full = build_deployment(scenario_from_dict(raw)).cost.spec_run
    assert (full.head.lm_vocab_tokens, full.head.d2t_entries) == (m.vocab_size, 0)
    assert small.head.lm_vocab_tokens == 32_000
    lm_bytes = (m.vocab_size - 32_000) * m.hidden_size * 2
    assert full.head_pass_s(1, 1, 500, (), False) - small.head_pass_s(1, 1, 500, (), False) >= (
        0.9 * lm_bytes / full.target.mem_bw)
    assert draft_weight_bytes_per_gpu("eagle3", m, 1, None, m.vocab_size) - draft_weight_bytes_per_gpu(
        "eagle3", m, 1) == pytest.approx(lm_bytes - 32_000 * D2T_ENTRY_BYTES)
    raw["engine"]["speculative_config"]["draft_vocab_size"] = m.vocab_size + 1
    with pytest.raises(UserError, match="draft_vocab_size: 128257 is more than the target's vocabulary"):
        build_deployment(scenario_from_dict(raw))
    bad = _raw("eagle", 4)
    bad["engine"]["speculative_config"]["draft_vocab_size"] = 32_000
    with pytest.raises(UserError, match="draft_vocab_size"):
        scenario_from_dict(bad)
