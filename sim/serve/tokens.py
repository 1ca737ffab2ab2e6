"""How ``simsrv serve`` counts the tokens of a prompt it is sent.

Why: the simulation needs each request's prompt length in tokens, and a real server counts it
with the model's tokenizer. simsrv ships no tokenizer, so it counts, in this order:

1. token ids sent as the prompt (``/v1/completions`` accepts a list of ints, as vLLM's does):
   exactly their number;
2. a tokenizer file given with ``--tokenizer`` (a Hugging Face ``tokenizer.json``, read by the
   ``tokenizers`` package when it is installed): exactly what that tokenizer gives;
3. otherwise an approximation stated here: one token per run of word characters and one per
   other non-space character (``\\w+|[^\\w\\s]``). It is exact for word-level tokenizers whose
   tokens are space-separated words (the tokenizer the README's ``vllm bench serve`` example
   uses), and for English text under BPE tokenizers it gives within ~25% of their count
   (GPT-2's BPE splits rare words into pieces; common words and punctuation are one token each).

Chat messages are counted as their contents plus a fixed framing per message, as OpenAI's
cookbook counts them for its chat models ("How to count tokens with tiktoken": 3 tokens per
message, 3 more to prime the reply); the count is stated in ``usage.prompt_tokens``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from sim.errors import UserError

_PIECE = re.compile(r"\w+|[^\w\s]")

# OpenAI cookbook, "How to count tokens with tiktoken" (num_tokens_from_messages): every message
# is framed by 3 tokens, and every reply is primed with 3
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3


def approx_tokens(text: str) -> int:
    """The stated approximation (module docstring, rule 3)."""
    return sum(1 for _ in _PIECE.finditer(text))


def load_counter(tokenizer_path: Path | None) -> Callable[[str], int]:
    """The text counter: the tokenizer file's when one is given, else ``approx_tokens``."""
    if tokenizer_path is None:
        return approx_tokens
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("--tokenizer needs the 'tokenizers' package: pip install tokenizers") from None
    path = tokenizer_path / "tokenizer.json" if tokenizer_path.is_dir() else tokenizer_path
    if not path.is_file():
        raise UserError(f"--tokenizer {tokenizer_path}: no tokenizer.json there")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own exception types
        raise UserError(f"--tokenizer {path}: not a tokenizer file ({str(e).splitlines()[0][:120]})") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def prompt_tokens(prompt: object, count: Callable[[str], int]) -> int:
    """Tokens of a completions ``prompt``: a string, or token ids (a list of ints)."""
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return prompt_tokens(prompt[0], count)  # a batch of one
    raise ValueError("prompt must be a string or a list of token ids (one prompt per request)")


def message_tokens(messages: object, count: Callable[[str], int]) -> int:
    """Tokens of a chat ``messages`` list (module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    total = TOKENS_REPLY_PRIMING
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("each message must be an object with a role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones count
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise ValueError("message content must be a string or a list of parts")
        total += TOKENS_PER_MESSAGE + count(content or "")
    return total
