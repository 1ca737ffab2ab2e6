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
  eagle / eagle3 / mtp: k passes of the draft head (``DraftHead``, from each method's structure
  in vLLM's model files), one after the other (vllm 0.34 v1/worker/gpu/spec_decode/
  target_dependent_ar/speculator.py ``propose``: a first "draft prefill" pass over the target
  step's tokens, each request padded to its k + 1 verified positions plus the step's prompt
  chunks, then ``_run_multi_step_decode``: k - 1 passes of one token per sequence). A pass is
  the head's decoder layer (the target's layer GEMMs, attention, norms and all-reduce at the
  pass's tokens, one layer of the target's average) plus:
  - eagle (EAGLE-1, Li et al. 2024, "EAGLE", section 4.1; vLLM models/llama_eagle.py
    ``LlamaModel.forward``): the fc over [token embedding, feature], 2h -> h, in every pass;
    the target's LM head (shared: v1/worker/gpu/spec_decode/eagle/utils.py
    ``share_target_lm_head``) over n logits.
  - eagle3 (EAGLE-3, Li et al. 2025, arXiv 2503.01840, section 3; vLLM
    models/llama_eagle3.py): the fc over the three target features, 3h -> h, once a step
    (``combine_hidden_states``, called before the first pass); the layer's QKV projection
    over [embedding, hidden], 2h wide (``qkv_input_size = 2 * self.hidden_size``); its own LM
    head over the draft vocabulary (``draft_vocab_size``, ``EAGLE3_DRAFT_VOCAB_TOKENS``),
    whose logits are scattered into the target vocabulary (``compute_logits``, the d2t map)
    before the argmax.
  - mtp (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 2.2; vLLM
    models/deepseek_mtp.py): the eh_proj over [embedding, hidden], 2h -> h, in every pass,
    one block of the target's (its last layer) and the MTP layer's own output head
    (``shared_head.head``, the target's shape).
  A GEMM whose shape the target does not have (the fc, EAGLE-3's wider QKV and narrower LM
  head) costs the target GEMM nearest in role (o, qkv, lm head) times the ratio of the two
  shapes' roofline bounds (max(FLOPs / peak, bytes / bandwidth)), as quantized GEMMs are
  priced (sim/cost/roofline.py ``_linear_s``). A pass takes at least its host work, which the
  GPU waits for at small batches (its kernels are issued from Python one pass after the other):
  the kernel launches of the head's layer unless the pass replays a CUDA graph
  (sim/cost/engine_profile.py ``EngineProfile.draft_graphed``: vLLM 0.11.0's drafter never does;
  vLLM 0.34 captures its passes in the target's graph mode), plus the eager PyTorch ops the
  propose loop issues outside the model (``propose_loop_ops``) at the profile's ``eager_op_s``
  each: vLLM 0.11.0's loop advances positions and sequence lengths, recomputes the slot mapping
  through the block table and copies its inputs into the persistent buffers with separate small
  ops, then runs the LM head and the argmax outside the model (EAGLE-3 also its d2t scatter).
  NOTE: the head's layer is priced as the target's average layer (its GEMMs in the target's
  kernels, quantized where the target's are; the published heads are bf16/fp16); the first
  pass's extra queries (k + 1 per sequence) read each context once, as in verification.
- draft weights: ``draft_weight_bytes_per_gpu``, taken out of the KV cache (sim/spec/memory.py
  ``plan_memory``): vLLM loads the drafter before it profiles memory and sizes the KV cache.
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

from dataclasses import dataclass

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


# EAGLE-3's draft vocabulary where the scenario gives none (speculative_config.draft_vocab_size,
# the head's config.json): the published heads' ``draft_vocab_size`` (32,000 for the Llama-3.1-8B
# head VC-41 ran, yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, and the reference trainers' default:
# SpecForge configs/llama3-8B-eagle3.json); never more than the target's vocabulary
EAGLE3_DRAFT_VOCAB_TOKENS = 32_000
D2T_ENTRY_BYTES = 8  # the draft-to-target id map, int64 (llama_eagle3.py ``draft_id_to_target_id``)


# eager PyTorch ops a draft head's pass issues outside the model, by vLLM release (views and
# slices, which launch nothing, not counted):
# - 0.11 (vllm 0.11.0 v1/spec_decode/eagle.py ``EagleProposer.propose``): each later pass (the
#   loop body): input_ids ``.int()``, ``positions += 1``, ``>=``, ``torch.where``, ``seq_lens += 1``
#   and ``masked_fill_``, ``seq_lens_cpu += 1`` and ``- 1`` (host tensors), the slot mapping's
#   ``//``, ``gather``, ``*``, ``%``, ``+``, ``masked_fill_``, three copies into the persistent
#   buffers, the attention metadata's ``build_for_drafting``, ``compute_logits``' LM head and
#   ``argmax``: 20. The first pass: the input-id shift copy and last-token ``index_put``,
#   ``build_for_drafting``, two buffer copies, three gathers by ``last_token_indices``, the LM
#   head, ``argmax``, ``query_start_loc_cpu``'s ``clone`` and the closing ``torch.stack``: 12.
#   EAGLE-3 adds to each pass ``compute_logits``' d2t scatter (llama_eagle3.py: ``arange``, ``+``,
#   ``new_full``, ``index_put_``) and to the first ``combine_hidden_states``' fc.
# - 0.34 (v1/worker/gpu/spec_decode/autoregressive/speculator.py): a graphed pass issues none
#   (the k - 1 one-token passes are one FULL graph, ``_run_fused_multi_step_decode``); an eager one
#   the slot mapping and metadata update, ``current_draft_step.fill_``, the LM head, the argmax and
#   ``update_draft_inputs``' kernel: 6.
PROPOSE_LOOP_OPS_0_11 = (12, 20)  # (first pass, each later pass)
EAGLE3_D2T_OPS = 4
PROPOSE_LOOP_OPS_0_34_EAGER = 6


def propose_loop_ops(release: str, method: str, first: bool, graphed: bool) -> int:
    """Eager PyTorch ops a pass of an EAGLE / EAGLE-3 / MTP head issues outside the model under
    vLLM ``release`` (the table above)."""
    if release == "0.34":
        return 0 if graphed else PROPOSE_LOOP_OPS_0_34_EAGER
    ops = PROPOSE_LOOP_OPS_0_11[0 if first else 1]
    if method == "eagle3":
        ops += EAGLE3_D2T_OPS + (1 if first else 0)
    return ops


@dataclass(frozen=True)
class DraftHead:
    """What an EAGLE-1 / EAGLE-3 / MTP drafter is, per vLLM's model files (module docstring):
    one decoder layer of the target's shape, an fc over ``fc_in_hidden`` hidden states (2h or
    3h -> h; ``ReplicatedLinear`` / ``nn.Linear``: whole on every TP rank), applied in every
    pass or once a step, a QKV projection over ``qkv_in_hidden`` hidden states, and an LM head
    over ``lm_vocab_tokens``, the drafter's own (``own_lm_head``) or the target's."""

    fc_in_hidden: int
    fc_every_pass: bool
    qkv_in_hidden: int
    lm_vocab_tokens: int
    own_lm_head: bool
    d2t_entries: int  # EAGLE-3's draft-to-target map, where its vocabulary is the smaller


def draft_head(method: str, vocab_size: int, draft_vocab_size: int | None = None) -> DraftHead:
    """The head of ``method`` (eagle, eagle3, mtp) for a target of ``vocab_size`` tokens; an
    EAGLE-3 head drafts over ``draft_vocab_size`` tokens (its config's; unset: the published
    heads' ``EAGLE3_DRAFT_VOCAB_TOKENS``), never more than the target's."""
    if method == "eagle3":
        v = min(EAGLE3_DRAFT_VOCAB_TOKENS if draft_vocab_size is None else draft_vocab_size, vocab_size)
        return DraftHead(3, False, 2, v, True, v if v < vocab_size else 0)
    if method == "mtp":
        return DraftHead(2, True, 1, vocab_size, True, 0)
    return DraftHead(2, True, 1, vocab_size, False, 0)  # eagle


def draft_weight_bytes_per_gpu(method: str, model, tp: int, draft=None, draft_vocab_size: int | None = None) -> float:
    """Bytes of the drafter's weights on each of ``tp`` GPUs (``model`` the target's
    ModelSpec, ``draft`` the draft model's for method draft_model).

    draft_model: the whole draft model, split over the same TP ranks (its own embedding and
    LM head). eagle / eagle3 / mtp (``DraftHead``): the decoder layer (TP-sharded; EAGLE-3's
    QKV over 2h; MTP's block is the target's last layer) and the drafter's own LM head
    (``ParallelLMHead``: sharded), plus, whole on every GPU, the fc and EAGLE-3's d2t map. The
    input embedding is the target's (vLLM v1/worker/gpu/spec_decode/eagle/utils.py
    ``maybe_share_target_embed``: shared unless the checkpoint's differs; EAGLE trains with
    the target's frozen embedding) and so is EAGLE-1's LM head (``share_target_lm_head``); a
    shared tensor costs nothing (the drafter's copy is deleted). In the target's dtype
    (llama_eagle*.py: ``params_dtype=vllm_config.model_config.dtype``). ngram: none.
    NOTE: the head's norms are counted whole on every GPU; a TP degree past the KV heads
    replicates K/V projections in vLLM, not counted here (a few MB)."""
    if method == "ngram":
        return 0.0
    if method == "draft_model":
        return draft.weight_bytes() / tp
    d = draft_head(method, model.vocab_size, draft_vocab_size)
    h = model.hidden_size
    if method == "mtp":
        layer = model.layer_params(model.num_layers - 1)
    else:  # one dense Llama decoder layer of the target's shape (llama_eagle*.py LlamaDecoderLayer)
        layer = (model.attn_params_per_layer + model.norm_params_per_layer
                 + (3 if model.mlp_gated else 2) * h * model.intermediate_size)
    qkv_extra = (d.qkv_in_hidden - 1) * h * (model.q_size + 2 * model.kv_size)
    head = d.lm_vocab_tokens * h if d.own_lm_head else 0
    whole = d.fc_in_hidden * h * h + (h if d.qkv_in_hidden > 1 else 0)  # fc; EAGLE-3's hidden_norm
    return ((layer + qkv_extra + head) / tp + whole) * model.dtype_bytes + d.d2t_entries * D2T_ENTRY_BYTES


def _bound_s(tokens: float, shape: tuple[float, float], peak: float, bw: float, b: float) -> float:
    """Roofline bound of a GEMM of ``tokens`` x in -> out at peak FLOP/s and bytes/s."""
    fin, fout = shape
    return max(2.0 * tokens * fin * fout / peak, (fin * fout + tokens * (fin + fout)) * b / bw)


def _gpu_s(ops: dict[str, float], names: tuple[str, ...]) -> float:
    return sum(ops[o] for o in names)


class SpeculativeCost:
    """A decode step's seconds under speculative decoding: what ``RooflineCostModel.
    run_cost_values`` answers for a batch with decodes when ``spec_run`` is set (one step: the
    scheduler runs speculative steps one at a time). ``target`` is a cost model of the same
    replica without speculative decoding; ``draft`` the draft model's (method draft_model)."""

    def __init__(self, target, method: str, num_speculative_tokens: int, draft=None,
                 draft_vocab_size: int | None = None) -> None:
        self.target, self.method, self.k, self.draft = target, method, num_speculative_tokens, draft
        self.num_layers = target.model.num_layers
        self.head = (draft_head(method, target.model.vocab_size, draft_vocab_size)
                     if method in ("eagle", "eagle3", "mtp") else None)

    def verify_values(self, b):
        """The target's step verifying k + 1 tokens per decode (``RunCostValues``, one step)."""
        n, ctx, chunks, logits, _steps, p, tokens = b
        extra = n * self.k
        return self.target.run_cost_values((n, ctx, chunks, logits + extra, 1, p, tokens + extra))

    def _launch_s(self, cost, n: int, has_prefill: bool, layers: int) -> float:
        """Kernel launches of a draft pass of ``layers`` layers (none when it replays a graph)."""
        return cost.engine.host_terms(n, has_prefill, cost.tp, layers)[1]

    def draft_s(self, n: int, ctx: int, chunks: tuple[tuple[int, int], ...]) -> float:
        """GPU seconds of the k draft passes of a step of ``n`` decodes at total context ``ctx``
        (and the step's prompt ``chunks``, seen by the first pass), each at least its launches."""
        if self.method == "ngram" or not n:
            return 0.0
        k = self.k
        if self.method == "draft_model":
            d = self.draft
            first = d.step_time(Batch(n, ctx, chunks, n)).ops_s
            rest = d.step_time(Batch(n, ctx, (), n)).ops_s if chunks else first
            names = _LAYER_OPS + _HEAD_OPS
            L = d.model.num_layers
            return (max(_gpu_s(first, names), self._launch_s(d, n, bool(chunks), L))
                    + (k - 1) * max(_gpu_s(rest, names), self._launch_s(d, n, False, L)))
        prompt = sum(c for c, _x in chunks)
        first = self.head_pass_s(n * (k + 1) + prompt, n, ctx, chunks, True)
        if k == 1:
            return first
        return first + (k - 1) * self.head_pass_s(n, n, ctx, (), False)

    def head_pass_s(self, tokens: int, n: int, ctx: int, chunks: tuple[tuple[int, int], ...], first: bool) -> float:
        """Seconds of one pass of the draft head (``DraftHead``) over ``tokens`` tokens of ``n``
        sequences at total context ``ctx`` (module docstring)."""
        t, d, L = self.target, self.head, self.num_layers
        assert d is not None
        qkv, o, up, down, elem, ar, _out = t._token_ops(tokens)
        attn = t._attn_decode_s(n, ctx) + (t._prefill_attn(chunks)[0] if chunks else 0.0)
        lm, sampling, _lm_out = t._logit_ops(n)
        peak, bw, b = t.flops_s, t.mem_bw, float(t.dtype_bytes)
        h = float(t.model.hidden_size)
        if d.qkv_in_hidden > 1:  # EAGLE-3: QKV over [embedding, hidden]
            q_in, q_out = t._qkv
            qkv *= _bound_s(tokens, (d.qkv_in_hidden * q_in, q_out), peak, bw, b) / _bound_s(tokens, t._qkv, peak, bw, b)
        s = (qkv + o + up + down + attn + elem + ar) / L
        if first or d.fc_every_pass:  # the fc: whole on every rank, priced from the o projection's kernel
            s += o / L * _bound_s(tokens, (d.fc_in_hidden * h, h), peak, bw, b) / _bound_s(tokens, t._o, peak, bw, b)
        if d.lm_vocab_tokens != t.model.vocab_size:  # EAGLE-3's LM head over its draft vocabulary
            lm *= (_bound_s(n, (h, d.lm_vocab_tokens / t.tp), peak, bw, b) / _bound_s(n, t._lm, peak, bw, b))
        s += lm + sampling
        return max(s, self.head_host_s(n, first and bool(chunks), first))

    def head_host_s(self, n: int, has_prefill: bool, first: bool) -> float:
        """Host seconds of a head pass of ``n`` sequences: its layer's kernel launches unless it
        replays a CUDA graph (``EngineProfile.draft_graphed``) and the propose loop's eager ops
        (``propose_loop_ops``) at the profile's ``eager_op_s`` (module docstring)."""
        e = self.target.engine
        graphed = e.draft_graphed(n, has_prefill)
        launch = 0.0 if graphed else e.eager_launch_per_layer_s
        return launch + propose_loop_ops(e.vllm_release, self.method, first, graphed) * e.eager_op_s

    def host_s(self, ctx: int) -> float:
        """Host seconds of the proposer on the step's critical path, ``ctx`` the decodes'
        total context (ngram's scan; the other methods draft on the GPU: ``draft_s``)."""
        return ngram_host_s(ctx) if self.method == "ngram" else 0.0

    def __call__(self, b):
        """``RunCostValues`` of one speculative step of batch values ``b``."""
        v = self.verify_values(b)
        s = v[0] + self.draft_s(b[0], b[1], b[2]) + self.host_s(b[1])
        return s, s, 1, v[3], v[4], 0.0, v[6]
