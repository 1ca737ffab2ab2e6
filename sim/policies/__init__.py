"""Scheduler policies, by ``engine.policy`` name."""

from sim.policies.base import EngineLimits, Scheduler, StepPlan
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.policies.static import StaticScheduler

POLICIES: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
    "chunked": ChunkedScheduler,
}

__all__ = ["POLICIES", "EngineLimits", "Scheduler", "StepPlan"]
