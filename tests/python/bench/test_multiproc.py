"""Forked workers start together, report back, and fail loudly."""

from __future__ import annotations

import os
import time

import pytest

from nearcache.bench.multiproc import WorkerError, run_parallel


def test_results_come_back_in_worker_order() -> None:
    results, wall = run_parallel(4, lambda i: i, lambda i: (i, os.getpid()))
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert len({r[1] for r in results}) == 4
    assert os.getpid() not in {r[1] for r in results}
    assert wall > 0


def test_worker_error_is_raised_in_the_parent() -> None:
    def work(i: int) -> int:
        if i == 2:
            raise ValueError("boom in worker 2")
        return i

    with pytest.raises(WorkerError, match="boom in worker 2"):
        run_parallel(3, lambda i: i, work)


def test_setup_error_is_raised() -> None:
    def setup(i: int) -> int:
        raise RuntimeError("cannot open")

    with pytest.raises(WorkerError, match="cannot open"):
        run_parallel(2, setup, lambda s: s)


def test_stuck_worker_times_out_and_is_killed() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        run_parallel(1, lambda i: i, lambda s: time.sleep(30), timeout_s=1.0)
    assert time.monotonic() - start < 15
