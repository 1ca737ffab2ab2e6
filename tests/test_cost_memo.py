"""The cost model's per-step path: memoised per batch shape, yet a pure function of the batch.

A step's cost must not depend on which batches were costed before it (the memo tables fill in
run order), the fast path (``run_cost``) must give to the bit what the per-operator path
(``step_time``, ``run_durations_s``) gives, and what a call notes (outside a calibrated table,
outside the engine profile's measured batch range) comes back with its durations instead of
staying on the shared model.
"""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.engine.deployment import build_deployment
from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario


def _cost(**over):
    return build_deployment(scenario_from_dict(small_scenario(**over))).cost


def _batches() -> list[Batch]:
    out = []
    for n in (1, 3, 8, 17, 64, 200):
        for ctx in (5, 300, 1500, 9000):
            out.append(Batch(n, n * ctx, (), n, 1))
            out.append(Batch(n, n * ctx + 7, (), n, 37))
            out.append(Batch(n, n * ctx, (), n, 900))
            out.append(Batch(n, n * ctx, ((512, ctx), (40, 0)), n + 1, 1))
            out.append(Batch(n, n * ctx, (), 0, 3))  # a pipeline stage before the last: no LM head
    out += [Batch(0, 0, ((2048, 0),), 1, 1), Batch(0, 0, ((300, 1200),), 0, 1), Batch(0, 0, (), 0, 1)]
    return out


