"""A policy is one file that registers itself: scenario, compare, notes and runs find it."""

import dataclasses

import pytest

from sim.analysis.compare import parse_policies
from sim.errors import UserError
from sim.analysis.notes import notes_for
from sim.policies import get_policy, policy_names, registry
from sim.policies.continuous import ContinuousScheduler
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.metrics.summary import summarize
from tests.conftest import small_scenario


class FewerSeqs(ContinuousScheduler):
    """A toy policy: continuous batching that runs at most two sequences."""

    name = "fewer_seqs"

    def __init__(self, limits, kv):
        super().__init__(limits, kv)
        self.limits = dataclasses.replace(limits, max_num_seqs=2)


@pytest.fixture
def toy_policy():
    spec = registry.register(registry.PolicySpec("fewer_seqs", "a toy policy", FewerSeqs,
                                                 ("sim.policies.continuous",), order=50))
    yield spec
    del registry._REGISTRY["fewer_seqs"]


def test_shipped_policies_in_listing_order():
    assert policy_names()[:4] == ("static", "continuous", "chunked", "disaggregated")
    assert get_policy("disaggregated").pools and get_policy("disaggregated").scheduler is None
    assert not get_policy("chunked").pools


def test_unknown_policy_names_the_registered_ones():
    with pytest.raises(UserError, match="engine.policy: Input should be 'static', 'continuous', 'chunked' or"):
        scenario_from_dict(small_scenario(engine={"policy": "nope"}))
    with pytest.raises(UserError, match="choose from static, continuous, chunked, disaggregated"):
        parse_policies("static,nope")


def test_a_registered_policy_is_usable_everywhere(toy_policy):
    assert "fewer_seqs" in policy_names()
    assert parse_policies("continuous,fewer_seqs") == ["continuous", "fewer_seqs"]
    assert notes_for(["fewer_seqs"]) == notes_for(["continuous"])  # its spec names continuous's notes
    raw = small_scenario(engine={"policy": "fewer_seqs"})
    raw["workload"]["synthetic"]["num_requests"] = 30
    s = scenario_from_dict(raw)
    result = run_scenario(s)
    summary = summarize(result)
    assert summary["completed"] == 30 and summary["simsrv_policy"] == "fewer_seqs"
    assert int(result.steps["num_seqs"].max()) <= 2
