"""A policy's regions simulated in parallel processes, the log as if simulated in one.

The regions of one run share nothing while they run: each has its own traces, servers, client
plan and, under the control plane, its own value book, loops and random stream
(:class:`headroom.controllers.plane.ControlPlane`). So :func:`run_forked` hands groups of
regions to forked processes; each writes its regions' events, one file per region, counting
them per window, and the parent then writes every window's events region by region in scenario
order, exactly the lines (bit for bit) one process would have written. A child that fails
stops the run with the child's own exception, its traceback attached as a note.

Processes are forked (POSIX): the run's context, built once, is shared copy-on-write and nothing
of it is pickled. :func:`default_jobs` picks one process per region, at most two per core: three
regions on two cores then finish together instead of two after one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from headroom.analysis.events import encode_event

__all__ = ["EmitFor", "MarkWindow", "default_jobs", "groups_of", "run_forked", "usable_cores"]

# What a process simulates: its regions, through ``emit_for(region)`` (where that region's
# events go) and ``mark(w)`` (called as window ``w`` opens, before any of its events).
EmitFor = Callable[[int], Callable[[dict[str, Any]], None]]
MarkWindow = Callable[[int], None]
Simulate = Callable[[Sequence[int], EmitFor, MarkWindow], None]

# How often the parent looks at its children's progress (seconds).
_POLL_S = 0.1


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def default_jobs(n_regions: int) -> int:
    """Processes for ``n_regions`` regions: one per region, at most two per core; one on a
    single core or where processes cannot be forked."""
    cores = usable_cores()
    if cores <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(n_regions, 2 * cores))


def groups_of(n_regions: int, jobs: int) -> list[list[int]]:
    """Regions dealt to ``min(jobs, n_regions)`` processes in turn (region r to process r mod k)."""
    k = max(1, min(jobs, n_regions))
    return [list(range(i, n_regions, k)) for i in range(k)]


class _RegionFiles:
    """A child's record: one file of encoded events per region, counted per window."""

    def __init__(self, directory: Path, regions: Sequence[int], n_windows: int) -> None:
        self.directory = directory
        self.files: dict[int, IO[bytes]] = {
            r: open(directory / f"region-{r}.jsonl", "wb", buffering=1 << 20)  # noqa: SIM115
            for r in regions
        }
        # slot 0: before the first window; w + 1: window w; n_windows + 1: after the last
        self.counts = {r: np.zeros(n_windows + 2, dtype=np.int64) for r in regions}
        self.slot = 0

    def emit_for(self, region: int) -> Callable[[dict[str, Any]], None]:
        out = self.files[region]
        counts = self.counts[region]

        def emit(event: dict[str, Any]) -> None:
            out.write(encode_event(event))
            counts[self.slot] += 1

        return emit

    def close(self) -> None:
        for r, fh in self.files.items():
            fh.close()
            np.save(self.directory / f"region-{r}.counts.npy", self.counts[r])


def _child(
    directory: Path,
    index: int,
    regions: Sequence[int],
    n_windows: int,
    simulate: Simulate,
    done: Any,
) -> None:
    try:
        files = _RegionFiles(directory, regions, n_windows)

        def mark(w: int) -> None:
            files.slot = w + 1
            done[index] = w  # windows before w are simulated

        simulate(regions, files.emit_for, mark)
        files.slot = n_windows + 1  # anything emitted after the last window
        files.close()
        done[index] = n_windows
    except BaseException as exc:  # reported to the parent, which raises it
        text = traceback.format_exc()
        try:
            blob = pickle.dumps((exc, text))
        except Exception:  # an exception that does not pickle: its text
            blob = pickle.dumps((RuntimeError(f"{type(exc).__name__}: {exc}"), text))
        (directory / f"error-{index}.pickle").write_bytes(blob)
        raise SystemExit(1) from None


