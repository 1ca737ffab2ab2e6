"""``simsrv fit``: an engine profile's terms fitted to a user's own measurements.

Why: simsrv ships profiles for a few engines (``sim/catalog/engine_profiles.yaml``); a user with
another engine, version or serving stack (Triton, LMDeploy, NIM) matches it from a handful of
measurements. Starting from a base profile, the free terms (any float field of
``EngineProfile`` in seconds, named in ms: ``sim/cost/engine_profile.py`` ``term_fields``) are
fitted by nonlinear least squares on the relative error ``simulated / measured - 1`` of each
measurement; ``predict`` runs simsrv with candidate terms (``sim/analysis/fit_data.py``). The
model is nonlinear through queueing and batching, so derivatives are finite differences
(``scipy.optimize.least_squares``, 2-point, a step of ``DIFF_STEP`` x each term's scale).

Identifiability (before fitting, and at the optimum): the sensitivity matrix J (rows:
measurements, columns: d relative error / d term, each term in units of its scale) must have
full column rank. A term whose column is ~0 moves no measurement; terms whose normalised
columns are nearly dependent (reciprocal condition number below ``RCOND_MIN``) are measured
only in combination. Either refuses the fit in one line naming the terms. The count test
(measurements >= free terms) comes first.

Intervals: covariance ``s^2 (J^T J)^-1`` at the optimum with ``s^2 = SSR / (n - p)`` and
Student's t with n - p degrees of freedom (Bates & Watts, "Nonlinear Regression Analysis and
Its Applications", 1988, ch. 2: linearisation intervals). NOTE: they assume independent errors
of equal variance on the relative scale and a model locally linear over the interval.
Leave-one-out: each measurement is predicted by a refit without it (started from the full fit);
where the others alone cannot identify the terms it is reported as such, not refitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.errors import UserError

DIFF_STEP = 0.05          # finite-difference step, relative to each term's scale (5%)
ZERO_BASE_SCALE_MS = 0.1  # scale of a term whose base value is 0 (a step of 5 us)
EFFECT_MIN = 1e-3         # |column| below this: the term moves no measurement (0.1% per unit of its scale)
RCOND_MIN = 1e-2          # normalised columns' smallest / largest singular value below this: not separable
RCOND_DEFAULT = 0.1       # default terms: each added only while the chosen stay this well separated
CONFIDENCE = 0.95


@dataclass
class TermFit:
    name: str
    base_ms: float
    value_ms: float
    stderr_ms: float | None       # None: no residual degrees of freedom (as many measurements as terms)
    ci_ms: tuple[float, float] | None


@dataclass
class FitResult:
    terms: list[TermFit]
    measured: np.ndarray
    simulated: np.ndarray          # at the fitted terms
    loo: list[float | None]        # each measurement's error when predicted by a refit without it
    loo_why: list[str]             # why a leave-one-out error is missing
    dof: int
    evaluations: int
    cost_function: str = "relative error (simulated / measured - 1), least squares"
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> np.ndarray:
        return self.simulated / self.measured - 1.0

    @property
    def values(self) -> dict[str, float]:
        return {t.name: t.value_ms for t in self.terms}


class Predictor:
    """``predict`` memoised by the terms' values (least squares and leave-one-out ask again for
    points they have seen), counting the distinct evaluations."""

    def __init__(self, names: list[str], predict: Callable[[dict[str, float]], np.ndarray]):
        self.names = names
        self._predict = predict
        self._memo: dict[tuple[float, ...], np.ndarray] = {}

    def __call__(self, values_ms: np.ndarray) -> np.ndarray:
        key = tuple(float(v) for v in values_ms)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = np.asarray(self._predict(dict(zip(self.names, key))), dtype=np.float64)
        return hit

    @property
    def evaluations(self) -> int:
        return len(self._memo)


def scales_ms(base_ms: np.ndarray) -> np.ndarray:
    """Each term's unit in the fit: its base value, or ``ZERO_BASE_SCALE_MS`` where that is 0."""
    return np.where(base_ms > 0, base_ms, ZERO_BASE_SCALE_MS)


