"""``simsrv run``'s work: load the scenario, simulate, write the run directory, print the
summary. Typer-free: ``sim.cli.app`` declares the command for typer, and ``sim.cli.entry``
calls ``run_command`` directly for the plain forms of ``simsrv run`` (``sim.cli.run_argv``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import List, Optional

from sim.cli.consoles import err_console, out_console, stderr_may_be_terminal
from sim.errors import UserError


def overrides(policy: Optional[str], chunk: Optional[int], sets: List[str]) -> list[str]:
    """``--policy`` and ``--chunk`` as ``--set`` overrides, after the ``--set`` ones."""
    from sim.policies.registry import chunk_policy

    out = list(sets or [])
    if chunk is not None:
        chunked = chunk_policy()  # the policy whose token budget is its chunk size
        out += [f"engine.policy={chunked}", f"engine.max_num_batched_tokens={chunk}"]
        if policy is not None and policy != chunked:
            raise UserError(f"--chunk {chunk} means --policy {chunked}, but --policy {policy} was given")
    elif policy is not None:
        out.append(f"engine.policy={policy}")
    return out


def _dp(summary: dict) -> str:
    dp = summary.get("simsrv_data_parallel_size", 1)
    return f", DP {dp} + EP" if dp > 1 else ""


def _class_line(priority: str, c: dict) -> str:
    """One priority class's figures: counts, TTFT and TPOT p50 / p99, goodput."""
    def ms(v):
        return "-" if v is None else f"{v:,.1f}"
    from sim.metrics.keys import key

    good = c.get("request_goodput")
    return (f"priority {priority}: completed {c['completed']:,} / {c['requests']:,}"
            + (f", rejected {c['rejected']:,}" if c["rejected"] else "")
            + f"  TTFT p50 {ms(c[key('p50', 'ttft')])} p99 {ms(c[key('p99', 'ttft')])} ms"
            + f"  TPOT p50 {ms(c[key('p50', 'tpot')])} p99 {ms(c[key('p99', 'tpot')])} ms"
            + (f"  goodput {good:.2f} req/s" if good is not None else ""))


def _summary_table(summary: dict):
    from rich.table import Table

    t = Table(title=f"simsrv {summary['model_id']} on {summary['simsrv_gpu']} x{summary['simsrv_replicas']}"
                    f" (TP {summary['simsrv_tensor_parallel_size']}{_dp(summary)}), policy {summary['simsrv_policy']}")
    t.add_column("metric (ms)")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    from sim.metrics.keys import key, queue_key

    for label, metric in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E latency", "e2el")):
        t.add_row(label, *(_fmt(summary[key(c, metric)]) for c in ("mean", "p50", "p90", "p99")))
    t.add_row("queue time", *(_fmt(summary[queue_key(c)]) for c in ("mean", "p50", "p90", "p99")))
    return t


def _fmt(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _run_progress(total: int):
    if not stderr_may_be_terminal():  # rich's Progress would be disabled: nothing is drawn either way
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err_console.console, transient=True, disable=not err_console.is_terminal)
    task = progress.add_task("run", total=total)
    return progress, (lambda done, _total: progress.update(task, completed=done))


