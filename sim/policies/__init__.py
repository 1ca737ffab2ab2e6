"""Scheduler policies, by ``engine.policy`` name."""

from sim.policies.base import EngineLimits, Scheduler, StepPlan
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler

POLICIES: dict[str, type[Scheduler]] = {
    "continuous": ContinuousScheduler,
    "chunked": ChunkedScheduler,
}

__all__ = ["POLICIES", "EngineLimits", "Scheduler", "StepPlan"]
