"""Per-priority-class figures of runs side by side (result.json ``simsrv_classes``).

Why: with ``engine.scheduling_policy: priority`` (or admission control by class) the whole-run
percentiles hide what each class gets: priority scheduling lowers the high class's TTFT and
raises the low class's. A run with one class shows no table (its figures are the run's).
"""

from __future__ import annotations

from sim.metrics.keys import key
from sim.reporting.html import Page

# (label, key in a class's figures, format): sim/metrics/summary.py class_figures
CLASS_ROWS = (
    ("requests", "requests", "{:,}"), ("completed", "completed", "{:,}"), ("failed", "failed", "{:,}"),
    ("rejected", "rejected", "{:,}"),
    *((f"{name} {stat} (ms)", key(stat, metric), "{:,.1f}") for name, metric in (("TTFT", "ttft"), ("TPOT", "tpot"))
      for stat in ("p50", "p99")),
    ("goodput (req / s)", "request_goodput", "{:,.2f}"),
)


def class_rows(runs: list) -> list[list[str]]:
    """One row per (priority, figure), one column per run; '-' where a run lacks the class or figure."""
    classes = sorted({p for r in runs for p in (r.summary.get("simsrv_classes") or {})}, key=int)
    rows = []
    for p in classes:
        for label, k, fmt in CLASS_ROWS:
            cells = []
            for r in runs:
                v = ((r.summary.get("simsrv_classes") or {}).get(p) or {}).get(k)
                cells.append("-" if v is None else fmt.format(v))
            rows.append([f"priority {p}: {label}", *cells])
    return rows


def classes_table(page: Page, runs: list) -> None:
    """The per-class table, when any run has more than one priority class."""
    if not any(len(r.summary.get("simsrv_classes") or {}) > 1 for r in runs):
        return
    page.heading("Per priority class")
    page.table(["class / metric", *(r.label for r in runs)], class_rows(runs))
    page.paragraph("A lower priority value is served first under engine.scheduling_policy: priority (vLLM V1: "
                   "the waiting queue by priority then arrival, the lowest priority preempted first). "
                   "Latencies cover each class's completed requests; rejected requests (admission_control) "
                   "are in none of them.", cls="note")
