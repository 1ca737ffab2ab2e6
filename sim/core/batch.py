"""The shape of one engine step, or of a run of identical decode steps: all the cost model sees.

Why: the cost model is a pure function of this shape, so it can be tested (and calibrated)
without any scheduler or event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Batch:
    """Tokens a step computes.

    ``decode_context_tokens`` is the sum over decode sequences of the tokens each attends to in
    the first step; in a run of ``num_steps`` steps it grows by ``num_decode_seqs`` per step.
    ``prefill_chunks`` holds (new tokens, tokens already in the KV cache) per prompt chunk.
    ``num_logits`` counts sequences that sample a token (decodes plus completing prefills).
    """

    num_decode_seqs: int = 0
    decode_context_tokens: int = 0
    prefill_chunks: tuple[tuple[int, int], ...] = ()
    num_logits: int = 0
    num_steps: int = 1
    prefill_tokens: int = field(init=False)  # sum of the chunks' new tokens
    num_tokens: int = field(init=False)      # tokens through the GEMMs in one step

    def __post_init__(self) -> None:
        # derived once: the cost model reads them several times per step
        p = sum(c for c, _ in self.prefill_chunks)
        object.__setattr__(self, "prefill_tokens", p)
        object.__setattr__(self, "num_tokens", self.num_decode_seqs + p)
