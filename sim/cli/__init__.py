"""The ``simsrv`` command line: one module per command group; ``sim.cli.app`` holds the Typer
application, ``sim.cli.entry`` the entry point ``main`` (re-exported here for
``simsrv = "sim.cli:main"``)."""

from sim.cli.entry import main

__all__ = ["main"]
