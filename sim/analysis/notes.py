"""Modelling notes: the ``NOTE:`` comments of the modules a run used, those that apply to it.

Why: every modelling assumption is marked ``NOTE:`` in the code (ARCHITECTURE.md section 7); the
report lists the ones that apply to the runs it shows, straight from the source, so the list
cannot drift from the code. A note about a feature the runs do not use (pipeline stages, a
router, a timestamp grid the trace does not have) is left out: ``CONDITIONS`` names, by a phrase
of the note, what must hold of at least one run; a phrase that matches no note is an error
(tests/test_report_readability.py), so a reworded note cannot silently lose its condition. The
text users read is prose: file paths, ``code`` markup and code lines are taken out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from sim.policies import get_policy

# Modules every run uses; each policy's spec names the modules its runs add.
ALWAYS = ("sim.spec.memory", "sim.core.kv", "sim.policies.base", "sim.cost.roofline", "sim.cost.calibration", "sim.engine.cluster",
          "sim.engine.router", "sim.core.ttft", "sim.workload.synthetic", "sim.workload.trace")

_NOTE = re.compile(r"NOTE:\s*(.+)")
_DOCSTRING_END = '"""'


@dataclass(frozen=True)
class RunFacts:
    """What a run used, as far as the notes' conditions ask (from its resolved scenario, and its
    requests' arrival times for the timestamp grid)."""

    policy: str = "continuous"
    replicas: int = 1
    router: str = "round_robin"
    pipeline_parallel: int = 1
    prefix_caching: bool = True
    sliding_window: bool = False
    multi_step: bool = False
    swap: bool = False
    no_evict: bool = False
    quantized: bool = False
    moe: bool = False
    mha: bool = False
    calibrated: bool = True
    trt_llm_kernels: bool = False   # a profile whose kernels re-read KV per query head, or a backend named
    partial_prefills: bool = False
    timestamp_grid: bool = False    # arrivals on a grid (many at the same instant), not spread


def _any(test: Callable[[RunFacts], bool]) -> Callable[[list[RunFacts]], bool]:
    return lambda facts: any(test(f) for f in facts)


def _never(_facts: list[RunFacts]) -> bool:
    return False


# (module, phrase of the note) -> when the note applies (default: always). "Never": a remark on
# the code itself or on input parsing, not an assumption that shapes a run's figures.
CONDITIONS: dict[tuple[str, str], Callable[[list[RunFacts]], bool]] = {
    ("spec.memory", "a pipeline stage is assumed to hold"): _any(lambda f: f.pipeline_parallel > 1),
    ("spec.memory", "under pipeline parallelism a stage's share"): _any(lambda f: f.pipeline_parallel > 1),
    ("core.kv", "a request's own blocks past its shared prefix"): _any(lambda f: f.prefix_caching),
    ("core.kv", "a sliding group is charged"): _any(lambda f: f.sliding_window),
    ("core.kv", "with no full-attention group"): _any(lambda f: f.sliding_window),
    ("core.kv", "V1 would not have popped them"): _never,                  # a fragment: "them" are in the code
    ("policies.base", "where KV for the whole block is short"): _any(lambda f: f.multi_step),
    ("policies.base", "prefix-cache hits are not discounted"): _any(lambda f: f.no_evict),
    # only where a replica's KV cache holds fewer tokens than max_model_len (an engine vLLM
    # refuses to start), which the run's facts (its resolved scenario) do not carry
    ("policies.base", "vLLM refuses to start an engine whose KV cache"): _never,
    ("cost.roofline", "applied per kernel to operators without"): _never,   # a fragment: "applied" to what?
    ("cost.roofline", "fp8/int8 GEMM kernels are assumed"): _any(lambda f: f.quantized),
    ("cost.roofline", "the model is pure"): _never,                          # about the code, not the model
    ("cost.roofline", "re-reads are charged at HBM bandwidth"): _any(lambda f: f.trt_llm_kernels),
    ("cost.roofline", "the quantized kernel is assumed"): _any(lambda f: f.quantized),
    ("cost.roofline", "an MoE expert GEMM"): _any(lambda f: f.moe),
    ("cost.roofline", "the vocabulary-wide LM-head GEMM"): _any(lambda f: f.calibrated),
    ("cost.calibration", "an MHA model"): _any(lambda f: f.calibrated and f.mha),
    ("cost.calibration", "fit is no longer read by the cost model"): _never,  # the code's history
    ("cost.calibration", "vidur profiled elementwise kernels"): _any(lambda f: f.calibrated),
    ("engine.cluster", "PCIe swap copies are serialised"): _any(lambda f: f.swap),
    ("engine.router", "blocks reserved for a running fast-forwarded"): _any(lambda f: f.replicas > 1 and f.router == "least_kv"),
    ("engine.router", "it reads the engines' true caches"):
        _any(lambda f: f.replicas > 1 and f.router == "prefix_affinity"),
    ("engine.router", "SGLang evicts to"): _any(lambda f: f.replicas > 1 and f.router == "cache_aware"),
    ("engine.router", "the tree is the router's own approximation"):
        _any(lambda f: f.replicas > 1 and f.router == "cache_aware"),
    ("workload.trace", "a first line with no comma"): _never,              # how a file is read, not a model
    ("workload.trace", "round timestamps to a ~3 s grid"): _any(lambda f: f.timestamp_grid),
    ("policies.chunked", "max_num_partial_prefills"): _any(lambda f: f.partial_prefills),
}

