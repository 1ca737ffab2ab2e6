"""Step cost of one rank of a data-parallel group whose MoE layers span every rank.

Why: vLLM ``--data-parallel-size D --enable-expert-parallel`` runs D engine cores, each with
attention (and dense layers, shared experts) at its own TP over its own batch, while every MoE
layer's routed experts are spread over all D x TP GPUs (EP size = DP x TP,
``FusedMoEParallelConfig``). A rank's step therefore costs:

- its own batch through everything but the routed experts (as ``RooflineCostModel``);
- the routed experts of the whole group's tokens: each GPU holds E/ep experts and runs
  ``expert_load_imbalance`` x the mean share k x G / ep of the G group tokens' routed copies
  (``moe_mlp_s`` with ``routed_tokens``); the group sets G before costing each rank's batch
  (``group_run_cost``); a batch costed alone (``explain``, the TTFT decomposition) takes every
  rank as carrying the same tokens (G = D x its own);
- the all-to-all dispatch and combine of its own tokens in every MoE layer
  (sim/cost/all2all.py; the busiest GPU receives ``expert_load_imbalance`` x the mean),
  reported under the ``allreduce`` operator class (communication).
  With TP > 1 per rank each GPU dispatches ceil(T / TP) of the rank's T tokens (vLLM
  ``ParallelConfig.use_sequence_parallel_moe``: dp > 1, tp > 1, EP with DeepEP / pplx).

With CUDA graphs on (the engine profile's ``cuda_graph_decode``; vLLM without
``--enforce-eager``) every rank pads its step to the most tokens any rank runs in the round
(vLLM ``GPUModelRunner.get_dp_padding``: the max over DP ranks, applied to the step's input
tokens and to the dummy batch): the padding rows pass the GEMMs, elementwise kernels,
collectives and the experts (``group_run_cost``'s ``pad_tokens``), not attention or sampling.

NOTE: the rank's two TP all-reduces per layer are kept as without DP (under sequence-parallel
MoE vLLM replaces the MoE layer's by an all-gather of the token shards).
"""

from __future__ import annotations

import math

from sim.core.batch import Batch
from sim.cost.all2all import All2AllLinks, all2all_layer_bytes, all2all_layer_s
from sim.cost.arch import moe_mlp_s
from sim.cost.calibration import Calibration
from sim.cost.engine_profile import EngineProfile
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.spec.hardware import GPUSpec
from sim.spec.model_spec import ModelSpec
from sim.spec.nodes import NodeLinks
from sim.cost.runs import RunCost

_MAX_GROUP_CACHES = 4096  # distinct group token counts whose GEMM costs are kept


class DataParallelEPCostModel(RooflineCostModel):
    """One engine core (``tp`` GPUs) of a group of ``dp`` whose routed experts span all of them."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, kv_dtype_bytes: int | None = None,
                 eff: Efficiencies | None = None, weight_dtype_bytes: int | None = None,
                 calibration: Calibration | None = None, engine: EngineProfile | None = None,
                 expert_load_imbalance: float = 1.0, *, dp: int, links: All2AllLinks,
                 nodes: NodeLinks | None = None):
        # RooflineCostModel's arguments written out (mypyc, sim/compiled_core.py, miscompiles a
        # super().__init__(*args, ..., **kwargs) forward)
        super().__init__(model, gpu, tp, kv_dtype_bytes, eff, weight_dtype_bytes, calibration, engine,
                         enable_expert_parallel=True, expert_load_imbalance=expert_load_imbalance, dp=dp,
                         nodes=nodes)
        self.dp, self.links = dp, links
        # vLLM dispatches in fp8 when the MoE runs fp8 W8A8 (its DeepEP prepare step quantizes
        # the input, DEEPEP_QUANT_BLOCK_SHAPE); else in the activation dtype
        self.fp8_dispatch = self.quant is not None and self.quant.compute == "fp8"
        # vLLM pads every rank to the round's most tokens unless it runs eager (get_dp_padding)
        self.pads_to_max = self.engine.cuda_graph_decode
        self._group_tokens: int | None = None
        self._pad_tokens = 0
        # every memo that holds the GEMMs or the padded per-token terms depends on the group's
        # tokens and padding: one set of them per (group tokens, pad tokens)
        self._group_caches: dict[tuple[int | None, int], tuple[dict, ...]] = {(None, 0): self._memos()}

    def _memos(self) -> tuple[dict, ...]:
        return self._gemm_cache, self._token_cache, self._fixed_cache, self._run_fns, self._step_cache

    def _set_group(self, group_tokens: int | None, pad_tokens: int = 0) -> None:
        key = (group_tokens, pad_tokens)
        if key not in self._group_caches and len(self._group_caches) > _MAX_GROUP_CACHES:
            self._group_caches = {(None, 0): self._group_caches[(None, 0)]}
        self._group_tokens, self._pad_tokens = group_tokens, pad_tokens
        memos = self._group_caches.get(key)
        if memos is None:
            memos = self._group_caches[key] = ({}, {}, {}, {}, {})
        self._gemm_cache, self._token_cache, self._fixed_cache, self._run_fns, self._step_cache = memos

    def _gemms(self, tokens: int) -> tuple[float, float, float, float]:
        return super()._gemms(max(tokens, self._pad_tokens))

    def _moe_layer_s(self, tokens: int) -> tuple[float, float]:
        g = self._group_tokens if self._group_tokens is not None else tokens * self.dp
        return moe_mlp_s(self, tokens, routed_tokens=g)

    def all2all_layer_bytes(self, tokens: int) -> tuple[float, float, float, float]:
        """(dispatch intra-node, dispatch inter-node, combine intra-node, combine inter-node)
        bytes one GPU sends per MoE layer for a rank batch of ``tokens`` (ceil(tokens / tp) per GPU)."""
        m = self.model
        return all2all_layer_bytes(math.ceil(tokens / self.tp), m.hidden_size, m.num_experts_per_tok, self.ep,
                                   self.links.gpus_per_node, self.fp8_dispatch, self.dtype_bytes)

    def all2all_layer_s(self, tokens: int) -> float:
        """Dispatch + combine seconds of one MoE layer for a rank batch of ``tokens``."""
        m = self.model
        per_gpu = math.ceil(tokens / self.tp)
        return all2all_layer_s(per_gpu, m.hidden_size, m.num_experts_per_tok, self.ep, self.links,
                               self.fp8_dispatch, self.dtype_bytes, self.expert_load_imbalance)

    def _per_tokens(self, tokens: int) -> tuple[float, float, bool]:
        tokens = max(tokens, self._pad_tokens)
        elem, ar, flag = super()._per_tokens(tokens)
        return elem, ar + self.model.num_moe_layers * self.all2all_layer_s(tokens), flag

    def group_run_cost(self, batch: Batch, group_tokens: int, pad_tokens: int = 0) -> RunCost:
        """``run_cost`` of this rank's ``batch`` while the group's ranks carry ``group_tokens``
        tokens in all (this rank's included), the batch padded to ``pad_tokens`` rows."""
        self._set_group(group_tokens, pad_tokens)
        try:
            return self.run_cost(batch)
        finally:
            self._set_group(None)
