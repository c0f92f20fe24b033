"""Run one function in N forked worker processes that start their timed work together.

Each worker first runs ``setup(index)`` (open the cache, pre-populate a
process-local store), reports ready, waits for the common start signal, runs
``work(state)`` and sends its result (raw samples included) back over a
pipe.  The parent gathers every worker's raw results; merging them (for
percentiles: pooling the samples) is the caller's job.

Workers are forked (Linux), so they inherit the parent's imports and
objects; nothing needs to be pickled on the way in.  A worker that fails
sends its exception text instead of a result, and the parent raises it.
Workers that outlive the timeout are killed by PID.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WorkerError", "run_parallel"]

_S = TypeVar("_S")
_R = TypeVar("_R")


class WorkerError(RuntimeError):
    """A worker process failed (its error text is the message)."""


def _child(
    index: int,
    conn: multiprocessing.connection.Connection,
    go: Any,
    setup: Callable[[int], Any],
    work: Callable[[Any], Any],
) -> None:
    try:
        state = setup(index)
        conn.send(("ready", None))
        go.wait()
        conn.send(("ok", work(state)))
    except BaseException as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        with contextlib.suppress(Exception):
            conn.send(("error", detail.splitlines()[-1] if detail else type(exc).__name__))
    finally:
        conn.close()


def run_parallel(
    n: int,
    setup: Callable[[int], _S],
    work: Callable[[_S], _R],
    timeout_s: float = 600.0,
) -> tuple[list[_R], int]:
    """Run ``work(setup(i))`` in ``n`` forked processes; return results and wall ns.

    The wall time runs from the common start signal to the last result.
    """
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs: list[Any] = []
    conns: list[multiprocessing.connection.Connection] = []
    deadline = time.monotonic() + timeout_s
    try:
        for i in range(n):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child, args=(i, child_end, go, setup, work), name=f"nearcache-bench-{i}"
            )
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        for conn in conns:
            _expect(conn, "ready", deadline)
        t0 = time.perf_counter_ns()
        go.set()
        results: list[_R] = [_expect(conn, "ok", deadline) for conn in conns]
        wall = time.perf_counter_ns() - t0
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        return results, wall
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, 9)
                proc.join(5)
        for conn in conns:
            conn.close()


def _expect(conn: multiprocessing.connection.Connection, kind: str, deadline: float) -> Any:
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not conn.poll(remaining):
        raise WorkerError("worker timed out")
    try:
        got, payload = conn.recv()
    except EOFError:
        raise WorkerError("worker exited without a result") from None
    if got == "error":
        raise WorkerError(str(payload))
    if got != kind:
        raise WorkerError(f"unexpected worker message {got!r}")
    return payload