COST_MODELS = {
    "calibrated": {},
    "roofline": {"hardware": {"gpu": "h100-sxm", "cost_model": "roofline"}},
    "fp8 kv, a100": {"hardware": {"gpu": "a100-80g"}, "engine": {"kv_cache_dtype": "fp8"}},
    "sliding window": {"model": "mistral-7b-v0.1-window"},
    "vllm-v0 engine": {"engine": {"profile": "vllm-v0"}},
    "pre-XQA kernel, fp8 kv": {"engine": {"profile": "trt-llm", "attention_backend": "trtllm-mmha",
                                          "kv_cache_dtype": "fp8"}},
    "MLA, TP8": {"model": "deepseek-v3", "hardware": {"gpu": "h200"},
                 "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}},
}


@pytest.mark.parametrize("over", COST_MODELS.values(), ids=COST_MODELS.keys())
def test_run_cost_does_not_depend_on_what_was_costed_before(over):
    batches = _batches()
    forward, backward = _cost(**over), _cost(**over)
    got = [forward.run_cost(b) for b in batches]
    again = [forward.run_cost(b) for b in batches]  # every memo warm
    cold = [backward.run_cost(b) for b in reversed(batches)][::-1]
    assert got == again == cold


@pytest.mark.parametrize("over", COST_MODELS.values(), ids=COST_MODELS.keys())
def test_run_cost_first_step_is_the_step_costed_operator_by_operator(over):
    cost = _cost(**over)
    for cm in getattr(cost, "stages", [cost]):  # a pipeline's stages are roofline models of their layers
        for b in _batches():
            one = Batch(b.num_decode_seqs, b.decode_context_tokens, b.prefill_chunks, b.num_logits, 1)
            first = cm.run_cost(b).first_s
            assert first == cm.step_time(one).total_s == cm.run_durations_s(b)[0], b


def test_overhead_outside_the_profile_range_comes_back_with_the_durations():
    cm = _cost(engine={"profile": "vllm-v0"})  # per-sequence term measured over 8-128 sequences
    lo, hi = cm.engine.batch_range
    small = Batch(2, 2 * 500, (), 2, 5)
    inside = Batch(16, 16 * 500, (), 16, 5)
    mixed = Batch(3, 3 * 500, ((256, 0),), 4, 1)  # 3 decodes + 1 prompt chunk: 4 sequences
    assert lo == 8 and hi >= 16
    assert cm.run_cost(small).overhead_outside_seqs == (2, 2)
    assert cm.run_cost(inside).overhead_outside_seqs is None  # nothing carried over from the call before
    assert cm.run_cost(mixed).overhead_outside_seqs == (4, 4)
    assert not hasattr(cm, "overhead_outside_seqs")  # no run state on the shared model
    assert _cost(engine={"profile": "vllm-v1"}).run_cost(small).overhead_outside_seqs is None


def test_pipeline_stages_report_the_micro_batches_outside_the_range():
    cm = _cost(model="llama-3-70b", engine={"profile": "vllm-v0"},
               cluster={"tensor_parallel_size": 4, "pipeline_parallel_size": 2})
    assert cm.run_cost(Batch(6, 6 * 500, (), 6, 3)).overhead_outside_seqs == (3, 3)  # two micro-batches of 3
    assert cm.run_cost(Batch(40, 40 * 500, (), 40, 3)).overhead_outside_seqs is None
    assert cm.carried_from == cm.stages[-1].carried_from


def test_outside_range_is_counted_per_replica_and_summarised_as_before():
    from sim.metrics.summary import summarize

    raw = small_scenario(engine={"profile": "vllm-v0", "policy": "chunked", "max_num_batched_tokens": 512},
                         cluster={"replicas": 2})
    raw["workload"]["synthetic"].update(num_requests=30, request_rate=2)
    result = run_scenario(scenario_from_dict(raw))
    seen = result.overhead_outside_seqs
    assert set(seen) == {0, 1}  # light load: both replicas step with fewer than 8 sequences
    assert all(1 <= lo <= hi < 8 for lo, hi in seen.values())
    assert summarize(result)["simsrv_overhead_outside_batch_range"] == [min(lo for lo, _ in seen.values()),
                                                                       max(hi for _, hi in seen.values())]


@pytest.mark.parametrize("over", [COST_MODELS["calibrated"], COST_MODELS["fp8 kv, a100"], COST_MODELS["sliding window"]],
                         ids=["calibrated", "fp8 kv, a100", "sliding window"])
def test_decode_attention_does_not_depend_on_the_context_costed_before(over):
    """The calibrated decode-attention function keeps the table cell and the KV-block count of
    its last call: contexts visited in any order (across cells, block counts and split
    decisions, both ways) give what a function that has seen nothing gives."""
    import random

    cm = _cost(**over)
    assert cm.cops is not None and cm.cops.decode_grid is not None
    rng = random.Random(7)
    for n in (1, 5, 64, 300):
        contexts = [n * x for x in (1, 2, 50, 127, 128, 129, 1000, 4095, 4096, 4097, 30000, 200000)]
        contexts += [n * 128 * k + d for k in range(1, 40) for d in (0, 1)]  # FA2 KV blocks of 128
        contexts += [rng.randrange(n, n * 100_000) for _ in range(60)]
        rng.shuffle(contexts)
        contexts += sorted(contexts, reverse=True)  # every cell and block count left downwards too
        warm = cm._make_decode_fn(n)
        for c in contexts:
            assert warm.at(c) == cm._make_decode_fn(n).at(c), (n, c)


def _alone_by_operator(cm, tokens: int, ctx: int, completing: bool) -> float:
    """prefill_alone_s as the operators give it, summed in its order, with no memo of its own."""
    qkv, o, up, down = cm._gemms(tokens)
    elem, ar, _ = cm._per_tokens(tokens)
    t = qkv + o + up + down + elem + ar + cm._prefill_attn(((tokens, ctx),))[0]
    if completing:
        t += cm._lm_head_s(1) + cm.model.vocab_size * 4 * 3 / cm.mem_bw + cm._logits_gather_s(1)
    return t


@pytest.mark.parametrize("over", COST_MODELS.values(), ids=COST_MODELS.keys())
def test_prefill_alone_is_its_operators_whatever_was_costed_before(over):
    """prefill_alone_s reads the per-token-count and chunk memos that run_cost fills: the same
    seconds cold, warm, and after run_cost costed the chunk in a step."""
    shapes = [(t, x, done) for t in (1, 37, 512, 2048) for x in (0, 5, 1200) for done in (False, True)]
    cost = _cost(**over)
    for i, cm in enumerate(getattr(cost, "stages", [cost])):
        ref = [_alone_by_operator(_cost(**over).stages[i] if hasattr(cost, "stages") else _cost(**over), *s)
               for s in shapes]
        cold = [cm.prefill_alone_s(*s) for s in shapes]
        for b in _batches() + [Batch(3, 300, ((t, x),), 3 + done, 1) for t, x, done in shapes]:
            cm.run_cost(b)
        warm = [cm.prefill_alone_s(*s) for s in reversed(shapes)][::-1]
        assert cold == warm == ref


@pytest.mark.parametrize("over", COST_MODELS.values(), ids=COST_MODELS.keys())
def test_a_chunk_of_no_tokens_alone_costs_its_operators_kernels_only(over):
    """prefill_alone_s of 0 tokens (no queries: no attention; calibrated: no elementwise bytes,
    nothing to all-reduce) is the kernels of its operators and, completing, the LM head: finite,
    and below a 1-token chunk's. The calibrated elementwise table raised a math domain error at
    0 bytes, and the attention table gave a 0-token chunk 12x a 1-token chunk's attention time."""
    cost = _cost(**over)
    for cm in getattr(cost, "stages", [cost]):
        for ctx in (0, 100, 5000):
            for done in (False, True):
                zero = cm.prefill_alone_s(0, ctx, done)
                tail = (cm._lm_head_s(1) + cm.model.vocab_size * 4 * 3 / cm.mem_bw
                        + cm._logits_gather_s(1)) if done else 0.0
                elem, ar, _ = cm._per_tokens(0)  # calibrated: 0; the plain roofline: its kernel floors
                assert zero == pytest.approx(sum(cm._gemms(0)) + elem + ar + tail, rel=1e-12)
                assert 0 < zero <= cm.prefill_alone_s(1, ctx, done)


@pytest.mark.parametrize("over", [COST_MODELS["calibrated"], COST_MODELS["sliding window"]],
                         ids=["calibrated", "sliding window"])
def test_prefill_chunk_memo_starts_over_when_full_with_the_same_seconds(over):
    small, big = _cost(**over), _cost(**over)
    small.MAX_CHUNK_SHAPES = 5
    batches = [Batch(n, n * 100, tuple((c + k, x) for k in range(m)), n + 1, 1)
               for n in (0, 4) for c in (16, 300) for x in (0, 77, 4000) for m in (1, 2, 3)]
    for _ in range(2):
        small._step_cache.clear()
        assert [small.run_cost(b) for b in batches] == [big.run_cost(b) for b in batches]
        assert 0 < len(small._chunk_cache) <= 5 < len(big._chunk_cache)


def test_shared_cost_models_are_reused_only_inside_the_block_and_change_no_output():
    """Within ``shared_cost_models`` deployments of the same cost inputs share one cost model
    (a sweep's seeds, a comparison's policies); another model, GPU or TP gets its own; outside
    the block every deployment is fresh. A run on a cost model warmed by other runs (another
    policy, another seed) writes the same bytes as a run on a fresh one."""
    import io

    from sim.engine.deployment import shared_cost_models
    from sim.output import request_table, write_parquet
    from sim.run import run_scenario

    def run_bytes(raw) -> bytes:
        r = run_scenario(scenario_from_dict(raw))
        buf = io.BytesIO()
        write_parquet(buf, r.num_requests, lambda a, b: request_table(r, a, b))
        return buf.getvalue() + r.step_frame().write_ipc(None).getvalue()

    base = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 256})
    fresh = run_bytes(base)
    assert _cost() is not _cost()
    with shared_cost_models():
        a, b = _cost(), _cost(engine={"policy": "continuous"})
        assert a is b
        assert _cost(model="llama-3-70b", cluster={"tensor_parallel_size": 4}) is not a
        assert _cost(hardware={"gpu": "a100-80g"}) is not a
        run_bytes(small_scenario(engine={"policy": "continuous"}))   # warms the shared memos
        run_bytes({**small_scenario(), "seed": 7})
        warm = run_bytes(base)
    assert _cost() is not a
    assert warm == fresh


