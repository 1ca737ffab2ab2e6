"""``simsrv serve``: the scenario's deployment behind a vLLM-compatible HTTP endpoint
(sim/serve/; README, "simsrv serve")."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sim.errors import UserError

SERVE_INSTALL = "pip install -e '.[serve]' (starlette and uvicorn)"


def serve(
    scenario: Path = typer.Argument(..., help="Scenario YAML file (its deployment; the workload is the clients')."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port, printed)."),
    speed: float = typer.Option(1.0, "--speed", help="Simulated seconds per wall second (> 1: faster than real time)."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key: dotted.key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory written at shutdown "
                                                           "(default reports/runs/NAME-serve)."),
    force: bool = typer.Option(False, "--force", help="Replace the run directory, whole, if it already exists."),
    max_waiting: int = typer.Option(4096, "--max-waiting", help="Requests waiting to be scheduled (all replicas) "
                                                                 "beyond which a new one gets HTTP 503."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="tokenizer.json (or its directory) to count "
                                                                       "prompt tokens exactly (needs 'tokenizers')."),
    eos: str = typer.Option("max_tokens", "--eos", help="Output length: max_tokens (as ignore_eos), or workload "
                                                        "(an end-of-sequence draw from the scenario's synthetic "
                                                        "output lengths, capped at max_tokens)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="Model id clients send (default: the scenario's model)."),
):
    """Serve the scenario's simulated deployment on vLLM's OpenAI-compatible API; Ctrl-C writes the run."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(f"simsrv serve needs its extra: {SERVE_INSTALL}") from None
    from sim.serve.session import ServeOptions, serve_scenario

    serve_scenario(ServeOptions(scenario=scenario, sets=list(set_), host=host, port=port, speed=speed, out=out,
                                force=force, max_waiting=max_waiting, tokenizer=tokenizer, eos=eos,
                                served_model_name=served_model_name))
