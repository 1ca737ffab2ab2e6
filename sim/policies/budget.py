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

Unset, ``max_num_batched_tokens`` and ``max_num_seqs`` take vLLM's defaults for its OpenAI API
server, which depend on the GPU (``vllm_default_limits``): 8192 and 1024 on a GPU of >= 70 GiB
that is not an A100 (H100, H200, MI300X), 2048 and 256 on any other; without chunked prefill the
budget is ``max_model_len`` instead; an unset ``max_num_seqs`` is never above the budget
(vllm/engine/arg_utils.py ``EngineArgs._set_default_args``, vLLM 0.11.0). Each engine takes its
own GPU's: a disaggregated pool on another GPU, its own.
"""

from __future__ import annotations

from sim.policies.registry import get_policy

# in every refusal's line: ``simsrv compare`` leaves a policy so refused out of its default list
REFUSED = "vLLM refuses this at start-up (SchedulerConfig._verify_args)"

GIB_BYTES = 2 ** 30
# vllm/engine/arg_utils.py EngineArgs._set_default_args (vLLM 0.11.0), UsageContext.OPENAI_API_SERVER:
# (max_num_batched_tokens with chunked prefill, max_num_seqs)
LARGE_GPU_LIMITS = (8192, 1024)   # device total memory >= 70 GiB and "a100" not in its name
OTHER_GPU_LIMITS = (2048, 256)    # any other GPU ("TODO(woosuk): Tune the default values")
LARGE_GPU_MIN_BYTES = 70 * GIB_BYTES
# vLLM 0.34.0 (vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults``) adds a tier: GPUs of
# >= 160 GiB ("B200/B300") take 16384 and 1024 (and GB10, compute capability 12.1, stays on the
# small tier: no GPU of the catalogue is one)
XL_GPU_LIMITS_034 = (16384, 1024)
XL_GPU_MIN_BYTES_034 = 160 * GIB_BYTES


def profile_release(profile: str) -> str:
    """The vLLM release whose rules engine profile ``profile`` follows: its ``vllm_release``, in
    sim/catalog/engine_profiles.yaml or in the profile file ("0.11" when it names none), read as
    every profile is (``get_profile``)."""
    from sim.cost.engine_profile import get_profile

    return get_profile(profile).vllm_release


def vllm_default_limits(gpu, release: str = "0.11") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's OpenAI API server defaults to on ``gpu`` (a
    ``GPUSpec``) with chunked prefill: vllm/engine/arg_utils.py ``EngineArgs._set_default_args``
    compares ``current_platform.get_device_total_memory()`` (CUDA's total: ``cuda_total_bytes``)
    with 70 GiB and looks for "a100" in the device name (PR #17885: the larger budget lowers an
    A100's throughput). A custom GPU is judged by its memory and its name (key and name here).
    ``release`` "0.34": vLLM 0.34's tiers (``XL_GPU_LIMITS_034`` first)."""
    if release == "0.34" and gpu.cuda_total_bytes >= XL_GPU_MIN_BYTES_034:
        return XL_GPU_LIMITS_034
    named_a100 = "a100" in f"{gpu.key} {gpu.name}".lower()
    return LARGE_GPU_LIMITS if gpu.cuda_total_bytes >= LARGE_GPU_MIN_BYTES and not named_a100 else OTHER_GPU_LIMITS


def policy_engines(policy: str) -> tuple[tuple[str, bool], ...]:
    """(where, chunked_prefill) of each engine ``policy`` runs: ``engine`` for colocated
    replicas, ``disaggregation.<pool>`` for each pool of a pools policy."""
    spec = get_policy(policy)
    if spec.pools:
        return tuple((f"disaggregation.{name}", chunked) for name, chunked in spec.pool_chunked_prefill)
    return (("engine", spec.chunked_prefill),)


def budget_tokens(engine, chunked: bool, max_model_len: int | None, default_budget: int) -> int | None:
    """The step budget of an engine: ``engine.max_num_batched_tokens`` when set; unset, with
    chunked prefill ``default_budget`` (its GPU's, ``vllm_default_limits``), without it
    ``max_model_len`` (vllm/engine/arg_utils.py ``EngineArgs._set_default_args``: "if not
    self.enable_chunked_prefill: self.max_num_batched_tokens = model_config.max_model_len").
    None while an unset budget depends on a ``max_model_len`` not known yet (the model's context
    length)."""
    if "max_num_batched_tokens" in engine.model_fields_set:
        return engine.max_num_batched_tokens
    if chunked:
        return default_budget
    if max_model_len is not None and profile_release(engine.profile) == "0.34":
        # vLLM 0.34: "If max_model_len is too short, use the default for higher throughput"
        # (arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args: max(max_model_len, default))
        return max(max_model_len, default_budget)
    return max_model_len


