"""Errors in user input.

Why: the CLI turns every ``UserError`` into one clear line and exit status 2, with no
traceback; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user: a scenario key, a trace row, an impossible configuration."""


class SimulationStalled(RuntimeError):
    """The simulated clock stopped advancing: a model defect, never an answer (the watchdog in
    ``sim.engine.clock.Clock`` raises it instead of letting a run spin forever)."""
