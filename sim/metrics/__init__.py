"""Per-run figures: vLLM bench's metric definitions, the run summary (result.json) and
the warnings a run's figures need beside them."""
