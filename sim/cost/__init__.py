"""Step-cost models: ``CostModel.step_time(batch) -> StepCost``."""

from sim.cost.roofline import Efficiencies, RooflineCostModel, StepCost

__all__ = ["Efficiencies", "RooflineCostModel", "StepCost"]
