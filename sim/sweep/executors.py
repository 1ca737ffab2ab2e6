"""Where sweep tasks run: in this process, a local process pool, or an existing Ray cluster.

Why: one machine runs thousands of small simulations in parallel processes; users who outgrow
it point simsrv at their Ray cluster. Every executor yields (task, row) as tasks finish, in
any order, so the caller writes each result the moment it exists (``--resume``, Ctrl-C).
``map_calls`` does the same for any top-level function (``simsrv diagnose``'s candidates).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterable, Iterator

from sim.errors import UserError
from sim.sweep.task import Task, call_sharing, run_task, warm_worker


class SerialExecutor:
    """In this process, one task after another (``--workers 1``)."""

    workers = 1

    def __init__(self, gpus: tuple[str, ...] = ()):
        from sim.cost.calibration import load_calibration

        for gpu in gpus:
            load_calibration(gpu)

    def map_unordered(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict]]:
        return self.map_calls(run_task, tasks)

    def map_calls(self, fn: Callable, items: Iterable) -> Iterator[tuple[object, object]]:
        """(item, ``fn(item)``) for each item, as each finishes (``fn``: a top-level function)."""
        from sim.engine.deployment import shared_cost_models

        with shared_cost_models():
            for item in items:
                yield item, fn(item)

    def close(self) -> None:
        pass


def _start_worker(gpus: tuple[str, ...]) -> None:
    """A pool worker's start: it ends with its parent, then loads the GPUs' calibrations."""
    _exit_with_parent()
    warm_worker(gpus)


def _exit_with_parent() -> None:
    """End this pool worker, silently, as soon as the process that started it is gone.

    Why: a sweep killed with SIGKILL (the OOM killer, ``kill -9``, a batch system) cannot end
    its pool; each worker went on simulating its task to the end, then printed two
    BrokenPipeError tracebacks sending the result to nobody (multiprocessing/pool.py ``worker``).
    On Linux the kernel kills the worker with its parent (prctl PR_SET_PDEATHSIG, set by the
    worker itself; a parent already gone by then is caught by the ppid check); elsewhere a
    daemon thread waits on the parent's sentinel and exits the process (``os._exit``: no
    clean-up, no output), which covers Linux too should prctl be unavailable."""
    parent = mp.parent_process()
    if parent is None:
        return
    if _kill_with_parent():
        if os.getppid() != parent.pid:
            os._exit(0)
        return
    import threading

    def watch() -> None:
        from multiprocessing.connection import wait

        wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, name="simsrv-parent-watch", daemon=True).start()


def _kill_with_parent() -> bool:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) on this process; False where there is no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG (linux/prctl.h)
    except (OSError, AttributeError):
        return False


# The pool's locks are semaphores that multiprocessing's resource tracker (a process of its own)
# removes when this process ends; after a SIGKILL it does so with a two-line UserWarning that
# they "appear to be leaked" (multiprocessing/resource_tracker.py ``main``).
_TRACKER_WARNING = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"


def _quiet_resource_tracker() -> None:
    """No leaked-semaphore warning from the resource tracker, which cleans them up anyway:
    it takes the interpreter's -W options from ``sys.warnoptions`` when the first pool starts
    it (multiprocessing/util.py ``_args_from_interpreter_flags``)."""
    if _TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_WARNING)


def _call_indexed(item: tuple[int, Callable, object]) -> tuple[int, object]:
    i, fn, arg = item
    return i, fn(arg)


class LocalExecutor:
    """A pool of ``workers`` processes, started once and reused for every batch of tasks.

    NOTE: processes are spawned, not forked: forking a parent that has used polars' thread
    pool can deadlock the child.
    """

    def __init__(self, workers: int, gpus: tuple[str, ...] = ()):
        self.workers = workers
        _quiet_resource_tracker()
        self.pool = mp.get_context("spawn").Pool(workers, initializer=_start_worker, initargs=(tuple(gpus),))

    def map_unordered(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict]]:
        return self.map_calls(run_task, tasks)

    def map_calls(self, fn: Callable, items: Iterable) -> Iterator[tuple[object, object]]:
        items = list(items)
        for i, out in self.pool.imap_unordered(_call_indexed, [(i, fn, x) for i, x in enumerate(items)], chunksize=1):
            yield items[i], out

    def close(self) -> None:
        self.pool.terminate()  # Ctrl-C or done: unfinished tasks are dropped, finished rows are on disk
        self.pool.join()


class RayExecutor:
    """Tasks submitted to an existing Ray cluster (``address``: ``auto``, ``ray://host:port``;
    None starts a local Ray instance). Ray reuses worker processes, so each loads a GPU's
    calibration once (the ``lru_cache`` lives as long as the worker).

    NOTE: workers need simsrv's dependencies installed; this simsrv's code is shipped to them
    (Ray ``py_modules``), and a trace file must be readable at the same absolute path on every
    node (a shared filesystem). A worker keeps the cost models it built for its next tasks
    (``call_sharing``), as a local pool's workers do.
    """

    def __init__(self, address: str | None, gpus: tuple[str, ...] = ()):
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'simsrv[ray]'") from None
        import sim

        self.ray = ray
        if not ray.is_initialized():
            try:
                ray.init(address=address, runtime_env={"py_modules": [os.path.dirname(sim.__file__)]},
                         log_to_driver=False)
            except ConnectionError as e:
                raise UserError(f"--address {address}: cannot connect to a Ray cluster ({e})") from None
        self.remote = ray.remote(max_retries=2)(call_sharing)
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def map_unordered(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict]]:
        return self.map_calls(run_task, tasks)

    def map_calls(self, fn: Callable, items: Iterable) -> Iterator[tuple[object, object]]:
        self.pending = {self.remote.remote((fn, x)): x for x in items}
        while self.pending:
            done, _ = self.ray.wait(list(self.pending), num_returns=1)
            for ref in done:
                yield self.pending.pop(ref), self.ray.get(ref)

    def close(self) -> None:
        """Cancel what this sweep still has queued (Ctrl-C); the cluster itself is the user's."""
        for ref in getattr(self, "pending", {}):
            self.ray.cancel(ref, force=True)
        self.pending = {}


def make_executor(kind: str, workers: int | None, address: str | None, gpus: tuple[str, ...] = ()):
    """``local`` (a process pool of ``workers``, default every core; 1 = in this process) or ``ray``."""
    if kind == "ray":
        return RayExecutor(address, gpus)
    if kind != "local":
        raise UserError(f"--executor {kind}: expected local or ray")
    if address is not None:
        raise UserError("--address is for --executor ray")
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise UserError(f"--workers {n}: must be >= 1")
    return SerialExecutor(gpus) if n == 1 else LocalExecutor(n, gpus)
