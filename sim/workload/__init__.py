"""Request streams: synthetic generators and trace readers, both as ``RequestArrays``.

The two names load on first use (PEP 562), so the light modules of this package (the trace
format registry, ``formats``) import without numpy: the scenario and the CLI read them at
start-up."""

__all__ = ["RequestArrays", "build_workload"]


def __getattr__(name: str):
    if name == "RequestArrays":
        from sim.workload.arrays import RequestArrays

        return RequestArrays
    if name == "build_workload":
        from sim.workload.build import build_workload

        return build_workload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
