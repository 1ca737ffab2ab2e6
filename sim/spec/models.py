"""Model architectures: the catalogue and HuggingFace ``config.json`` reading.

Why: every cost and memory figure derives from a handful of architecture numbers; keeping them
as data (``catalog/models.yaml``, copied from each model's config.json) makes them checkable.
``sim/spec/hf_config.py`` maps each HF architecture's config keys onto ``ModelSpec`` (``sim/spec/model_spec.py``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from sim.errors import UserError
from sim.spec.hf_config import from_config
from sim.spec.model_spec import DTYPE_BYTES, ModelSpec  # noqa: F401  (re-exported: the catalogue's type)
from sim.catalog.packed import load_catalog


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    return load_catalog("models.yaml")


def get_model(ref: str | dict, base_dir: Path | None = None) -> ModelSpec:
    """A catalogue name, or ``{hf_config: path}`` to a HuggingFace config.json."""
    if isinstance(ref, dict) and not ref.get("hf_config"):
        return with_quantization(get_model(ref["name"]), ref.get("quantization"), "model.quantization")
    if isinstance(ref, dict):
        path = Path(ref["hf_config"])
        if base_dir is not None and not path.is_absolute() and not path.exists():
            path = base_dir / path  # the current directory first, then the scenario's (README)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"model.hf_config: file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{path}: a config.json is a JSON object")
        spec = from_config(ref.get("name") or path.parent.name or path.stem, cfg, str(path))
        spec = with_quantization(spec, _config_quantization(cfg, str(path)), str(path))
        return with_quantization(spec, ref.get("quantization"), "model.quantization")
    key = catalogue_key(ref)
    where = f"catalog/models.yaml:{key}"
    # a catalogue entry carries its checkpoint's quantization_config as the config.json does
    # (gpt-oss: its experts ship in MXFP4)
    return with_quantization(from_config(key, catalogue()[key], where), _config_quantization(catalogue()[key], where),
                             where)


@lru_cache(maxsize=1)
def _hf_ids() -> dict[str, str]:
    """Each catalogue entry's Hugging Face ids (``hf_ids``), lower-cased -> the entry's name; also
    each id's repository name without its organisation (``Llama-3.1-8B-Instruct``)."""
    ids = {hf.lower(): key for key, entry in catalogue().items() for hf in entry.get("hf_ids", ())}
    return {**{hf.rpartition("/")[2]: key for hf, key in ids.items()}, **ids}


def catalogue_key(ref: str) -> str:
    """The catalogue entry ``ref`` names: its own name, or one of its Hugging Face ids
    (``meta-llama/Llama-3.1-8B-Instruct``; case-insensitive, as the Hub's). Unknown: one line
    with the closest names."""
    cat = catalogue()
    if ref in cat:
        return ref
    hit = _hf_ids().get(ref.lower()) or next((k for k in cat if k.lower() == ref.lower()), None)
    if hit is not None:
        return hit
    import difflib

    names = {k.lower(): k for k in cat}
    names.update({hf.lower(): hf for entry in cat.values() for hf in entry.get("hf_ids", ())})
    close = [names[n] for n in difflib.get_close_matches(ref.lower(), list(names), n=5, cutoff=0.5)]
    hint = f"closest: {', '.join(close)}" if close else f"catalogue names: {', '.join(sorted(cat))}"
    raise UserError(f"model: unknown model {ref!r} (a catalogue name or the Hugging Face id of one, or "
                    f"{{hf_config: path/to/config.json}}); {hint}")


def _config_quantization(cfg: dict, where: str) -> str | None:
    """A checkpoint's own ``quantization_config.quant_method`` (vLLM reads it the same way,
    ``get_quant_config``): fp8, awq and gptq are modelled; another method is an error rather
    than silently costed as bf16."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    from sim.spec.quantization import METHODS

    method = str(qc.get("quant_method", "")).lower()
    if method == "modelopt":
        # ModelOptNvFp4Config.override_quantization_method (vLLM modelopt.py): "NVFP4" in
        # ``quantization.quant_algo`` (or a top-level ``quant_algo`` containing "FP4")
        inner = qc.get("quantization")
        algo = str((inner if isinstance(inner, dict) else qc).get("quant_algo", "")).upper()
        if "FP4" in algo:
            method = "modelopt_fp4"
        elif "FP8" in algo:
            method = "fp8"  # ModelOptFp8Config: per-tensor fp8 W8A8, as fp8
    if method not in METHODS:
        raise UserError(f"{where}: quantization_config.quant_method {method!r} is not modelled; "
                        f"known: {', '.join(METHODS)}")
    if method in ("awq", "gptq") and int(qc.get("bits", 4)) != 4:
        raise UserError(f"{where}: quantization_config.bits {qc.get('bits')!r}: only 4-bit {method} is modelled")
    return method


def with_quantization(spec: ModelSpec, quantization: str | None, where: str) -> ModelSpec:
    """``spec`` with linear weights quantized by ``quantization`` (None keeps the spec's own).
    Two different methods (a checkpoint's and a scenario's) are a contradiction."""
    if not quantization:
        return spec
    if spec.quantization and spec.quantization != quantization:
        raise UserError(f"{where}: {quantization!r} contradicts the model's own quantization {spec.quantization!r}")
    from dataclasses import replace

    from sim.spec.quantization import get_quantization

    q = get_quantization(quantization, where)
    if q is not None and q.experts_only and spec.num_experts <= 1:
        # vLLM Mxfp4Config quantizes FusedMoE layers only; a dense model would run unquantized
        raise UserError(f"{where}: {quantization} quantizes MoE experts only (vLLM mxfp4.py); "
                        f"{spec.name} has no routed experts")
    return replace(spec, quantization=quantization)
