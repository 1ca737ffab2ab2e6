"""vLLM's OpenAI-compatible request and response bodies, as ``simsrv serve`` reads and writes
them (no HTTP here: sim/serve/app.py).

Why: clients (the ``openai`` package, ``vllm bench serve``, gateways) parse these exact
shapes; the field names and the checks follow vLLM 0.11.0's
``vllm/entrypoints/openai/protocol.py`` (``CompletionStreamResponse``,
``ChatCompletionStreamResponse``, ``ErrorResponse``) and ``serving_engine.py``
(``_validate_input``: a prompt of ``max_model_len`` tokens or more is refused, and so is
``max_tokens`` beyond what is left of the context; ``vllm/entrypoints/utils.py``
``get_max_tokens``: without ``max_tokens`` a request may generate up to ``max_model_len`` less
its prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from sim.serve.tokens import message_tokens, prompt_tokens


class ApiError(Exception):
    """An error answered as vLLM answers it: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": None, "code": self.status}}


@dataclass(frozen=True)
class Asked:
    """What one request asks for, in the simulation's terms."""
    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int          # the most tokens it may generate (vLLM's get_max_tokens)
    ignore_eos: bool
    stream: bool
    include_usage: bool
    # vLLM's request ``priority`` (its OpenAI server's extra parameter; a lower value is served
    # first under --scheduling-policy priority)
    priority: int = 0


def _int_field(body: dict, key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ApiError(400, f"{key} must be a positive integer, got {v!r}")
    return v


def parse(body: object, chat: bool, count: Callable[[str], int], max_model_len: int, served_model: str) -> Asked:
    """A request body, checked as vLLM checks it; raises ``ApiError`` (400) on what vLLM refuses."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model", served_model)
    if model is not None and model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "simsrv serve answers one choice per request (n=1)")
    try:
        if chat:
            tokens = message_tokens(body.get("messages"), count)
        else:
            if "prompt" not in body:
                raise ApiError(400, "prompt is required")
            tokens = prompt_tokens(body["prompt"], count)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    max_tokens = (_int_field(body, "max_completion_tokens") if chat else None) or _int_field(body, "max_tokens")
    if tokens >= max_model_len:  # serving_engine.py _validate_input
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                            f"request has {tokens} input tokens. Please reduce the length of the input messages.")
    if max_tokens is not None and tokens + max_tokens > max_model_len:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                            f"maximum context length is {max_model_len} tokens and your request has {tokens} "
                            f"input tokens ({max_tokens} > {max_model_len} - {tokens}).")
    if max_tokens is None:  # vllm/entrypoints/utils.py get_max_tokens
        max_tokens = max_model_len - tokens
    priority = body.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ApiError(400, f"priority must be an integer, got {priority!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object")
    return Asked(chat=chat, model=served_model, prompt_tokens=tokens, max_tokens=max_tokens,
                 ignore_eos=bool(body.get("ignore_eos", False)), stream=bool(body.get("stream", False)),
                 include_usage=bool(options.get("include_usage", False)), priority=priority)


# the text of generated token i: one word, so that rule 3 of sim/serve/tokens.py counts the
# answer back as its number of tokens (a client that re-tokenises it gets the same count)
_WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as")


def token_text(i: int) -> str:
    return " " + _WORDS[i % len(_WORDS)]


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None}


def sse(obj: dict | str) -> bytes:
    """One server-sent event as vLLM writes it (``data: ...\\n\\n``)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def chunk(asked: Asked, rid: str, created: int, text: str | None, finish: str | None,
          role: bool = False) -> dict:
    """A streamed chunk: completions' ``text_completion`` or chat's ``chat.completion.chunk``."""
    if asked.chat:
        delta: dict = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": asked.model,
                "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": asked.model, "choices": [choice]}


def usage_chunk(asked: Asked, rid: str, created: int, completion: int) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if asked.chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": asked.model, "choices": [],
            "usage": usage(asked.prompt_tokens, completion)}


def whole(asked: Asked, rid: str, created: int, text: str, finish: str, completion: int) -> dict:
    """A non-streamed answer."""
    if asked.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish, "stop_reason": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": asked.model, "choices": [choice],
            "usage": usage(asked.prompt_tokens, completion)}
