"""``simsrv serve``: the scenario's deployment behind vLLM's OpenAI-compatible HTTP surface,
paced against the wall clock (ARCHITECTURE.md section 2, "Serving"). Needs the ``serve``
extra (starlette, uvicorn): ``pip install -e '.[serve]'``."""
