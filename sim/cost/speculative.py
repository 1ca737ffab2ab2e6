"""Speculative decoding: the tokens a decode step emits, and the step's cost (draft + verify).

Why: with a proposer drafting k tokens per sequence, the target model's step verifies k + 1
tokens per sequence (the last accepted token and the k drafts) and emits, on average,

    E = 1 + sum_{i=1..k} prod_{j<=i} a_j

tokens per sequence, a_j the rate at which draft position j is accepted given the ones before
were (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
section 3.1, the expected accepted length with the bonus token; vLLM reports it as the "mean
acceptance length", docs.vllm.ai/en/latest/features/spec_decode.html).

Acceptance is taken as this expected value, not a seeded draw per sequence and step: a draw
would give every sequence its own progress each step, and the decode set's aggregates (one
step counter for all sequences, a heap of finish steps: sim/policies/decode_set.py) would give
way to per-sequence state per step. With E every sequence gains the same tokens in a step
(``DecodeSet.spec_step_tokens``: the cumulative floor(steps x E)), so request token times stay
exact functions of the step count. What is lost: the spread of per-request TPOT that random
acceptance adds (the mean is kept).

A step's cost (``SpeculativeCost``):
- verification: the target's step with n x (k + 1) tokens through its GEMMs and LM head (vLLM
  V1's rejection sampler reads the logits of every verified position:
  vllm/v1/sample/rejection_sampler.py) and decode attention over each sequence's context.
  NOTE: the k + 1 queries per sequence read its KV once (as FlashAttention's varlen kernel
  does); their extra attention FLOPs are not counted (decode attention stays bandwidth bound
  at a few queries per KV head group).
- the draft, on the GPU, serial with the target's forward pass:
  draft_model: k forward passes of the draft model at the batch (its own roofline: the draft
  model from the catalogue on the same GPUs); the first also over the step's prompt chunks
  (vLLM's draft model keeps its own KV of the prompt).
  eagle / eagle3: k passes of one decoder layer of the target's width plus the LM head (Li et
  al. 2024, "EAGLE", section 4.1: the draft head is one transformer decoder layer over the
  target's features; Li et al. 2025, "EAGLE-3", section 3: one layer over fused low, middle and
  high features); the first pass over the step's tokens (vllm/v1/spec_decode/eagle.py
  EagleProposer.propose: the first forward over the scheduled tokens, then one token per
  sequence for each further draft).
  mtp: k passes of the model's multi-token-prediction module, one transformer block and the
  shared output head (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 2.2): priced as
  EAGLE's one layer of the target.
  ngram: no GPU work; host work on the step's critical path (``ngram_host_s``).
  NOTE: a layer of the draft head is priced as the target's average layer (its GEMMs,
  attention and all-reduce over num_layers) at the draft's context; its weights are not taken
  out of the KV cache, nor the draft model's; the draft passes' host work (kernel launches) is
  not charged.
- the n-gram proposer (ngram): vllm/v1/spec_decode/ngram_proposer.py ``batch_propose_numba``
  scans each sequence's context once (a KMP over the reversed tokens,
  ``_find_longest_matched_ngram_and_propose_tokens``) on the host, one numba thread (its
  ``num_numba_thread_available = min(1, cpu_count // 2) // tp``, at least 1), after the
  step's sampled tokens reach the host and before the next step can be scheduled with its
  drafts: serial with the GPU whatever the engine overlaps. Measured: 70.28 ms for 512
  sequences of 129,536 tokens (66.3M tokens scanned per step; 4x H100 host, 120 vCPU, vLLM
  main, one thread per rank: github.com/vllm-project/vllm/pull/56732, "Microbenchmark"),
  1.06 ns per context token; charged as that per token of the decodes' contexts.
  NOTE: one host's figure, taken as the same on every host (as the engine profiles' CPU
  terms); the prompts completing in the step propose too and are not counted.
KV: each decoding sequence holds the blocks of its context plus the slots of the k drafts and
the drafter's lookahead (``lookahead_tokens``) less its accepted drafts: sim/policies/base.py
``spec_slots``, held in the decode set's block counts, so KV pressure and preemption see them;
rejected drafts' slots are written over by the next step's tokens (vLLM never shrinks a running
request's blocks).
"""

from __future__ import annotations

from sim.core.batch import Batch

# operators of one layer of the target (sim/cost/roofline.py OPS), summed over layers there
_LAYER_OPS = ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "attn_prefill", "attn_decode",
              "elementwise", "allreduce")
_HEAD_OPS = ("lm_head", "sampling")


def expected_tokens_per_step(rates: list[float]) -> float:
    """E = 1 + sum_i prod_{j<=i} a_j (Leviathan et al. 2023, section 3.1)."""
    e, p = 1.0, 1.0
    for a in rates:
        p *= a
        e += p
    return e


