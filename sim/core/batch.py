"""The shape of one engine step, or of a run of identical decode steps: all the cost model sees.

Why: the cost model is a pure function of this shape, so it can be tested (and calibrated)
without any scheduler or event loop.
"""

from __future__ import annotations

from typing import NamedTuple


class _BatchFields(NamedTuple):
    num_decode_seqs: int
    decode_context_tokens: int
    prefill_chunks: tuple[tuple[int, int], ...]
    num_logits: int
    num_steps: int
    prefill_tokens: int  # sum of the chunks' new tokens
    num_tokens: int      # tokens through the GEMMs in one step


# a Batch's seven fields as a plain tuple, in its order (what a cost model that reads a batch by
# position is also given: ``StepPlan.batch_values``)
BatchValues = tuple[int, int, tuple[tuple[int, int], ...], int, int, int, int]


class Batch(_BatchFields):
    """Tokens a step computes.

    ``decode_context_tokens`` is the sum over decode sequences of the tokens each attends to in
    the first step; in a run of ``num_steps`` steps it grows by ``num_decode_seqs`` per step.
    ``prefill_chunks`` holds (new tokens, tokens already in the KV cache) per prompt chunk.
    ``num_logits`` counts sequences that sample a token (decodes plus completing prefills).
    ``prefill_tokens`` and ``num_tokens`` are derived once at construction (the cost model
    reads them several times per step).

    An immutable tuple (one is built every step: a tuple costs a fraction of a frozen
    dataclass's ``object.__setattr__`` per field); its fields are read by name.
    """

    __slots__ = ()

    def __new__(cls, num_decode_seqs: int = 0, decode_context_tokens: int = 0,
                prefill_chunks: tuple[tuple[int, int], ...] = (), num_logits: int = 0,
                num_steps: int = 1) -> "Batch":
        p = sum(c for c, _ in prefill_chunks) if prefill_chunks else 0
        return tuple.__new__(cls, (num_decode_seqs, decode_context_tokens, prefill_chunks, num_logits,
                                   num_steps, p, num_decode_seqs + p))

    def __getnewargs__(self):  # copy / pickle rebuild it from the five given fields
        return tuple(self[:5])

    def _replace(self, **changes) -> "Batch":  # the derived fields follow the given ones
        return Batch(**{**dict(zip(self._fields[:5], self[:5])), **changes})
