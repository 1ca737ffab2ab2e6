"""The max_tokens each request's client sends: ``workload.max_tokens``.

Why: a real engine never knows how many tokens a request will generate; it knows the prompt and
the request's ``max_tokens``, and the request stops early at its end of sequence (EOS). So a
workload carries ``max_tokens`` apart from ``output_tokens`` (the tokens generated before the
EOS), and admission rules that reserve KV for a request's output read ``max_tokens`` only
(sim/policies/base.py, sim/policies/admission.py; tests/test_no_oracle.py).

Settings:
- null (the default): the client sends none (OpenAI API: ``max_tokens`` is optional), or the
  trace's own max_tokens column where it has one. The engine then runs the request with the
  context left, ``max_model_len - prompt`` (vLLM vllm/entrypoints/utils.py ``get_max_tokens``),
  set on arrival by ``sim.policies.base.settle_max_tokens``.
- a number: every request is sent with it; an output longer than it stops there (finish reason
  ``length``, counted in ``simsrv_truncated_requests``).
- ``output``: each request is sent with its own output length and ``ignore_eos``, as benchmark
  clients send fixed-length requests: vLLM's ``vllm bench serve`` (benchmarks/
  backend_request_func.py: ``"max_tokens": request_func_input.output_len``, ``"ignore_eos":
  request_func_input.ignore_eos``), SGLang's bench_serving (``max_new_tokens`` = the output
  length, ``ignore_eos`` unless --disable-ignore-eos) and trtllm-bench (max_tokens = the
  dataset's output length, end id disabled). The engine then does know the length: it is what
  the client asked for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Union

import numpy as np

from sim.workload.arrays import RequestArrays

Setting = Union[None, Literal["output"], int]


def with_max_tokens(arr: RequestArrays, setting: Setting) -> RequestArrays:
    """``arr`` with the max_tokens its clients send under ``setting`` (None keeps the trace's
    column, or none sent)."""
    if setting is None:
        return arr
    if setting == "output":
        return replace(arr, max_tokens=arr.output_tokens.astype(np.int64))
    return replace(arr, max_tokens=np.full(len(arr), int(setting), dtype=np.int64))
