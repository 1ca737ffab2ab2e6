"""The policy registry: each policy module registers itself, with its name, its help line,
the modules whose ``NOTE:`` lines apply to its runs, and what it needs to run.

Why: adding a policy is one file. The scenario's ``engine.policy`` choices, ``compare
--policies``, the CLI help, the modelling notes and the run wiring all read this registry
instead of keeping their own list of names. What a policy supports is declared here, as
capabilities (``pools``, ``chunked_prefill``, the admission modes, multi-step...), and the
scenario's checks, the deployment, compare, diagnose, run and capacity ask the spec, never the
name; their error messages list the policies that have the capability (``names_with``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PolicySpec:
    name: str
    summary: str                      # one line: what it does, for --help and docs
    scheduler: type | None = None     # the colocated scheduler class; None when ``pools``
    note_modules: tuple[str, ...] = ()  # dotted module names whose NOTE: lines apply
    pools: bool = False               # runs as a prefill pool -> KV link -> decode pool topology
    # splits a prompt over steps under max_num_batched_tokens (vLLM's enable_chunked_prefill);
    # without it the budget must hold max_model_len (sim/policies/budget.py)
    chunked_prefill: bool = False
    # ``pools``: each pool's (name under ``disaggregation``, chunked_prefill)
    pool_chunked_prefill: tuple[tuple[str, bool], ...] = ()
    order: int = 100                  # position in listings (help, compare's default)
    # engine.admission values it runs (sim/policies/admission.py): vllm = KV blocks needed now;
    # sglang = SGLang 0.3's new_token_ratio admission and retract_decode
    admission_modes: tuple[str, ...] = ("vllm",)
    # engine.capacity_scheduler_policy values it runs (TensorRT-LLM's capacity scheduler)
    capacity_scheduler_policies: tuple[str, ...] = ("max_utilization",)
    # engine.scheduling_policy values it runs (vLLM's --scheduling-policy): priority is V1's
    # waiting heap and priority preemption (sim/policies/base.py queue_order, _victim_index)
    scheduling_policies: tuple[str, ...] = ("fcfs",)
    multi_step: bool = False          # engine.num_scheduler_steps > 1 (vLLM 0.6 multi-step)
    # engine.separate_prefill_steps: whole prompts in steps of their own (vLLM V0, SGLang)
    separate_prefill_steps: bool = False
    # iteration-level batching (a request joins or leaves the batch at any step); false: the
    # batch runs until all its requests finish. capacity --rate searches the colocated ones
    iteration_level: bool = True
    pipeline_parallel: bool = True    # cluster.pipeline_parallel_size > 1
    data_parallel: bool = True        # cluster.data_parallel_size > 1 (DP + EP)

    @property
    def chunk_is_budget(self) -> bool:
        """One colocated scheduler splits prompts into max_num_batched_tokens chunks: the budget
        is its chunk size, named in run directories and compare's labels (``--chunk``)."""
        return self.chunked_prefill and not self.pools


_REGISTRY: dict[str, PolicySpec] = {}


def register(spec: PolicySpec) -> PolicySpec:
    """Add ``spec`` under its name (a policy module calls this once, at import)."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ValueError(f"policy {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def policy_names() -> tuple[str, ...]:
    """Registered policy names in listing order."""
    return tuple(s.name for s in sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name)))


def names_with(capability: Callable[[PolicySpec], bool]) -> tuple[str, ...]:
    """Registered policy names (listing order) whose spec has ``capability``."""
    return tuple(n for n in policy_names() if capability(_REGISTRY[n]))


def name_list(names: tuple[str, ...] | list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: policy names in an error message."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def chunk_policy() -> str:
    """The policy ``--chunk N`` selects (and diagnose proposes): the first colocated policy
    whose token budget is its chunk size."""
    names = names_with(lambda s: s.chunk_is_budget)
    if not names:
        raise KeyError("no registered policy chunks prompts under max_num_batched_tokens")
    return names[0]


def chunked_prefill_policy(enabled: bool) -> str:
    """The policy vLLM's ``enable_chunked_prefill`` names: the first colocated iteration-level
    policy with (or without) chunked prefill."""
    names = names_with(lambda s: not s.pools and s.iteration_level and s.chunked_prefill == enabled)
    if not names:
        raise KeyError(f"no registered colocated policy with chunked_prefill={enabled}")
    return names[0]


def get_policy(name: str) -> PolicySpec:
    """The spec registered as ``name`` (KeyError names the choices)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(policy_names())}") from None
