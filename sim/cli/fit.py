"""``simsrv fit`` (typer command): an engine profile's terms fitted to the user's measurements
(``sim/cost/profile_fit.py``, data from ``sim/analysis/fit_data.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.consoles import LazyConsole
from sim.errors import UserError

console = LazyConsole()


def _terms(text: Optional[str]) -> list[str] | None:
    from sim.cost.engine_profile import term_fields

    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    valid = list(term_fields())
    bad = [t for t in names if t not in valid]
    if bad or not names:
        raise UserError(f"--terms: {'unknown term ' + repr(bad[0]) if bad else 'no term given'}; "
                        f"terms: {', '.join(valid)}")
    if len(set(names)) != len(names):
        raise UserError(f"--terms: a term is named twice ({text})")
    return names


def fit(
    measurements: List[Path] = typer.Argument(..., help="Validation case files (*.yaml) and vLLM bench results "
                                              "(*.json, --save-result --save-detailed)."),
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="The deployment a vLLM bench result measured."),
    base: str = typer.Option("vllm-v1", "--base", help="Profile to start from: a catalogue name or a profile file."),
    terms: Optional[str] = typer.Option(None, "--terms", help="Free terms, comma-separated (default: those the "
                                        "measurements identify)."),
    rows: List[str] = typer.Option([], "--rows", help="Keep case rows with this id or id prefix (repeatable)."),
    held: List[str] = typer.Option([], "--hold-out", help="Measurements with this id or id prefix are not fitted "
                                   "but judged with the fitted profile (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the fitted profile here (engine.profile: PATH)."),
):
    """Fit an engine profile's terms to measurements; print intervals, in-sample and leave-one-out error."""
    from sim.analysis.fit_data import Simulator, hold_out, read_fit_data
    from sim.cli.outputs import check_output
    from sim.cost.engine_profile import profile_entry, term_fields
    from sim.cost.profile_fit import Predictor, check_count, default_terms, scales_ms, sensitivities

    import numpy as np

    if out is not None:
        check_output(out, "--out", directory=False)
    names = _terms(terms)
    try:
        base_entry = profile_entry(base)
    except UserError as e:
        raise UserError(f"--base: {e}") from None
    data, judged = hold_out(read_fit_data(list(measurements), scenario, rows or None), held)
    for rid, why in data.skipped:
        console.print(f"skipped {rid}: {why}", highlight=False)
    if not data.measurements:
        raise UserError("no measurement to fit: every row was skipped (listed above)" if data.skipped
                        else "no measurement to fit")
    measured = np.array([m.measured for m in data.measurements])
    ids = [m.id for m in data.measurements]
    with tempfile.TemporaryDirectory(prefix="simsrv-fit-") as tmp:
        sim = Simulator(data, base_entry, Path(tmp))
        if names is None:
            every = list(term_fields())
            base_ms = np.array([base_entry[k] for k in every])
            J = sensitivities(Predictor(every, sim), base_ms, scales_ms(base_ms), measured)
            names = default_terms(J, every, len(measured))
            if not names:
                raise UserError(f"no term of profile {base} moves these {len(measured)} measurements: nothing to fit")
            console.print(f"free terms (identifiable from the data): {', '.join(names)}", highlight=False)
        check_count(len(measured), names)
        result = _fit(sim, names, base_entry, measured, ids, chosen=terms is None)
        judged_sim = Simulator(judged, base_entry, Path(tmp))(result.values) if judged.measurements else None
    _show(result, data, ids)
    if judged_sim is not None:
        _show_judged(judged, judged_sim)
    if out is not None:
        from sim.cost.profile_fit import fitted_profile_yaml
        from sim.files.atomic import write_text

        sources = sorted({r.where for r in data.runs.values()})
        write_text(out, fitted_profile_yaml(base, base_entry, result, ids, sources))
        console.print(f"wrote {out} (use it as engine.profile: {out})", highlight=False)