# source references and code taken out of the text users read
_PATH = re.compile(r"\b[\w.-]+(?:/[\w.-]+)*/(?:[\w.-]+\.(?:py|md|ya?ml|json|csv|txt)(?::\d+)?)?(?=[\s,;:)]|$)")
_CODE_PAREN = re.compile(r"\s*\((?:see )?``[^`]+``(?: for one)?\)")
_CODE = re.compile(r"\bself\.|\.py\b|\.py:\d+|\bdel |\breturn\b|``|\w\(\)")


AREAS = {"spec.memory": "memory", "core.kv": "KV cache", "policies.base": "scheduler", "cost.roofline": "step cost",
         "cost.calibration": "step cost (measured tables)", "engine.cluster": "engine", "engine.router": "router",
         "engine.link": "KV transfer link", "core.ttft": "TTFT", "workload.synthetic": "synthetic workload",
         "workload.trace": "trace replay", "policies.disagg": "disaggregation"}


def area(module: str) -> str:
    """What part of the simulator a note's module models, in words ("core.kv" -> "KV cache")."""
    if module in AREAS:
        return AREAS[module]
    return f"{module.removeprefix('policies.')} policy" if module.startswith("policies.") else module


def _module_path(module: str):
    return resources.files("sim").joinpath(*module.split(".")[1:-1], module.split(".")[-1] + ".py")


def _note_text(lines: list[str], i: int, m: re.Match) -> str:
    """The note starting on line ``i``: it continues on the following lines of the same comment
    block, or of the same docstring up to its closing quotes; never onto code."""
    first = m.group(1).strip()
    in_comment = lines[i].lstrip().startswith("#") or "#" in lines[i][:m.start()]
    text = [first.removesuffix(_DOCSTRING_END).strip()]
    if not in_comment and first.endswith(_DOCSTRING_END):
        return text[0]
    for nxt in lines[i + 1:i + 8]:
        s = nxt.strip()
        if in_comment:
            if not s.startswith("#"):
                break
            s = s.lstrip("#").strip()
        if not s or "NOTE:" in s:
            break
        if not in_comment and _DOCSTRING_END in s:
            text.append(s.split(_DOCSTRING_END)[0].strip())
            break
        text.append(s)
    return " ".join(t for t in text if t).strip()


def _balanced(text: str) -> str:
    """A note written inside parentheses ("(NOTE: ...)") loses the closing one it does not open."""
    while text.count(")") > text.count("("):
        cut = text.rfind(")")
        text = text[:cut] + text[cut + 1:]
    return text.strip()


def readable(note: str) -> str:
    """The note as prose: file paths and parenthesised code names out, ``x`` -> x
    ("(875/989 TFLOP/s, kernels_profile/hardware.md)" -> "(875/989 TFLOP/s)")."""
    text = _CODE_PAREN.sub("", _PATH.sub("", note))
    text = re.sub(r"[,;]\s*\)", ")", text)
    text = re.sub(r"\(\s*[,;]?\s*\)", "", text)
    text = re.sub(r"\s+([,;.)])", r"\1", text.replace("``", ""))
    return re.sub(r"\s{2,}", " ", text).strip()


def is_code_free(text: str) -> bool:
    """No file path or file:line reference, no ``code`` markup, no code statement."""
    return not _CODE.search(text) and not _PATH.search(text)


