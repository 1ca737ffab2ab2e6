"""``engine.max_num_batched_tokens``, the step's token budget, for every policy: vLLM's
start-up rule and its default.

Why: the budget bounds every step. vLLM refuses at start-up a budget below ``max_num_seqs``
and, without chunked prefill, one below ``max_model_len`` (a longer prompt could never be
scheduled): vllm/config/scheduler.py ``SchedulerConfig._verify_args`` (vLLM 0.11.0). simsrv
applies that one rule to each engine a policy runs (``PolicySpec.chunked_prefill``; a
disaggregated policy's prefill and decode pools, ``pool_chunked_prefill``) at scenario
validation (with the ``max_model_len`` given) and when a deployment is built (with the model's
context length), where each policy once did its own thing: ``static`` and the prefill pool ran
prompts over any budget, ``continuous`` failed every longer prompt, ``chunked`` refused.
"""

from __future__ import annotations

from sim.policies.registry import get_policy

# in every refusal's line: ``simsrv compare`` leaves a policy so refused out of its default list
REFUSED = "vLLM refuses this at start-up (SchedulerConfig._verify_args)"

# vllm/utils/__init__.py DEFAULT_MAX_NUM_BATCHED_TOKENS (vLLM 0.11.0)
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def policy_engines(policy: str) -> tuple[tuple[str, bool], ...]:
    """(where, chunked_prefill) of each engine ``policy`` runs: ``engine`` for colocated
    replicas, ``disaggregation.<pool>`` for each pool of a pools policy."""
    spec = get_policy(policy)
    if spec.pools:
        return tuple((f"disaggregation.{name}", chunked) for name, chunked in spec.pool_chunked_prefill)
    return (("engine", spec.chunked_prefill),)


def budget_tokens(engine, chunked: bool, max_model_len: int | None) -> int | None:
    """The step budget of an engine: ``engine.max_num_batched_tokens`` when set, or when the
    key's default (8192, vLLM's for an API server on a >= 70 GiB GPU:
    vllm/engine/arg_utils.py ``EngineArgs._set_default_args``) is legal. Unset without chunked
    prefill and below ``max_model_len``, vLLM's default for that mode instead:
    min(max_num_seqs x max_model_len, max(max_model_len, 2048)) (vllm/config/scheduler.py
    ``SchedulerConfig.__post_init__``; ``_set_default_args`` gives max_model_len itself, the same
    for any max_model_len >= 2048), never below max_model_len. None while an unset budget
    depends on a ``max_model_len`` not known yet (the model's context length)."""
    budget = engine.max_num_batched_tokens
    if chunked or "max_num_batched_tokens" in engine.model_fields_set:
        return budget
    if max_model_len is None:
        return None
    if budget >= max_model_len:
        return budget
    return min(engine.max_num_seqs * max_model_len, max(max_model_len, VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS))


def budget_error(engine, where: str, chunked: bool, budget: int, max_model_len: int | None,
                 max_len_source: str = "engine.max_model_len") -> str:
    """Why vLLM would refuse ``budget`` for this engine, as one line naming the keys and values,
    or ''. ``where``: ``engine`` or the pool; ``max_len_source`` says where ``max_model_len``
    came from."""
    given = engine.max_num_batched_tokens if "max_num_batched_tokens" in engine.model_fields_set else None
    key = ("engine.max_num_batched_tokens" if given is not None
           else "engine.max_num_batched_tokens (unset, its default)")
    pool = "" if where == "engine" else f"{where} pool: "
    if not chunked and max_model_len is not None and budget < max_model_len:
        runs = (f"policy {engine.policy} prefills whole prompts" if where == "engine"
                else f"the {where} pool of policy {engine.policy} prefills whole prompts")
        return (f"{key} {budget} must be >= {max_len_source} {max_model_len}: {runs} (no chunked prefill), so a "
                f"prompt longer than the budget could never run, and {REFUSED}; raise "
                f"engine.max_num_batched_tokens to at least {max_model_len}, lower engine.max_model_len, "
                "or use policy chunked")
    if budget < engine.max_num_seqs:
        return (f"{pool}{key} {budget} must be >= engine.max_num_seqs {engine.max_num_seqs}: a step could not give "
                f"every running sequence its token, and {REFUSED}; raise engine.max_num_batched_tokens or lower "
                "engine.max_num_seqs")
    return ""


def scenario_budget_error(engine) -> str:
    """``budget_error`` of each engine of the scenario's policy with what the scenario says
    (``engine.max_model_len`` when given); the first one found, or ''."""
    for where, chunked in policy_engines(engine.policy):
        budget = budget_tokens(engine, chunked, engine.max_model_len)
        if budget is not None:
            msg = budget_error(engine, where, chunked, budget, engine.max_model_len)
            if msg:
                return msg
    return ""
