"""Scenario loading, validation and overrides."""

import pytest
import yaml

from sim.errors import UserError
from sim.scenario import load_scenario, scenario_from_dict
from tests.conftest import small_scenario


def test_shipped_chat_scenario(root):
    s = load_scenario(root / "scenarios" / "chat.yaml")
    assert s.model == "llama-3-8b" and s.hardware.gpu == "h100-sxm" and s.workload.trace is not None


def test_unknown_key_lists_valid_keys(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(small_scenario(engine={"max_num_seq": 3})))
    with pytest.raises(UserError) as e:
        load_scenario(p)
    assert str(e.value).startswith(f"{p}: unknown key 'engine.max_num_seq'; valid keys here: policy, max_num_seqs")


def test_set_overrides_and_types(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(small_scenario()))
    s = load_scenario(p, ["engine.max_num_seqs=7", "cluster.replicas=3", "workload.synthetic.request_rate=inf"])
    assert (s.engine.max_num_seqs, s.cluster.replicas) == (7, 3)
    assert s.workload.synthetic.request_rate == float("inf")
    with pytest.raises(UserError, match="unknown key 'cluster.replica'"):
        load_scenario(p, ["cluster.replica=3"])


def test_resolved_yaml_round_trips(tmp_path):
    s = scenario_from_dict(small_scenario())
    p = tmp_path / "r.yaml"
    p.write_text(s.to_yaml())
    # the resolved file fills what the run derives (max_model_len from the model): the same
    # resolution, not the same fields (tests/test_scenario_roundtrip.py runs both)
    assert load_scenario(p).resolved() == s.resolved()


@pytest.mark.parametrize("raw, message", [
    ({"workload": {}}, "exactly one of workload.trace or workload.synthetic"),
    ({"engine": {"policy": "chunked", "max_num_batched_tokens": 64, "max_num_seqs": 256}},
     "must be >= engine.max_num_seqs"),
    ({"engine": {"policy": "fifo"}}, "engine.policy"),
    ({"workload": {"synthetic": {"input_tokens": {"dist": "uniform", "min": 9}}}}, "needs max"),
])
def test_invalid_values(raw, message):
    with pytest.raises(UserError, match=message):
        scenario_from_dict(small_scenario(**raw))
