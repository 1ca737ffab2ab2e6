"""Calibrated operator times of one model on one GPU: ``roofline_bound / efficiency(shape)``.

Why: ``RooflineCostModel`` stays the first-principles model; when a calibration exists for
the GPU, this object replaces each calibrated operator's constant efficiency by the measured
efficiency at the step's shape (tables in ``sim/cost/calibration.py``). Everything a model
fixes (its layer widths, its per-GPU heads, the table to use) is chosen once here, so the
per-step path is a few bisections. Shapes outside the measured range take the nearest
measured efficiency and are flagged; the cost model counts such steps.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

from sim.cost.calibration import Calibration, GemmEff, ops_inside_attention
from sim.cost.decode_attention import DecodeAttention, decode_work
from sim.cost.shapes import ELEM_BYTES_PER_WIDTH, custom_allreduce_link_bytes, fa2_split_kv
from sim.cost.tables import Axis, Curve, Grid2, bracket


class CalibratedOps:
    def __init__(self, cal: Calibration, *, linear_shapes: dict, elem_donor: Calibration | None = None, fp8: bool = False,
                 nvfp4: bool = False, fp8_kernel: str = "cutlass",
                 heads: float, kv_heads: float, head_dim: int,
                 hidden: int, q_dim: float, kv_dim: float, mlp_dim: float, num_layers: int, tp: int,
                 dtype_bytes: int, peak_flops_per_s: float, hbm_bw_bytes_per_s: float, link_bw_bytes_per_s: float,
                 fp8_peak_flops_per_s: float = 0.0, fp4_peak_flops_per_s: float = 0.0,
                 decode_kv_heads: float | None = None, attn_tables: str = "", kv_8bit: bool = False,
                 fp8_context: bool = False):
        self.cal = cal
        self.peak, self.bw, self.link = peak_flops_per_s, hbm_bw_bytes_per_s, link_bw_bytes_per_s
        self.L, self.tp, self.dtype_bytes, self.hidden = num_layers, tp, dtype_bytes, hidden
        # (typed: compiled, sim/compiled_core.py, ``linear_s`` reads them natively)
        self.gemm_curves: dict[str, tuple[GemmEff, bool]] | None = None
        if cal.gemm is not None:
            # (out, in) of the cost model's (in, out): the table is x[m,k] @ W[k,n].
            self.gemm_curves = {name: cal.gemm.eff_fn(fout, fin) for name, (fin, fout) in linear_shapes.items()}
        self.fp8_curves = None
        # the fp8 table as the engine's FP8 GEMM kernel runs it (``fp8_kernel``: the engine
        # profile's ``fp8_gemm``; sim/cost/calibration.py ``Calibration.fp8_table``)
        fp8_table = cal.fp8_table(fp8_kernel) if fp8 else None
        if fp8_table is not None:  # the model's GEMMs run in fp8 (curves: start-up)
            # the bound at this GPU's own FP8 peak (capped, or a sibling's table inherited:
            # sim/cost/calibration.py ``inherited_calibration``); the table's axis keeps the
            # measured GPU's peaks, so the efficiency at a shape is the one measured there
            self.fp8_peak = fp8_peak_flops_per_s
            self.fp8_curves = {name: fp8_table.eff_fn(fout, fin) for name, (fin, fout) in linear_shapes.items()}
        self.nvfp4_curves = None
        if nvfp4 and cal.gemm_nvfp4 is not None:  # NVFP4 W4A4 GEMMs on their own measured table
            self.fp4_peak = fp4_peak_flops_per_s  # this GPU's own FP4 peak (as fp8 above)
            self.nvfp4_curves = {name: cal.gemm_nvfp4.eff_fn(fout, fin) for name, (fin, fout) in linear_shapes.items()}
        self.heads, self.kv_heads = heads, kv_heads
        # The attention tables of the engine's kernels (``attn_tables``: the backend's ``tables``,
        # sim/catalog/attention_backends.yaml): the engine's own, measured where it ran them
        # (TensorRT-LLM's context FMHA and XQA), on a GPU that has them; else the GPU's main
        # tables (vLLM's kernels). ``kv_8bit``: an 8-bit KV cache (its own decode table where
        # measured); ``fp8_context``: FP8 context FMHA (its own prefill table, at the FP8 peak).
        pre, prefill_op, dec, decode_op = cal.engine_attention(attn_tables, kv_8bit, fp8_context)
        self.prefill_op: str = prefill_op
        self.decode_op: str = decode_op
        # whether the decode table measured the 8-bit cache itself (looked up at the context, not
        # at the context of equal bytes in 16 bits), and the prefill table's FP8 context FMHA
        self.decode_8bit_table: bool = decode_op.endswith("_fp8kv")
        self.prefill_fp8: bool = prefill_op.endswith("_fp8")
        # FA2's split-KV combine kernel: a term of the main table's kernel (vLLM's FA2) only
        self.decode_split = cal.decode_split if self.decode_op == "attn_decode" else None
        self._split_cache: dict[tuple[int, int], bool] = {}
        self.prefill_grid: tuple[Grid2, tuple[int, int], float] | None = (
            pre.pick(heads, kv_heads) if pre else None)
        # the decode kernel's own shape (``decode_kv_heads``: the KV heads its tiles see; a kernel
        # of one block per (sequence, query head) is MHA-shaped whatever the model's KV heads,
        # sim/cost/attention_backend.py ``decode_tile_kv_heads``)
        dkv = kv_heads if decode_kv_heads is None else decode_kv_heads
        self.decode_grid = dec.pick(heads, dkv) if dec else None
        # decode_smooth_end's table nodes, and whether FA2 may split (grouped-query decode only)
        # (typed: compiled, sim/compiled_core.py, decode_smooth_end's arithmetic is native)
        self._decode_nodes: list[float] = self.decode_grid[0].b_nodes if self.decode_grid else []
        self._gqa_split = bool(self.decode_split) and heads > dkv
        self.allreduce_curve = cal.allreduce_curve(tp) if (cal.allreduce and tp > 1) else None
        # vLLM's custom all-reduce (small buffers, sim/cost/fit.py ``uses_custom_allreduce``)
        self.custom_curve = cal.allreduce_curve(tp, custom=True) if (cal.custom_allreduce and tp > 1) else None
        # Elementwise ops per layer as (table kind, row width): 2 norms, 2 residual adds, rotary
        # on q and k, the gated activation (widths per GPU); the KV-cache write and the
        # embedding lookup move like a norm (read a row, write a row). Ops the attention tables
        # in use already time (``ops_inside_attention``: TensorRT-LLM's attention op rotates q
        # and k and appends K/V to the cache; FlashInfer's writes K/V) are not charged again.
        self.fused_ops: frozenset[str] = ops_inside_attention(attn_tables, prefill_op, decode_op)
        self.elem_ops: tuple[tuple[Curve, float], ...] = ()
        # A GPU without elementwise measurements carries the donor's curves by the bandwidth
        # ratio: a kernel of B bytes here takes what the donor's kernel of B * bw_donor / bw
        # bytes takes (equal roofline bound), so the launch-latency floor stays the measured
        # one and the streaming regime scales with bandwidth.
        self.elem_scale = 1.0
        self.embed: tuple[Curve, int] | None = None  # (the embedding lookup's curve and bytes per token)
        src = cal
        if not cal.elementwise and elem_donor is not None and elem_donor.elementwise:
            src = elem_donor
            self.elem_scale = elem_donor.raw["peaks"]["hbm_bw_bytes_per_s"] / hbm_bw_bytes_per_s
        if src.elementwise:
            kinds = src.elementwise
            act = "act_gated" if "act_gated" in kinds else "act"
            # (name, table kind, width)
            ops = [("norm", "norm", hidden), ("norm", "norm", hidden), ("add", "add", hidden),
                   ("add", "add", hidden), ("rope", "rope", q_dim + kv_dim), ("act", act, mlp_dim),
                   ("kv_write", "norm", kv_dim)]
            self.elem_ops = tuple((kinds[k], ELEM_BYTES_PER_WIDTH[k] * w) for name, k, w in ops
                                  if k in kinds and name not in self.fused_ops)
            self.embed = (kinds["norm"], ELEM_BYTES_PER_WIDTH["norm"] * hidden) if "norm" in kinds else None

    # -- per token count (the caller caches these) ----------------------------------------------
    def linear_s(self, name: str, tokens: float, flops: float, bytes_: float) -> tuple[float, bool]:
        """The roofline bound max(FLOPs / peak, bytes / bandwidth) over the efficiency measured
        at this weight shape and token count against that bound (<= 1, the wave term
        included: ``GemmEff``), so no GEMM, dense or an MoE layer's experts, beats its bound."""
        curves = self.gemm_curves
        assert curves is not None  # (the cost model calls this only with GEMM tables)
        g, out = curves[name]
        e, out_m = g.eff(tokens)
        b = flops / self.peak
        m = bytes_ / self.bw
        return (b if b > m else m) / e, out or out_m

    def linear_fp8_s(self, name: str, tokens: float, flops: float, bytes_: float) -> tuple[float, bool]:
        """An fp8 W8A8 GEMM: its own raw bound (FP8 peak, 1-byte inputs) over the efficiency
        measured for fp8 GEMMs at this weight shape and token count."""
        g, out = self.fp8_curves[name]
        e, out_m = g.eff(tokens)
        return max(flops / self.fp8_peak, bytes_ / self.bw) / e, out or out_m

    def linear_nvfp4_s(self, name: str, tokens: float, flops: float, bytes_: float) -> tuple[float, bool]:
        """An NVFP4 W4A4 GEMM: its own raw bound (FP4 peak, 4.5-bit inputs) over the efficiency
        measured for NVFP4 GEMMs at this weight shape and token count."""
        g, out = self.nvfp4_curves[name]
        e, out_m = g.eff(tokens)
        return max(flops / self.fp4_peak, bytes_ / self.bw) / e, out or out_m

    def elementwise_s(self, tokens: int) -> tuple[float, bool]:
        """All layers' elementwise ops and the embedding: bytes / bandwidth / eff(bytes). No
        tokens move no bytes: 0 s (the limit of bytes / bw / eff, eff clamped below the table)."""
        if tokens <= 0:
            return 0.0, False
        total, flag = 0.0, False
        for curve, per_token_bytes in self.elem_ops:
            t, out = self._elementwise_kernel_s(curve, per_token_bytes * tokens)
            total += t
            flag |= out
        total *= self.L
        embed = self.embed
        if embed is not None:
            t, out = self._elementwise_kernel_s(embed[0], float(embed[1] * tokens))
            total += t
            flag |= out
        return total, flag

    def _elementwise_kernel_s(self, curve: Curve, nbytes: float) -> tuple[float, bool]:
        """One elementwise kernel moving ``nbytes`` here: ``nbytes / bw / eff``, its efficiency
        looked up at the donor's equivalent size. Below the smallest kernel measured the time is
        that kernel's measured time, not less: a kernel that small is latency bound (launch,
        one wave of thread blocks, the write-back; its measured time was already flat in size
        there: H100 RMSNorm 6 us at 10 KB), so fewer bytes do not make it faster, and the
        floor is measured, not an extrapolation."""
        sc = self.elem_scale
        # the donor's kernel of equal roofline bound (nbytes * sc bytes at its bandwidth)
        t, out = self._donor_kernel_s(curve, nbytes * sc)
        if sc < 1.0:
            # A GPU with more bandwidth than the donor is not slower than the donor's kernel of the
            # same bytes (its SMs and launch path are assumed the donor's, as above). The
            # measured curves are not monotone at the smallest sizes (H100 RMSNorm 6.0 us at
            # 10 KB, 4.0 us at 16 KB, vidur), and the equal-bound lookup at fewer bytes could take
            # the slower point: H200 priced Llama-3-8B's batch-1 elementwise kernels at 0.814 ms
            # per step against H100's measured 0.722 ms (issue 37).
            td, out_d = self._donor_kernel_s(curve, nbytes)
            if t > td:
                return td, out_d
        return t, out

    def _donor_kernel_s(self, curve: Curve, donor_bytes: float) -> tuple[float, bool]:
        """The donor's measured kernel moving ``donor_bytes``, in seconds at the donor's
        bandwidth (``bw * elem_scale``), and whether the size lies outside the measured ones.
        Below the smallest kernel measured: that kernel's time (``_elementwise_kernel_s``)."""
        bw_donor = self.bw * self.elem_scale
        x0 = math.exp(curve.lx[0])  # the smallest measured size (a plain log axis: u = log x)
        if donor_bytes < x0:
            e0, _ = curve.eff(x0)
            return x0 / bw_donor / e0, False
        e, out = curve.eff(donor_bytes)
        return donor_bytes / bw_donor / e, out

    def allreduce_s(self, tokens: int, custom: bool = False) -> tuple[float, bool]:
        """Two all-reduces of T x hidden per layer, measured eff: NCCL's ring (Patarasuk & Yuan
        2009), or with ``custom`` vLLM's one-/two-shot custom kernel (``custom_allreduce_link_bytes``).
        No tokens: nothing to reduce, 0 s."""
        if tokens <= 0:
            return 0.0, False
        size = tokens * self.hidden * self.dtype_bytes
        # (the curves narrowed: compiled, sim/compiled_core.py, native calls; the cost model asks
        # only where the table was measured)
        if custom:
            cc = self.custom_curve
            assert cc is not None
            e, out = cc.eff(size)
            return 2 * self.L * float(custom_allreduce_link_bytes(self.tp, size)) / self.link / e, out
        ac = self.allreduce_curve
        assert ac is not None
        e, out = ac.eff(size)
        return 2 * self.L * (2.0 * (self.tp - 1) / self.tp * size / self.link) / e, out

    # -- attention ----------------------------------------------------------------------------
    def prefill_eff(self, num_chunks: int, equivalent_tokens: float) -> tuple[float, bool]:
        """At the table's batch of equal work (``HeadTables.pick``: batch x KV heads tiles)."""
        pg = self.prefill_grid
        assert pg is not None  # (typed: compiled, sim/compiled_core.py, the calls and arithmetic are native)
        grid, _, scale = pg
        return grid.eff(num_chunks * scale, equivalent_tokens if equivalent_tokens > 1.0 else 1.0)

    def _decode_cell(self, num_seqs: float, k: int) -> tuple[float, float, bool] | bool:
        """(a, b, batch outside the table): log eff = a + b u in cell k of the decode table
        (k = -1 below its first context, len - 1 at or beyond its last: clamped, b = 0)."""
        grid = self.decode_grid[0]
        i, wa, oa = bracket(grid.la, math.log(num_seqs))
        rows = [(grid.rows[i], 1.0)] if wa == 0.0 or len(grid.rows) == 1 else \
            [(grid.rows[i], 1.0 - wa), (grid.rows[i + 1], wa)]
        a = b = 0.0
        for r, w in rows:
            if r.m is not None:
                return False
            lx, ly = r.lx, r.ly
            if k < 0 or len(ly) == 1:
                ra, rb = ly[0], 0.0
            elif k >= len(ly) - 1:
                ra, rb = ly[-1], 0.0
            else:
                rb = (ly[k + 1] - ly[k]) / (lx[k + 1] - lx[k])
                ra = ly[k] - rb * lx[k]
            a += w * ra
            b += w * rb
        return a, b, oa

    def _splits(self, num_seqs: int, num_blocks: int) -> bool:
        ds = self.decode_split
        key = (num_seqs, num_blocks)
        hit = self._split_cache.get(key)
        if hit is None:
            hit = self._split_cache[key] = fa2_split_kv(num_seqs, self.heads, self.kv_heads, num_blocks * ds["block"],
                                                        ds["sms"], ds["block"])
        return hit

    def decode_smooth_end(self, num_seqs: int, ctx_first: float, ctx_last: float, kv_scale: float) -> float:
        """The largest context per sequence in [``ctx_first``, ``ctx_last``] up to which decode
        attention is one smooth piece from ``ctx_first``: no node of the efficiency table
        (looked up at ``kv_scale`` x the context) and no change of FA2's split decision (a KV
        block boundary where the combine kernel starts or stops) lies before it."""
        end = ctx_last
        nodes = self._decode_nodes
        m = bisect_right(nodes, ctx_first * kv_scale)
        if m < len(nodes):
            bound = nodes[m] / kv_scale
            if bound < end:  # min(end, bound), written out (compiled: native)
                end = bound
        if self._gqa_split:
            block: float = self.decode_split["block"]
            nb = math.ceil((ctx_first if ctx_first > 1.0 else 1.0) / block)  # max(1.0, ctx_first): native
            split = self._splits(num_seqs, nb)
            while nb * block < end:
                nb += 1
                if self._splits(num_seqs, nb) != split:
                    end = (nb - 1) * block
                    break
        return end

    def describe(self) -> dict:
        d: dict[str, list | None] = {
            "attn_prefill_heads_table": list(self.prefill_grid[1]) if self.prefill_grid else None,
            "attn_decode_heads_table": list(self.decode_grid[1]) if self.decode_grid else None,
        }
        if self.prefill_op != "attn_prefill" or self.decode_op != "attn_decode":  # an engine's own tables
            d["attn_tables"] = [self.prefill_op, self.decode_op]
        return d