def sensitivities(pred: Predictor, values_ms: np.ndarray, scale: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """J: d(relative error) per unit of each term's scale, forward differences (backward for a
    term at 0 would leave the bounds, so always forward)."""
    y0 = pred(values_ms) / measured
    cols = []
    for j in range(len(values_ms)):
        h = DIFF_STEP * max(1.0, values_ms[j] / scale[j])
        v = values_ms.copy()
        v[j] += h * scale[j]
        cols.append((pred(v) / measured - y0) / h)
    return np.column_stack(cols) if cols else np.zeros((len(measured), 0))


class NotIdentifiable(UserError):
    """The measurements do not pin down ``terms`` (the message says how)."""

    def __init__(self, message: str, terms: list[str]):
        super().__init__(message)
        self.terms = terms


def unidentified_terms(J: np.ndarray, names: list[str], rcond_min: float = RCOND_MIN) -> tuple[str, list[str]]:
    """Why the columns of J do not identify the terms ("" when they do) and the terms concerned:
    terms with no effect, else groups measured only in combination (the terms weighing in the
    near-null directions of the normalised columns)."""
    norms = np.linalg.norm(J, axis=0)
    dead = [n for n, x in zip(names, norms) if x < EFFECT_MIN]
    if dead:
        return f"{', '.join(dead)} (no measurement depends on {'it' if len(dead) == 1 else 'them'})", dead
    _, s, vt = np.linalg.svd(J / norms, full_matrices=False)
    if len(s) and s[-1] >= rcond_min * s[0] and len(s) == len(names):
        return "", []
    groups: list[list[str]] = []
    for k in range(len(s)):
        if s[k] < rcond_min * s[0]:
            v = np.abs(vt[k])
            groups.append([n for n, w in zip(names, v) if w >= 0.2 * v.max()])
    why = "; ".join(f"{' + '.join(g)} (only their combination is measured)" for g in groups)
    return why, sorted({n for g in groups for n in g}, key=names.index)


def unidentified(J: np.ndarray, names: list[str], rcond_min: float = RCOND_MIN) -> str:
    return unidentified_terms(J, names, rcond_min)[0]


def default_terms(J: np.ndarray, names: list[str], n: int) -> list[str]:
    """The terms the data identify: greedily the largest remaining effect (pivoted QR on J)
    while it stays separable from those chosen, at most n - 1 (one residual degree of freedom
    for the intervals) and at least one measurement per term."""
    from scipy.linalg import qr

    if J.shape[1] == 0:
        return []
    _, r, piv = qr(J, mode="economic", pivoting=True)
    chosen: list[int] = []
    top = max(n - 1, 1)
    for k, j in enumerate(piv):
        if len(chosen) >= top or k >= r.shape[0] or abs(r[k, k]) < EFFECT_MIN:
            break
        if not unidentified(J[:, chosen + [j]], [names[i] for i in chosen + [j]], RCOND_DEFAULT):
            chosen.append(int(j))
    return [names[j] for j in sorted(chosen)]


def _solve(pred: Predictor, x0_u: np.ndarray, scale: np.ndarray, measured: np.ndarray, rows: np.ndarray):
    from scipy.optimize import least_squares

    def resid(u: np.ndarray) -> np.ndarray:
        return (pred(u * scale) / measured - 1.0)[rows]

    return least_squares(resid, x0_u, bounds=(0.0, np.inf), method="trf", diff_step=DIFF_STEP,
                         xtol=1e-4, ftol=1e-6, gtol=1e-8, max_nfev=40)


def check_count(n: int, names: list[str]) -> None:
    if n < len(names):
        raise UserError(f"{n} measurement{'s' if n != 1 else ''} for {len(names)} free terms ({', '.join(names)}): "
                        f"give at least {len(names)} independent measurements, or fewer --terms")


def fit_terms(predict: Callable[[dict[str, float]], np.ndarray], names: list[str], base_ms: dict[str, float],
              measured: np.ndarray, ids: list[str]) -> FitResult:
    """Fit ``names`` (started at ``base_ms``) to ``measured``; ``predict(values_ms)`` gives the
    simulated figure of every measurement. Refuses (``UserError``, one line) too few
    measurements or terms the measurements do not identify."""
    from scipy.stats import t as student_t

    n, p = len(measured), len(names)
    check_count(n, names)
    pred = Predictor(names, predict)
    base = np.array([base_ms[k] for k in names], dtype=np.float64)
    scale = scales_ms(base)
    why, lost = unidentified_terms(sensitivities(pred, base, scale, measured), names)
    if why:
        raise NotIdentifiable(f"terms not identifiable from these {n} measurements: {why}; fit fewer --terms or "
                              "add measurements that move them differently", lost)
    rows = np.arange(n)
    sol = _solve(pred, base / scale, scale, measured, rows)
    values = sol.x * scale
    J = sensitivities(pred, values, scale, measured)
    why, lost = unidentified_terms(J, names)
    if why:
        raise NotIdentifiable(f"terms not identifiable at the fitted values: {why}; fit fewer --terms or add "
                              "measurements that move them differently", lost)
    sim = pred(values)
    err = sim / measured - 1.0
    dof = n - p
    terms = []
    Jv = J / scale  # per ms
    cov = None
    tq = None
    if dof > 0:
        s2 = float(err @ err) / dof
        cov = s2 * np.linalg.inv(Jv.T @ Jv)
        tq = float(student_t.ppf(0.5 + CONFIDENCE / 2, dof))
    for j, name in enumerate(names):
        if cov is None:
            terms.append(TermFit(name, float(base[j]), float(values[j]), None, None))
            continue
        se = float(np.sqrt(max(cov[j, j], 0.0)))
        terms.append(TermFit(name, float(base[j]), float(values[j]), se,
                             (float(values[j] - tq * se), float(values[j] + tq * se))))
    loo, loo_why = _leave_one_out(pred, sol.x, scale, measured, J, names)
    notes = []
    if not sol.success:
        notes.append(f"least squares stopped before converging: {sol.message}")
    at_zero = [t.name for t in terms if t.value_ms <= 1e-9]  # on the bound (to rounding)
    if at_zero:
        notes.append(f"{', '.join(at_zero)} fitted at 0 (the bound): the data ask for less; its interval is "
                     "the linearisation's and crosses 0")
    return FitResult(terms, measured, sim, loo, loo_why, dof, pred.evaluations, notes=notes)


def _leave_one_out(pred: Predictor, x_u: np.ndarray, scale: np.ndarray, measured: np.ndarray, J: np.ndarray,
                   names: list[str]) -> tuple[list[float | None], list[str]]:
    n, p = J.shape
    loo: list[float | None] = []
    why: list[str] = []
    for i in range(n):
        keep = np.array([k for k in range(n) if k != i], dtype=np.int64)
        if len(keep) < p:
            loo.append(None)
            why.append(f"{len(keep)} measurements left for {p} terms")
            continue
        lost = unidentified(J[keep], names)
        if lost:
            loo.append(None)
            why.append(f"without it, not identifiable: {lost}")
            continue
        sol = _solve(pred, x_u, scale, measured, keep)
        loo.append(float(pred(sol.x * scale)[i] / measured[i] - 1.0))
        why.append("")
    return loo, why


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}"