def _fit(sim, names: list[str], base_entry: dict, measured, ids: list[str], chosen: bool):
    """``fit_terms``; with terms chosen by default, a term the fitted values leave unidentified
    (a term pushed to its bound, where it stops acting) is dropped and the rest refitted: of
    the terms named, the one with the least effect at the base."""
    from sim.cost.profile_fit import NotIdentifiable, Predictor, fit_terms, scales_ms, sensitivities

    import numpy as np

    names = list(names)
    while True:
        try:
            return fit_terms(sim, names, {k: base_entry[k] for k in names}, measured, ids)
        except NotIdentifiable as e:
            if not chosen or len(names) <= 1:
                raise
            base_ms = np.array([base_entry[k] for k in names])
            effect = np.linalg.norm(sensitivities(Predictor(names, sim), base_ms, scales_ms(base_ms), measured), axis=0)
            drop = min(e.terms, key=lambda k: effect[names.index(k)])
            console.print(f"dropped {drop}: {str(e).split('; fit fewer')[0]}", highlight=False)
            names.remove(drop)


def _show_judged(judged, simulated) -> None:
    import numpy as np
    from rich.table import Table

    t = Table(title="held out (--hold-out): judged with the fitted profile, not fitted on")
    for c in ("measurement", "metric", "measured", "simulated", "err"):
        t.add_column(c, justify="left" if c in ("measurement", "metric") else "right")
    errs = []
    for m, v in zip(judged.measurements, simulated):
        errs.append(v / m.measured - 1.0)
        t.add_row(m.id, m.metric, f"{m.measured:.4g}", f"{v:.4g}", f"{errs[-1]:+.1%}")
    console.print(t)
    a = np.abs(errs)
    console.print(f"held out: median |err| {np.median(a):.1%}, max {a.max():.1%} over {len(a)} measurements",
                  highlight=False)


def _show(result, data, ids: list[str]) -> None:
    from rich.table import Table

    from sim.cost.profile_fit import CONFIDENCE

    def pct(v):
        return "n/a" if v is None else f"{v:+.1%}"

    dof = f"{result.dof} degree{'s' if result.dof != 1 else ''} of freedom"
    t = Table(title=f"fitted terms ({CONFIDENCE:.0%} intervals, t with {dof})")
    for c in ("term", "base ms", "fitted ms", "interval ms"):
        t.add_column(c, justify="left" if c == "term" else "right")
    for term in result.terms:
        ci = f"{term.ci_ms[0]:.4g} .. {term.ci_ms[1]:.4g}" if term.ci_ms else "n/a (no degrees of freedom)"
        t.add_row(term.name, f"{term.base_ms:.4g}", f"{term.value_ms:.4g}", ci)
    console.print(t)
    m = Table(title="measurements (err = simulated / measured - 1)")
    for c in ("measurement", "metric", "measured", "simulated", "err", "leave-one-out err"):
        m.add_column(c, justify="left" if c in ("measurement", "metric") else "right")
    for i, meas in enumerate(data.measurements):
        m.add_row(meas.id, meas.metric, f"{result.measured[i]:.4g}", f"{result.simulated[i]:.4g}",
                  pct(float(result.errors[i])), pct(result.loo[i]) if result.loo[i] is not None else "n/a")
    console.print(m)
    import numpy as np

    ins = np.abs(result.errors)
    console.print(f"in-sample: median |err| {np.median(ins):.1%}, max {ins.max():.1%} over {len(ids)} measurements",
                  highlight=False)
    loo = [abs(v) for v in result.loo if v is not None]
    if loo:
        console.print(f"leave-one-out: median |err| {np.median(loo):.1%}, max {max(loo):.1%} over {len(loo)} "
                      "refits", highlight=False)
    for i, why in enumerate(result.loo_why):
        if why:
            console.print(f"leave-one-out n/a for {ids[i]}: {why}", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"{result.evaluations} candidate profiles simulated", highlight=False)
    for r in data.runs.values():
        if r.workload is not None:
            console.print(f"replayed {r.where}", highlight=False)
