"""Pipeline-parallel step cost: a replica's layers split over ``pp`` stages of ``tp`` GPUs.

Why: vLLM V1 keeps up to ``pipeline_parallel_size`` batches in flight (``EngineCore``
``batch_queue``, size ``max_concurrent_batches`` = pp; a request is in at most one of them).
In steady state the running requests are split over pp micro-batches that chase each other
through the stages (GPipe, Huang et al. 2019): each stage works on every micro-batch in turn, so
a round in which every request advances one token lasts as long as the busiest stage's work
(throughput set by the slowest stage), and never less than one micro-batch's trip through all
stages (latency = sum over stages, plus the activation send/recv at each boundary).

Send/recv: vLLM sends the ``IntermediateTensors`` of a stage, hidden states and residual
(2 x tokens x hidden x bytes), each TP rank 1/tp of them (``send_tensor_dict`` with the TP
group all-gathering on arrival), over ``link_bytes_per_s``; with ``boundary_links`` each
boundary over its own link: NVLink within a node, the network between nodes
(sim/spec/nodes.py ``boundary_crosses``: TP innermost, then PP).
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.batch import Batch
from sim.cost.roofline import OPS, StepCost
from sim.cost.runs import RunCost
from sim.spec.memory import stage_layers

P2P_LATENCY_S = 10e-6  # NCCL send/recv launch + sync, as the all-reduce latency (aiconfigurator p2p_latency)


def running_share(total: int, part: int, whole: int) -> int:
    """round(total x part / whole), half up, in integers: taken at each part's running sum, the
    differences of consecutive shares add up to ``total`` exactly, each within one of its own
    share (``sliding_layers_before``, ``split_batch``)."""
    return (2 * total * part + whole) // (2 * whole)


def sliding_layers_before(model, end: int) -> int:
    """Sliding-window layers among the first ``end`` layers, the model's count spread evenly
    over its layers: round(num_sliding x end / num_layers), so the stages' counts (differences
    of it) add up to the model's and each is within one of its share.
    NOTE: ``ModelSpec`` holds the count, not the positions (Gemma-2 alternates, Gemma-3 puts one
    full layer in six, Mistral slides everywhere: HF ``layer_types``); for these periodic
    patterns the true count of a contiguous range is within one of this too. Rounding each
    stage's share on its own (as before) could give the stages more sliding layers than the
    model has: Gemma-3-27B over 3 stages 18 + 18 + 17 = 53 of 52, a full layer's KV reads lost
    (tests/test_floors_pp.py)."""
    return running_share(model.num_sliding_layers, end, model.num_layers)


def stage_models(model, pp: int) -> list:
    """One ``ModelSpec`` per stage: its layers, its share of sliding-window and dense layers."""
    out, start = [], 0
    for n in stage_layers(model.num_layers, pp):
        idx = range(start, start + n)
        dense = sum(1 for i in idx if i < model.num_dense_layers)
        sliding = sliding_layers_before(model, start + n) - sliding_layers_before(model, start)
        out.append(replace(model, num_layers=n, num_dense_layers=dense, num_sliding_layers=sliding))
        start += n
    return out


def split_batch(b: Batch, pp: int) -> list[Batch]:
    """The batch as pp micro-batches: decode sequences dealt evenly (their context in
    proportion), each prompt chunk to the micro-batch with the fewest tokens so far.
    NOTE: the sampled prompt chunks (num_logits beyond the decodes) go one per chunk in order."""
    n, ctx = b.num_decode_seqs, b.decode_context_tokens
    seqs = [n // pp + (1 if i < n % pp else 0) for i in range(pp)]
    chunks: list[list] = [[] for _ in range(pp)]
    load = list(seqs)
    completing = b.num_logits - n
    logits = list(seqs)
    for c in b.prefill_chunks:
        j = min(range(pp), key=lambda i: (load[i], i))
        chunks[j].append(c)
        load[j] += c[0]
        if completing > 0:
            logits[j] += 1
            completing -= 1
    # each micro-batch's context in proportion to its sequences, as differences of the rounded
    # running share (round half up), so that the shares add up to the batch's context exactly
    # (rounding each share on its own lost or added a token's KV per micro-batch:
    # tests/test_floors_pp.py)
    out, before, held = [], 0, 0
    for j in range(pp):
        before += seqs[j]
        upto = running_share(ctx, before, n) if n else 0
        out.append(Batch(seqs[j], upto - held, tuple(chunks[j]), logits[j], b.num_steps))
        held = upto
    return out


class PipelineCostModel:
    """Step cost of ``pp`` stages, each a ``RooflineCostModel`` of its layers on ``tp`` GPUs
    (``make_stage(model_of_stage)``); only the last stage runs the LM head and sampling."""

    def __init__(self, model, pp: int, make_stage, link_bytes_per_s: float, link_eff: float = 0.8,
                 boundary_links: tuple[tuple[float, float], ...] | None = None):
        """``boundary_links``: (bytes/s, latency s) of the send after each stage but the last
        (None: every boundary on ``link_bytes_per_s`` with ``P2P_LATENCY_S``; sim/engine/deployment.py
        passes the first boundary's bandwidth as ``link_bytes_per_s``)."""
        self.model, self.pp = model, pp
        self.stages = [make_stage(m) for m in stage_models(model, pp)]
        last = self.stages[-1]
        self.gpu, self.tp, self.calibration, self.eff, self.ep = last.gpu, last.tp, last.calibration, last.eff, last.ep
        self.carried_from = last.carried_from  # operators borrowing another GPU's curve (summary)
        self.engine = last.engine
        self.link_bytes_per_s = link_bytes_per_s * link_eff
        links = boundary_links or ((link_bytes_per_s, P2P_LATENCY_S),) * (pp - 1)
        if len(links) != pp - 1:
            raise ValueError(f"{len(links)} boundary links for {pp} stages")
        # (achieved bytes/s, latency) per boundary; one entry where every boundary is alike
        self.boundaries = tuple((bw * link_eff, lat) for bw, lat in links)
        self.boundary_peaks = tuple(bw for bw, _ in links)  # each boundary's link at its peak (sim/cost/floor.py)
        self._uniform = len(set(self.boundaries)) <= 1
        # scratch registers of one synchronous call (reset on entry, returned with the durations)
        self._flag = self._lm_flag = False
        self._outside: tuple[int, int] | None = None

    def overhead_s(self, num_seqs: int, has_prefill: bool = True) -> float:
        return self.stages[-1].overhead_s(num_seqs, has_prefill)

    def prompt_overhead_s(self, num_chunks: int, prompt_tokens: int) -> float:
        return self.stages[-1].prompt_overhead_s(num_chunks, prompt_tokens)

    def send_bytes(self, tokens: int) -> float:
        """Bytes each GPU sends at a boundary for a micro-batch of ``tokens``: hidden states and
        residual, its 1/tp share."""
        m = self.model
        return 2 * tokens * m.hidden_size * m.dtype_bytes / self.tp

    def send_s(self, tokens: int, boundary: int = 0) -> float:
        """The send/recv of a micro-batch of ``tokens`` after stage ``boundary``."""
        if not tokens or self.pp == 1:
            return 0.0
        bw, latency = self.boundaries[boundary]
        return latency + self.send_bytes(tokens) / bw

    # -- costs ------------------------------------------------------------------------------------
    def _kernels_s(self, stage, mb: Batch, context: int) -> float:
        """GPU seconds of ``mb`` on one stage (its kernels, without the engine overhead)."""
        stage._flag = stage._lm_flag = False
        t = sum(stage._components(mb, context)[:-1])
        self._flag |= stage._flag
        self._lm_flag |= stage._lm_flag
        return t

    def _round(self, b: Batch, last_step: bool, host: bool = True) -> float:
        """Seconds of one pipelined round, at the run's first step or its last; notes the
        micro-batches whose engine overhead lies outside the profile's measured batch range.
        ``host`` False: the GPU's round alone, without the engine's host work."""
        pp = self.pp
        busy = [0.0] * pp
        latency = 0.0
        outside = self._outside
        for mb in split_batch(b, pp):
            if not mb.num_tokens:
                continue
            ctx = mb.decode_context_tokens + (mb.num_steps - 1) * mb.num_decode_seqs * last_step
            send = self.send_s(mb.num_tokens)
            trip = 0.0
            for s, stage in enumerate(self.stages):
                g = self._kernels_s(stage, mb if s == pp - 1 else replace_logits(mb), ctx)
                if s < pp - 1:
                    g += send if self._uniform else self.send_s(mb.num_tokens, s)
                busy[s] += g
                trip += g
            # NOTE: the engine's host work runs once per micro-batch, overlapped with the other
            # micro-batches' GPU work: it lengthens the micro-batch's trip, not a stage's busy time
            n = mb.num_decode_seqs + len(mb.prefill_chunks)
            prompt_cpu = self.engine.prompt_cpu_s(len(mb.prefill_chunks), mb.prefill_tokens)
            if host:
                trip += self.engine.overhead_s(trip, n, bool(mb.prefill_chunks), self.tp, self.model.num_layers,
                                               prompt_cpu)
            latency = max(latency, trip)
            if self.engine.outside_range(n):
                outside = (min(outside[0], n), max(outside[1], n)) if outside else (n, n)
        self._outside = outside
        return max(max(busy), latency)

    def run_durations_s(self, batch: Batch) -> tuple[float, float]:
        self._flag = self._lm_flag = False
        self._outside = None
        first = self._round(batch, False)
        return first, (first if batch.num_steps == 1 else self._round(batch, True))

    def gpu_round_s(self, batch: Batch) -> float:
        """The first round of ``batch`` without the engine's host work: what its roofline floor
        (sim/cost/floor.py ``pipeline_floor_s``) bounds from below."""
        self._flag = self._lm_flag = False
        self._outside = None
        return self._round(batch, False, host=False)

    def run_cost(self, batch: Batch) -> RunCost:
        """The run as one piece: first and last rounds, all its steps.
        NOTE: a round is a max and sum over stages and micro-batches of steps affine in the
        context, so the run's steps are taken evenly spaced between its first and last."""
        first, last = self.run_durations_s(batch)
        return RunCost(first, last, batch.num_steps, self._flag, self._lm_flag, 0.0, self._outside)

    def step_time(self, batch: Batch) -> StepCost:
        """Per-operator seconds summed over stages (the work), scaled so that they add up to
        the pipelined rounds' length."""
        ops = {op: 0.0 for op in OPS}
        for s, stage in enumerate(self.stages):
            c = stage.step_time(batch if s == self.pp - 1 else replace_logits(batch))
            for op, v in c.ops_s.items():
                ops[op] = ops.get(op, 0.0) + v
        first, last = self.run_durations_s(batch)
        total = batch.num_steps * (first + last) / 2.0
        work = sum(ops.values())
        return StepCost({op: v * total / work for op, v in ops.items()} if work else ops)

    def prefill_alone_s(self, tokens: int, context_tokens: int, completing: bool) -> float:
        """A prompt chunk alone goes through every stage in turn: the sum, plus the sends."""
        t = sum(s.prefill_alone_s(tokens, context_tokens, completing and i == self.pp - 1)
                for i, s in enumerate(self.stages))
        if self._uniform:
            return t + (self.pp - 1) * self.send_s(tokens)
        return t + sum(self.send_s(tokens, s) for s in range(self.pp - 1))


def replace_logits(b: Batch) -> Batch:
    """``b`` as a stage before the last sees it: no LM head, no sampling."""
    return Batch(b.num_decode_seqs, b.decode_context_tokens, b.prefill_chunks, 0, b.num_steps)
