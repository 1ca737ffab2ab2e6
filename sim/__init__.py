"""simsrv: a discrete-event simulator of an LLM inference cluster."""

__version__ = "0.1.0"