def test_solo_prefill_keys_are_one_to_one():
    """The solo-prefill memo's int key (a chunk's context below 2**32 tokens) never maps two
    chunks to one key; a context beyond 32 bits takes a tuple key instead."""
    from sim.core.ttft import solo_key
    big = 2 ** 32
    solos = [(n, c, b) for n in (0, 1, 2, 2 ** 40) for c in (0, 1, big - 1, big) for b in (False, True)]
    assert len({solo_key(*s) for s in solos}) == len(solos)
    assert isinstance(solo_key(1, big, True), tuple) and isinstance(solo_key(1, big - 1, True), int)


def test_step_and_chunk_keys_are_one_to_one():
    """The step-shape memo's int keys (a decode-only shape's n; one prompt chunk, bounded
    fields: negative) and the prompt-chunk
    memo's never map two shapes to one key, nor a chunk shape onto a decode-only shape's key
    (the int n); a field beyond its bits takes the tuple key instead."""
    from sim.cost.roofline import chunk_key, step_key
    edges = {"n": (0, 1, 2 ** 11 - 1, 2 ** 11), "c": (0, 1, 2 ** 16 - 1, 2 ** 16), "x": (0, 1, 2 ** 33 - 1, 2 ** 33)}
    shapes = [(n, n + d, ((c, x),)) for n in edges["n"] for d in (0, 1, 2) for c in edges["c"] for x in edges["x"]]
    shapes += [(3, 4, ((1, 0), (2, 5))), (3, 3, ())]
    keys = [step_key(*s) for s in shapes]
    assert len(set(keys)) == len(shapes)
    # a shape with chunks never takes a decode-only shape's key, the int n >= 0
    assert all(k < 0 for s, k in zip(shapes, keys) if s[2] and isinstance(k, int))
    assert [step_key(n, n, ()) for n in (0, 1, 2 ** 11)] == [0, 1, 2 ** 11] and step_key(3, 2, ()) == (3, 2, ())
    assert isinstance(step_key(5, 6, ((512, 2 ** 33 - 1),)), int)
    assert step_key(5, 7, ((512, 0),)) == (5, 7, ((512, 0),)) and step_key(2 ** 11, 2 ** 11, ((1, 0),))[0] == 2 ** 11
    chunks = [(n, c, x) for n in (0, 1, 2 ** 12 - 1, 2 ** 12) for c in edges["c"] for x in edges["x"]]
    assert len({chunk_key(*k) for k in chunks}) == len(chunks)
    assert chunk_key(1, 512, 2 ** 33) == (1, 512, 2 ** 33) and isinstance(chunk_key(1, 512, 2 ** 33 - 1), int)


def test_replicas_sharing_a_cost_model_share_its_solo_memo():
    """The TTFT split's chunk-alone seconds are memoised in the cost model: every replica of a
    deployment reads one memo, and a second replica finds what the first computed, the same
    float the model gives."""
    from sim.core.ttft import solo_key
    from sim.engine.recorder import Recorder
    from sim.engine.simpy_clock import ClockEnvironment
    from sim.engine.topology import ColocatedLayout

    layout = ColocatedLayout(scenario_from_dict(small_scenario(cluster={"replicas": 3})))
    topo = layout.build()(ClockEnvironment(), Recorder(), lambda reqs: None)
    cost = layout.deployment.cost
    first, second, third = (r.ttft.solo for r in topo.replicas)
    assert first.cache is second.cache is third.cache is cost.solo_cache
    key = solo_key(300, 128, True)
    assert key not in second.cache
    own = first.computed(key, 300, 128, True)
    assert second.cache[key] == own == cost.prefill_alone_s(300, 128, True)