def seqs_limit(engine, budget: int | None, default_seqs: int) -> int:
    """``engine.max_num_seqs`` when set; unset, its GPU's default (``vllm_default_limits``) but
    never above the step budget: vllm/engine/arg_utils.py ``EngineArgs._set_default_args``
    ``min(default_max_num_seqs, max_num_batched_tokens)``, so an unset key is never refused."""
    if "max_num_seqs" in engine.model_fields_set:
        return engine.max_num_seqs
    return default_seqs if budget is None else min(default_seqs, budget)


def engine_limits(engine, chunked: bool, max_model_len: int | None,
                  defaults: tuple[int, int]) -> tuple[int | None, int]:
    """(``budget_tokens``, ``seqs_limit``) of an engine whose GPU defaults to ``defaults``
    (``vllm_default_limits``): what it runs with, the budget None while it waits on an unknown
    ``max_model_len``."""
    default_budget, default_seqs = defaults
    budget = budget_tokens(engine, chunked, max_model_len, default_budget)
    return budget, seqs_limit(engine, budget, default_seqs)


def budget_error(engine, where: str, chunked: bool, budget: int, max_model_len: int | None,
                 max_len_source: str = "engine.max_model_len", max_num_seqs: int | None = None) -> str:
    """Why vLLM would refuse ``budget`` for this engine, as one line naming the keys and values,
    or ''. ``where``: ``engine`` or the pool; ``max_len_source`` says where ``max_model_len``
    came from; ``max_num_seqs``: the engine's (``seqs_limit``; default ``engine.max_num_seqs``)."""
    seqs = engine.max_num_seqs if max_num_seqs is None else max_num_seqs
    given = engine.max_num_batched_tokens if "max_num_batched_tokens" in engine.model_fields_set else None
    key = ("engine.max_num_batched_tokens" if given is not None
           else "engine.max_num_batched_tokens (unset, its default)")
    pool = "" if where == "engine" else f"{where} pool: "
    # Without chunked prefill vLLM refuses a budget below max_model_len (SchedulerConfig.
    # _verify_args); an engine profile with budget_covers_max_model_len false does not: TensorRT-LLM
    # checks each prompt against max_num_tokens only (trtllm-bench's get_settings raises
    # max_num_tokens to the longest prompt plus max_batch_size and runs max_seq_len = the longest
    # ISL + OSL above it: sim/spec/trtllm_bench.py; v0.5-v0.7's GptSession builds max_input_len and
    # max_output_len apart: trt-llm-2023), and the scheduler's admission_error fails a longer
    # prompt with its reason. A profile file is read where the scenario found it
    # (Scenario._profile_file makes its path absolute before the limits are checked).
    from sim.cost.engine_profile import get_profile

    if (not chunked and max_model_len is not None and budget < max_model_len
            and get_profile(engine.profile).budget_covers_max_model_len):
        runs = (f"policy {engine.policy} prefills whole prompts" if where == "engine"
                else f"the {where} pool of policy {engine.policy} prefills whole prompts")
        return (f"{key} {budget} must be >= {max_len_source} {max_model_len}: {runs} (no chunked prefill), so a "
                f"prompt longer than the budget could never run, and {REFUSED}; raise "
                f"engine.max_num_batched_tokens to at least {max_model_len}, lower engine.max_model_len, "
                "or use policy chunked")
    if budget < seqs:
        return (f"{pool}{key} {budget} must be >= engine.max_num_seqs {seqs}: a step could not give "
                f"every running sequence its token, and {REFUSED}; raise engine.max_num_batched_tokens or lower "
                "engine.max_num_seqs")
    return ""


def scenario_budget_error(engine, default_limits) -> str:
    """``budget_error`` of each engine of the scenario's policy with what the scenario says
    (``engine.max_model_len`` when given); the first one found, or ''. ``default_limits(where)``:
    the (budget, max_num_seqs) defaults of that engine's GPU (``vllm_default_limits``)."""
    for where, chunked in policy_engines(engine.policy):
        budget, seqs = engine_limits(engine, chunked, engine.max_model_len, default_limits(where))
        if budget is not None:
            msg = budget_error(engine, where, chunked, budget, engine.max_model_len, max_num_seqs=seqs)
            if msg:
                return msg
    return ""
