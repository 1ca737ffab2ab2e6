"""Request streams: synthetic generators and trace readers, both as ``RequestArrays``."""

from sim.workload.arrays import RequestArrays
from sim.workload.build import build_workload

__all__ = ["RequestArrays", "build_workload"]