class CalibratedDecodeAttention(DecodeAttention):
    """Decode attention of ``num_seqs`` sequences as a function of their total context:
    context_tokens -> (seconds over ``num_layers`` layers, outside the table). Per layer: the
    raw bound max(FLOPs / peak, bytes / bandwidth) over the efficiency measured at this batch
    size and the context per sequence (looked up at ``kv_scale`` times it: equal bytes), plus
    FA2's split-KV combine kernel when the step splits (the calibration's ``split_kv``; NOTE:
    the mean context stands for FA2's max_seqlen_k, which sets the number of KV blocks).
    ``window``: the context that sliding-window layers read (sim/cost/arch.py).

    The efficiency is ``Grid2.eff`` of the decode table in closed form per table cell: between
    two measured contexts log(efficiency) is linear in the axis coordinate u (piecewise-linear
    rows, blended linearly in log batch), so a cell is two numbers (``CalibratedOps._decode_cell``),
    and a step costs one log and one exp; a cubic row has no closed form and goes through
    ``Grid2.eff``. NOTE: this runs for every decode step costed (several times per run), with
    two exact shortcuts: the cell of the last call is kept with its bounds (nodes[k] <= x <
    nodes[k + 1] is what ``bisect_right(nodes, x) - 1 == k`` means), and so is the last
    KV-block count nb with its bounds (nb - 1 < q <= nb is what ``ceil(q) == nb`` means): the
    steps of a run lie in one cell (``decode_smooth_end`` cuts runs there) and mostly in one
    block count. (Typed, and math.exp, math.log and math.ceil called by name: compiled,
    sim/compiled_core.py, ``at`` is arithmetic on native floats and calls of the C functions.)"""

    def __init__(self, ops: CalibratedOps, num_seqs: int, *, num_layers: int, flops_per_token: float,
                 kv_bytes: float, kv_reads: float, q_bytes: float, kv_scale: float,
                 window: Callable[[float], float] | None = None) -> None:
        decode_grid = ops.decode_grid
        assert decode_grid is not None  # (the cost model builds this only with a decode table)
        self.ops = ops
        self.n = num_seqs
        self.L, self.peak, self.bw = num_layers, ops.peak, ops.bw
        self.flops_per_token, self.kv_bytes, self.kv_reads, self.q_bytes = flops_per_token, kv_bytes, kv_reads, q_bytes
        self.kv_scale = kv_scale
        self.window = window
        self.grid: Grid2 = decode_grid[0]
        self.n_eq = num_seqs * decode_grid[2]  # the table's batch of equal work (HeadTables.pick)
        self.nodes: list[float] = self.grid.b_nodes
        self.first, self.last = self.nodes[0], self.nodes[-1]
        self.axis: Axis = self.grid.rows[0].axis
        # the decode table's axis is log(a x + shift) (no max, no r term): written out in
        # ``at``, the same operations as ``Axis.u`` without its call
        self.plain = not (self.axis.c or self.axis.r)
        self.ua, self.ushift = self.axis.a, self.axis.shift
        self.cells: dict[int, tuple[float, float, bool] | bool] = {}  # _decode_cell by cell index
        ds = ops.decode_split
        self.split = bool(ds)
        self.combine_s: float = ds["combine_s"] if ds else 0.0
        self.block: float = ds["block"] if ds else 1.0
        # the last cell: x in [lo, hi) has log eff = ca + cb u(x) (``_decode_cell``); empty at first
        self.lo = self.hi = 0.0
        self.ca = self.cb = 0.0
        self.cout = False
        # the last KV-block count: q = ctx / block in (qlo, qhi] takes ``comb`` seconds
        self.qlo = self.qhi = 0.0
        self.comb = 0.0

    def at(self, context_tokens: float) -> tuple[float, bool]:
        context_tokens, flops, bytes_ = decode_work(context_tokens, self.flops_per_token, self.kv_bytes,
                                                    self.kv_reads, self.q_bytes, self.window)
        ctx = context_tokens / self.n
        # the efficiency at ctx * kv_scale
        x = ctx * self.kv_scale
        if not x > 1.0:
            x = 1.0
        e: float
        out: bool
        if self.lo <= x < self.hi:
            cb = self.cb
            e = math.exp(self.ca) if not cb else math.exp(
                self.ca + cb * (math.log(self.ua * x + self.ushift) if self.plain else self.axis.u(x)))
            out = self.cout or x < self.first or x > self.last
        else:
            nodes = self.nodes
            k = bisect_right(nodes, x) - 1
            cell = self.cells.get(k)
            if cell is None:
                cell = self.cells[k] = self.ops._decode_cell(self.n_eq, k)
            if isinstance(cell, bool):  # False: a cubic row, no closed form
                e, out = self.grid.eff(self.n_eq, x)
            else:
                ca, cb, cout = cell
                self.ca, self.cb, self.cout = ca, cb, cout
                self.lo = nodes[k] if k >= 0 else -math.inf
                self.hi = nodes[k + 1] if k + 1 < len(nodes) else math.inf
                e = math.exp(ca) if not cb else math.exp(
                    ca + cb * (math.log(self.ua * x + self.ushift) if self.plain else self.axis.u(x)))
                out = cout or x < self.first or x > self.last
        # FA2's combine kernel: by KV blocks per sequence
        if self.split:
            q = (ctx if ctx > 1.0 else 1.0) / self.block
            if not self.qlo < q <= self.qhi:
                nb = math.ceil(q)
                self.qlo, self.qhi = float(nb - 1), float(nb)  # floats, as declared (the same comparisons)
                self.comb = self.combine_s if self.ops._splits(self.n, nb) else 0.0
        fb, mb = flops / self.peak, bytes_ / self.bw
        return self.L * ((mb if mb > fb else fb) / e + self.comb), out
