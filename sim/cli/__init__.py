"""The ``simsrv`` command line: one module per command group; ``sim.cli.app`` holds the Typer
application and the entry point ``main`` (re-exported here for ``simsrv = "sim.cli:main"``)."""

from sim.cli.app import main

__all__ = ["main"]