def run_command(scenario: Path, policy: Optional[str], chunk: Optional[int], set_: List[str], out: Optional[Path],
                quiet: bool, force: bool) -> None:
    """Simulate one scenario; print a summary table and write the run directory."""
    from sim.files.atomic import replacing_dir
    from sim.cli.outputs import check_output
    from sim.output import not_run_files, write_run
    from sim.run import run_scenario
    from sim.scenario import load_scenario
    from sim.metrics.summary import summarize
    from sim.workload import build_workload
    from sim.workload.build import should_stream

    s = load_scenario(scenario, overrides(policy, chunk, set_))
    from sim.policies import get_policy

    chunk_tag = get_policy(s.engine.policy).chunk_is_budget  # the chunk size names the run
    tag = s.engine.policy + (f"{s.engine.max_num_batched_tokens}" if chunk_tag else "")
    out = out or Path("reports/runs") / f"{s.dir_name}-{tag}"
    check_output(out, "--out", directory=True)
    # the name is claimed before simulating and the directory replaced whole when written
    with replacing_dir(out, force, not_run_files) as stage:
        if should_stream(s):  # a large trace is fed to the simulation chunk by chunk
            with err_console.status("simulating (streaming the trace)"):
                result = run_scenario(s)
        else:
            arrays = build_workload(s)
            progress, cb = _run_progress(len(arrays))
            with progress:
                result = run_scenario(s, progress=cb, workload=arrays)
        summary = summarize(result)
        write_run(result, summary, stage)
    print_warnings(summary)
    if quiet:
        return
    out_console.print(_summary_table(summary))
    out_console.print(
        f"completed {summary['completed']:,} / {summary['num_prompts']:,} (failed {summary['failed']:,}"
        + (f", rejected {summary['simsrv_rejected']:,}" if summary.get("simsrv_rejected") else "")
        + (f", aborted {summary['simsrv_aborted']:,}" if summary.get("simsrv_aborted") else "") + ")  "
        f"duration {summary['duration']:,.1f} s  throughput {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:,.0f} output tok/s, {summary['total_token_throughput']:,.0f} tok/s"
    )
    good = summary["request_goodput"]
    out_console.print(
        f"preemptions {summary['simsrv_num_preemptions']:,}  peak KV use {summary['simsrv_peak_kv_usage']:.0%}"
        + (f"  goodput {good:.2f} req/s" if good is not None else "")
        + f"  (simulated in {summary['simsrv_wall_s']:.1f} s wall)"
    )
    if "simsrv_kv_offload_loads" in summary:  # engine.kv_offloading_size (sim/core/kv.py CPUTier)
        gpu_hits = summary["simsrv_prefix_cache_hit_rate"]
        out_console.print(
            f"KV offloading: prefix hits {gpu_hits or 0:.1%} GPU + {summary['simsrv_kv_offload_hit_rate'] or 0:.1%} CPU "
            f"tier; {summary['simsrv_kv_offload_loads']:,} loads, {summary['simsrv_kv_offload_load_bytes'] / 1e9:,.1f} GB "
            f"in {summary['simsrv_kv_offload_load_s']:.2f} s; stores {summary['simsrv_kv_offload_store_bytes'] / 1e9:,.1f} GB "
            f"in {summary['simsrv_kv_offload_store_s']:.2f} s", markup=False, highlight=False)
    for reason, n in summary["simsrv_failed_reasons"].items():
        out_console.print(f"failed: {n:,} x {reason}", markup=False, highlight=False)
    for reason, n in summary.get("simsrv_rejected_reasons", {}).items():
        out_console.print(f"rejected: {n:,} x {reason}", markup=False, highlight=False)
    classes = summary.get("simsrv_classes") or {}
    if len(classes) > 1:  # per request priority (sim/metrics/summary.py class_figures)
        for p, c in classes.items():
            out_console.print(_class_line(p, c), markup=False, highlight=False)
    for note in summary.get("simsrv_uncertainty", []):
        out_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    out_console.print(f"wrote {out}/")
    core_note()


def core_note() -> None:
    """One line when the simulation ran on the Python core for a reason the user did not choose
    (no C compiler at install, an edited checkout): pip hides the build's own message."""
    from sim import compiled_core

    if compiled_core.pure_reason is not None and not compiled_core.user_chose_python():
        out_console.print(f"core: Python, ~3x slower than the compiled one ({compiled_core.pure_reason})",
                          markup=False, highlight=False, soft_wrap=True)


def print_warnings(summary: dict) -> None:
    """The run's warnings (result.json simsrv_warnings), one line each on stderr."""
    for w in summary.get("simsrv_warnings", []):
        err_console.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
