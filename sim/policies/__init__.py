"""Scheduler policies, by ``engine.policy`` name.

Every module of this package is imported here, so a policy module registers itself
(``sim.policies.registry.register``) just by existing: a new policy is one file.
"""

import importlib
import pkgutil

from sim.policies.base import EngineLimits, Scheduler, StepPlan
from sim.policies.registry import PolicySpec, get_policy, policy_names, register

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")

# name -> colocated scheduler class (policies that run on pools have none)
POLICIES: dict[str, type[Scheduler]] = {n: get_policy(n).scheduler for n in policy_names() if get_policy(n).scheduler}

__all__ = ["POLICIES", "EngineLimits", "PolicySpec", "Scheduler", "StepPlan", "get_policy", "policy_names", "register"]
