"""The policy registry: each policy module registers itself, with its name, its help line,
the modules whose ``NOTE:`` lines apply to its runs, and what it needs to run.

Why: adding a policy is one file. The scenario's ``engine.policy`` choices, ``compare
--policies``, the CLI help, the modelling notes and the run wiring all read this registry
instead of keeping their own list of names; a policy that runs as separate prefill and decode
pools says so here (``pools``) and the rest asks the spec, not the name.
"""

from __future__ import annotations

from dataclasses import dataclass


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


def get_policy(name: str) -> PolicySpec:
    """The spec registered as ``name`` (KeyError names the choices)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(policy_names())}") from None