def tokens_per_step(cfg) -> float:
    """E of a scenario's ``engine.speculative_config``: its acceptance_length, or E of its rates."""
    if cfg.acceptance_length is not None:
        return float(cfg.acceptance_length)
    return expected_tokens_per_step(list(cfg.acceptance_rates))


def tokens_per_step_milli(cfg) -> int:
    """E x 1000 as an int (what the decode set counts with: exact integer arithmetic)."""
    return int(round(tokens_per_step(cfg) * 1000))


def lookahead_tokens(method: str, num_speculative_tokens: int) -> int:
    """KV slots vLLM reserves per request past the scheduled tokens, where the drafter writes
    the KV of its drafts (``VllmConfig.num_lookahead_tokens``): k for the drafters with a KV
    cache of their own (eagle, eagle3, mtp: vllm 0.11 scheduler.py ``if
    speculative_config.use_eagle(): self.num_lookahead_tokens = self.num_spec_tokens``; and
    draft_model: vllm 0.34 v1/worker/gpu/spec_decode/standalone_ar/config.py
    ``num_lookahead_tokens``), 0 for ngram (speculator_config.py ``SpeculatorConfig``: the
    n-gram proposer writes no KV)."""
    return 0 if method == "ngram" else num_speculative_tokens


# seconds of the n-gram proposer per context token scanned: 70.28 ms / (512 x 129,536 tokens)
# (github.com/vllm-project/vllm/pull/56732, vLLM main, one numba thread; module docstring)
NGRAM_S_PER_CONTEXT_TOKEN = 70.28e-3 / (512 * 129_536)


def ngram_host_s(context_tokens: int) -> float:
    """Host seconds of the n-gram proposer over decodes holding ``context_tokens`` in all: one
    scan of each context (module docstring)."""
    return NGRAM_S_PER_CONTEXT_TOKEN * context_tokens


def _gpu_s(ops: dict[str, float], names: tuple[str, ...]) -> float:
    return sum(ops[o] for o in names)


class SpeculativeCost:
    """A decode step's seconds under speculative decoding: what ``RooflineCostModel.
    run_cost_values`` answers for a batch with decodes when ``spec_run`` is set (one step: the
    scheduler runs speculative steps one at a time). ``target`` is a cost model of the same
    replica without speculative decoding; ``draft`` the draft model's (method draft_model)."""

    def __init__(self, target, method: str, num_speculative_tokens: int, draft=None) -> None:
        self.target, self.method, self.k, self.draft = target, method, num_speculative_tokens, draft
        self.num_layers = target.model.num_layers

    def verify_values(self, b):
        """The target's step verifying k + 1 tokens per decode (``RunCostValues``, one step)."""
        n, ctx, chunks, logits, _steps, p, tokens = b
        extra = n * self.k
        return self.target.run_cost_values((n, ctx, chunks, logits + extra, 1, p, tokens + extra))

    def draft_s(self, n: int, ctx: int, chunks: tuple[tuple[int, int], ...]) -> float:
        """GPU seconds of the k draft passes of a step of ``n`` decodes at total context ``ctx``
        (and the step's prompt ``chunks``, seen by the first pass)."""
        if self.method == "ngram" or not n:
            return 0.0
        k = self.k
        if self.method == "draft_model":
            d = self.draft
            first = d.step_time(Batch(n, ctx, chunks, n)).ops_s
            rest = d.step_time(Batch(n, ctx, (), n)).ops_s if chunks else first
            names = _LAYER_OPS + _HEAD_OPS
            return _gpu_s(first, names) + (k - 1) * _gpu_s(rest, names)
        # eagle, eagle3, mtp: one layer of the target and its LM head per pass
        t = self.target
        first = t.step_time(Batch(n, ctx, chunks, n)).ops_s
        rest = t.step_time(Batch(n, ctx, (), n)).ops_s if chunks else first
        L = self.num_layers
        return (_gpu_s(first, _LAYER_OPS) / L + _gpu_s(first, _HEAD_OPS)
                + (k - 1) * (_gpu_s(rest, _LAYER_OPS) / L + _gpu_s(rest, _HEAD_OPS)))

    def host_s(self, ctx: int) -> float:
        """Host seconds of the proposer on the step's critical path, ``ctx`` the decodes'
        total context (ngram's scan; the other methods draft on the GPU: ``draft_s``)."""
        return ngram_host_s(ctx) if self.method == "ngram" else 0.0

    def __call__(self, b):
        """``RunCostValues`` of one speculative step of batch values ``b``."""
        v = self.verify_values(b)
        s = v[0] + self.draft_s(b[0], b[1], b[2]) + self.host_s(b[1])
        return s, s, 1, v[3], v[4], 0.0, v[6]