def fitted_profile_yaml(base: str, base_entry: dict, result: FitResult, ids: list[str],
                        sources: list[str]) -> str:
    """The profile file ``simsrv fit`` writes: the base profile's keys with the fitted terms,
    ``basis`` and ``sources`` saying how, and comments giving each term's interval and every
    measurement's in-sample and leave-one-out error (``engine.profile: path`` reads it)."""
    import yaml

    entry = {**base_entry, **result.values}
    entry["basis"] = (f"simsrv fit: {', '.join(t.name for t in result.terms)} fitted over profile {base} by least "
                      f"squares on the relative error of {len(ids)} measurements")
    entry["sources"] = list(sources) + [f"base {base}: {x}" for x in base_entry.get("sources") or []]
    lines = [f"# Engine profile fitted by simsrv fit (sim/cost/profile_fit.py) over base profile {base}.",
             f"# {result.cost_function}; {len(ids)} measurements, {len(result.terms)} free terms, "
             f"{result.dof} residual degrees of freedom; {CONFIDENCE:.0%} intervals from s^2 (J^T J)^-1, "
             f"t({result.dof}).",
             "# term: fitted [interval] (base)"]
    for t in result.terms:
        ci = f"[{t.ci_ms[0]:.6g}, {t.ci_ms[1]:.6g}]" if t.ci_ms else "[n/a: no degrees of freedom]"
        lines.append(f"#   {t.name}: {t.value_ms:.6g} {ci} ({t.base_ms:.6g})")
    lines.append("# measurement: measured, simulated, err in-sample, err leave-one-out")
    for i, mid in enumerate(ids):
        mid = "".join(c if c.isprintable() else "?" for c in mid)  # one comment line each
        lines.append(f"#   {mid}: {result.measured[i]:.6g}, {result.simulated[i]:.6g}, {_fmt(result.errors[i])}, "
                     f"{_fmt(result.loo[i])}")
    for note in result.notes:
        lines.append(f"# note: {note}")
    return "\n".join(lines) + "\n" + yaml.safe_dump(entry, sort_keys=False, allow_unicode=True)