def _module_notes(module: str) -> list[str]:
    path = _module_path(module)
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    notes = []
    for i, line in enumerate(lines):
        m = _NOTE.search(line)
        if m:
            notes.append(_balanced(_note_text(lines, i, m)))
    return notes


def _modules(policies: list[str]) -> list[str]:
    mods: list[str] = list(ALWAYS)
    for p in policies:
        for m in get_policy(p).note_modules:
            if m not in mods:
                mods.append(m)
    return mods


def _condition(module: str, note: str) -> Callable[[list[RunFacts]], bool] | None:
    for (mod, phrase), test in CONDITIONS.items():
        if mod == module and phrase in note:
            return test
    return None


def notes_for(policies: list[str], facts: list[RunFacts] | None = None) -> list[tuple[str, str]]:
    """(module, note) pairs for runs of these policies, each once, in a stable order; with
    ``facts``, only the notes that apply to at least one of those runs, as prose."""
    out, seen = [], set()
    for m in _modules(policies):
        short = m.removeprefix("sim.")
        for n in _module_notes(m):
            if n in seen:
                continue
            seen.add(n)
            test = _condition(short, n)
            if facts is not None and test is not None and not test(facts):
                continue
            text = readable(n)
            if facts is not None and not is_code_free(text):
                continue
            out.append((short, text))
    return out


def unmatched_conditions() -> list[tuple[str, str]]:
    """Condition phrases that match no note of their module (a note reworded or removed)."""
    missing = []
    for mod, phrase in CONDITIONS:
        if not any(phrase in n for n in _module_notes("sim." + mod)):
            missing.append((mod, phrase))
    return missing


def run_facts(scenario: dict, arrival_s=None) -> RunFacts:
    """A run's facts from its resolved scenario (``scenario.resolved.yaml`` as a dict) and its
    requests' arrival times (for the timestamp grid); the model is looked up for its
    attention and MoE layout (an unknown model: those notes are kept)."""
    engine, cluster = scenario.get("engine") or {}, scenario.get("cluster") or {}
    hardware, workload = scenario.get("hardware") or {}, scenario.get("workload") or {}
    model = _model(scenario)
    overhead = engine.get("overhead") or {}
    ref = scenario.get("model")
    quant = engine.get("quantization") or (ref.get("quantization") if isinstance(ref, dict) else None)
    return RunFacts(
        policy=str(engine.get("policy", "continuous")),
        replicas=int(cluster.get("replicas", 1)) + (1 if scenario.get("disaggregation") else 0),
        router=str(cluster.get("router", "round_robin")),
        pipeline_parallel=int(cluster.get("pipeline_parallel_size", 1)),
        prefix_caching=bool(engine.get("enable_prefix_caching", True)),
        sliding_window=model is None or bool(model.sliding_window and model.num_sliding_layers),
        multi_step=int(engine.get("num_scheduler_steps", 1)) > 1,
        swap=engine.get("preemption_mode") == "swap",
        no_evict=engine.get("capacity_scheduler_policy") == "guaranteed_no_evict",
        quantized=bool(quant) or (model is not None and bool(getattr(model, "quantization", None))),
        moe=model is None or model.num_experts > 1,
        mha=model is None or model.num_kv_heads == model.num_heads,
        calibrated=hardware.get("cost_model", "calibrated") == "calibrated",
        trt_llm_kernels=engine.get("profile") in ("trt-llm", "trt-llm-2023", "vllm-v0.2") or bool(engine.get("attention_backend")
                                                                    or overhead.get("attention_backend")),
        partial_prefills=int(engine.get("max_num_partial_prefills", 0)) > 0,
        timestamp_grid=bool(workload.get("trace")) and not (workload.get("trace") or {}).get("spread_grid_s")
        and _on_grid(arrival_s),
    )


def _model(scenario: dict):
    from sim.errors import UserError
    from sim.spec.models import get_model

    try:
        return get_model(scenario.get("model", "llama-3-8b"), Path(scenario.get("base_dir", ".")))
    except (UserError, OSError, ValueError, KeyError, TypeError):
        return None


def _on_grid(arrival_s) -> bool:
    """Arrivals with a timestamp grid (``trace inspect``'s test); unknown arrivals: True (keep the note)."""
    if arrival_s is None:
        return True
    import numpy as np

    from sim.workload.inspect import timestamp_grid

    t = np.sort(np.asarray(arrival_s, dtype=float))
    return len(t) > 1 and timestamp_grid(t - t[0], np.diff(t))["timestamp_grid_s"] is not None
