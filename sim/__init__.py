"""simsrv: a discrete-event simulator of an LLM inference cluster."""

__version__ = "0.1.0"

from sim import compiled_core as _compiled_core

_compiled_core.choose()  # the compiled simulation core, or its Python sources (sim/compiled_core.py)
