"""Speculative decoding's proposer cost (issue 40 item 1): the n-gram proposer's host scan on the
step's critical path (vllm/v1/spec_decode/ngram_proposer.py; 1.06 ns a context token measured
in github.com/vllm-project/vllm/pull/56732), and the GPU drafters' passes."""

from __future__ import annotations

import pytest

from sim.analysis.explain import speculative_figures
from sim.cost.speculative import NGRAM_S_PER_CONTEXT_TOKEN, ngram_host_s
from sim.engine.deployment import build_deployment
from sim.scenario import scenario_from_dict


def _dep(method: str, **spec):
    raw = {"name": "host", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
           "engine": {"speculative_config": {"method": method, "num_speculative_tokens": 3,
                                             "acceptance_length": 2.0, **spec}},
           "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0}}}
    return build_deployment(scenario_from_dict(raw))


def test_the_measured_rate():
    """70.28 ms for 512 sequences of 129,536 tokens, one thread (PR 56732): 1.06 ns a token."""
    assert ngram_host_s(512 * 129_536) == pytest.approx(70.28e-3)
    assert NGRAM_S_PER_CONTEXT_TOKEN == pytest.approx(1.06e-9, rel=1e-3)


@pytest.mark.parametrize("n,ctx", [(1, 500), (64, 2000), (256, 30_000)])
def test_ngram_step_adds_its_scan(n, ctx):
    """An n-gram step costs the verification plus one scan of every decode's context: the host
    seconds grow with the batch's total context, not with the GPU work; EAGLE's step has no
    host term and pays its GPU passes instead."""
    spec = _dep("ngram").cost.spec_run
    b = (n, n * ctx, (), n, 1, 0, n)
    verify = spec.verify_values(b)[0]
    assert spec(b)[0] == pytest.approx(verify + n * ctx * NGRAM_S_PER_CONTEXT_TOKEN, rel=1e-12)
    eagle = _dep("eagle").cost.spec_run
    assert eagle.host_s(n * ctx) == 0.0
    assert eagle(b)[0] == pytest.approx(eagle.verify_values(b)[0] + eagle.draft_s(n, n * ctx, ()), rel=1e-12)


def test_explain_shows_the_scan():
    """``explain``'s spec_draft_ms for ngram is its host scan at --batch x --context."""
    f = speculative_figures(_dep("ngram"), 4000, 128)
    assert f["spec_draft_ms"] == pytest.approx(128 * 4000 * NGRAM_S_PER_CONTEXT_TOKEN * 1e3)
    assert f["spec_ms_per_token"] == pytest.approx((f["spec_verify_step_ms"] + f["spec_draft_ms"]) / 2.0)