def run_forked(
    n_regions: int,
    n_windows: int,
    jobs: int,
    simulate: Simulate,
    write: Callable[[dict[str, Any]], None],
    after_window: Callable[[int], None],
    progress: Callable[[int, int], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Simulate ``n_regions`` regions in ``min(jobs, n_regions)`` forked processes with
    ``simulate``, then ``write`` every window's events region by region, calling
    ``after_window(w)`` after window ``w``'s (and once with ``n_windows`` after what the regions
    emit past the last). ``progress(done, total)``: the windows every process has simulated, as
    they run. ``meanwhile``: work of the parent's own, done while the processes run (the parent
    would only wait) and before it writes anything of theirs, in a thread of the lowest
    priority (:func:`_in_idle_time`): it takes the cores the processes leave idle, not the time
    of the slowest region, which bounds the run."""
    groups = groups_of(n_regions, jobs)
    mp = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="headroom-regions-") as tmp:
        directory = Path(tmp)
        done = mp.Array("q", len(groups), lock=False)
        children = [
            mp.Process(
                target=_child,
                args=(directory, i, group, n_windows, simulate, done),
                name=f"headroom-regions-{i}",
                daemon=True,
            )
            for i, group in enumerate(groups)
        ]
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
            stream.flush()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns at any fork of a process with threads: here numpy's BLAS
                # workers, idle between calls while the parent forks (OpenBLAS starts them
                # afresh in the child); no Python thread of ours runs during a simulation
                warnings.filterwarnings("ignore", "This process .* is multi-threaded")
                for child in children:
                    child.start()
            errors: list[BaseException] = []
            worker = None
            if meanwhile is not None:
                worker = threading.Thread(
                    target=_in_idle_time,
                    args=(meanwhile, errors),
                    name="headroom-meanwhile",
                    daemon=True,  # a failing region's exception does not wait for it
                )
                worker.start()
            _wait(children, directory, done, n_windows, progress)
            if worker is not None:
                worker.join()
            if errors:
                raise errors[0]
        finally:
            for child in children:
                if child.is_alive():
                    child.terminate()
                child.join()
        _merge(directory, n_regions, n_windows, write, after_window)


def _in_idle_time(work: Callable[[], None], errors: list[BaseException]) -> None:
    """Run ``work`` in this thread at the lowest scheduling priority where the system lets a
    thread have its own (Linux: a thread's nice value is its own), so it runs on what the
    regions' processes leave of the cores; its exception goes to ``errors``."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    try:
        work()
    except BaseException as exc:  # re-raised by the parent's thread
        errors.append(exc)


def _wait(
    children: Sequence[multiprocessing.process.BaseProcess],
    directory: Path,
    done: Any,
    n_windows: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    last = -1
    while True:
        for i, child in enumerate(children):
            if child.exitcode:  # None while it runs, 0 once it has finished well
                _raise_child_error(directory, i, child.exitcode)
        running = [child.sentinel for child in children if child.exitcode is None]
        now = min(int(v) for v in done)
        if progress is not None and now != last:
            progress(now, n_windows)
            last = now
        if not running:
            return
        multiprocessing.connection.wait(running, timeout=_POLL_S)


def _raise_child_error(directory: Path, index: int, exitcode: int) -> None:
    path = directory / f"error-{index}.pickle"
    if not path.exists():
        raise RuntimeError(f"the process simulating region group {index} exited with {exitcode}")
    exc, text = pickle.loads(path.read_bytes())  # written by our own child
    if isinstance(exc, BaseException):
        with contextlib.suppress(AttributeError):
            exc.add_note(f"in the process simulating region group {index}:\n{text}")
        raise exc
    raise RuntimeError(text)


def _merge(
    directory: Path,
    n_regions: int,
    n_windows: int,
    write: Callable[[dict[str, Any]], None],
    after_window: Callable[[int], None],
) -> None:
    counts = [np.load(directory / f"region-{r}.counts.npy") for r in range(n_regions)]
    with contextlib.ExitStack() as stack:
        files = [
            stack.enter_context(open(directory / f"region-{r}.jsonl", "rb"))
            for r in range(n_regions)
        ]

        def copy(slot: int) -> None:
            for r in range(n_regions):
                fh = files[r]
                for _ in range(int(counts[r][slot])):
                    write(orjson.loads(fh.readline()))

        copy(0)
        for w in range(n_windows):
            copy(w + 1)
            after_window(w)
        copy(n_windows + 1)
        after_window(n_windows)
