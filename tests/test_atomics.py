import time

import nbrgc  # noqa: F401  (selects the thread-safe threading layer before anything compiles)
import numba
import numpy as np
import pytest

from nbrgc.kernels import atomics as A
from nbrgc.kernels.atomics import atomic_add, atomic_store

from contention import contended, run_threads


@numba.njit(nogil=True)
def _atomic_and_plain_incr(arr, m, progress, me):
    """arr[0] by fetch-and-add, arr[1] by a plain read-modify-write around it, in one loop that goes
    on until every thread has done ``m`` (tests/contention.py): the threads overlap by construction
    and the plain counter loses increments in the same run (the fetch-and-add, a full barrier, keeps
    LLVM from folding the plain one into a single ``arr[1] += m``). Returns this thread's count."""
    done = 0
    while True:
        v = arr[1]
        atomic_add(arr, 0, 1)
        arr[1] = v + 1
        done += 1
        A.store(progress, me, done)
        if done >= m and _slowest(progress) >= m:
            return done


@numba.njit(nogil=True)
def _slowest(progress):
    low = A.load(progress, 0)
    for j in range(1, progress.size):
        low = min(low, A.load(progress, j))
    return low


@numba.njit(nogil=True)
def _collect_olds(arr, out):
    for i in range(out.size):
        out[i] = atomic_add(arr, 0, 1)


@numba.njit(nogil=True)
def _post(counter, round_no, k, rnd):
    """Post once to round ``rnd``; the poster that brings the counter to k closes the round (resets
    the counter, opens the next round) and returns True."""
    if atomic_add(counter, 0, 1) == k - 1:
        atomic_store(counter, 0, 0)
        atomic_store(round_no, 0, rnd + 1)
        return True
    return False


def _stage_thread(counter, round_no, k, r, wins):
    for rnd in range(r):
        while A.load(round_no, 0) < rnd:  # wait until round `rnd` is open
            time.sleep(0)
        if _post(counter, round_no, k, rnd):
            wins[rnd] += 1


_run_threads = run_threads


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_concurrent_fetch_add_exact(dtype):
    """In a run whose plain counter lost increments (so the loops really overlapped), the
    fetch-and-add counter lost none."""
    n, m = 6, 100_000
    arr = np.zeros(2, dtype)
    _atomic_and_plain_incr(arr, 1, np.zeros(1, np.int64), 0)  # compile outside the threads

    def once():
        arr[:] = 0
        progress, counts = np.zeros(n, np.int64), np.zeros(n, np.int64)

        def worker(i):
            counts[i] = _atomic_and_plain_incr(arr, m, progress, i)

        _run_threads(n, worker, lambda i: (i,))
        total = int(counts.sum())  # well inside int32
        assert counts.min() >= m
        assert int(arr[0]) == total
        return int(arr[1]), total

    contended(once)


def test_fetch_add_returns_distinct_old_values():
    n, m = 4, 20_000
    arr = np.zeros(1, np.int64)
    outs = [np.empty(m, np.int64) for _ in range(n)]
    _collect_olds(arr, np.empty(1, np.int64))
    arr[0] = 0
    _run_threads(n, _collect_olds, lambda i: (arr, outs[i]))
    olds = np.sort(np.concatenate(outs))
    np.testing.assert_array_equal(olds, np.arange(n * m))
    assert arr[0] == n * m
    for o in outs:  # each thread's own sequence is strictly increasing
        assert np.all(np.diff(o) > 0)


def test_load_store_add():
    a = np.zeros(3, np.int64)
    A.store(a, 1, 42)
    assert a[1] == 42 and A.load(a, 1) == 42
    assert A.fetch_add(a, 1, -2) == 42 and a[1] == 40
    assert A.fetch_add(a, 2, 2**40) == 0 and a[2] == 2**40
    b = np.zeros(2, np.int32)
    A.store(b, 0, 3)
    assert A.load(b, 0) == 3 and A.fetch_add(b, 0, 1) == 3 and b[0] == 4


def test_index_and_type_errors():
    a = np.zeros(2, np.int64)
    with pytest.raises(IndexError):
        A.fetch_add(a, 2, 1)
    with pytest.raises(IndexError):
        A.load(a, -3)
    with pytest.raises(numba.core.errors.TypingError):
        A.fetch_add(np.zeros(2, np.float64), 0, 1)


def test_last_poster_closes_each_round():
    k, r = 4, 500
    counter = np.zeros(1, np.int64)
    round_no = np.zeros(1, np.int64)
    wins = [np.zeros(r, np.int64) for _ in range(k)]
    _post(np.zeros(1, np.int64), np.zeros(1, np.int64), 1, 0)  # compile outside the threads
    A.load(round_no, 0)
    _run_threads(k, _stage_thread, lambda i: (counter, round_no, k, r, wins[i]))
    total = np.sum(wins, axis=0)
    np.testing.assert_array_equal(total, np.ones(r, np.int64))  # exactly one closer per round
    assert counter[0] == 0 and round_no[0] == r


@numba.njit(nogil=True, parallel=True)
def _prange_hist(keys, counts):
    for i in numba.prange(keys.size):
        atomic_add(counts, keys[i], 1)


def test_atomic_add_inside_prange():
    keys = (np.arange(100_000) * 7919) % 5
    counts = np.zeros(5, np.int64)
    _prange_hist(keys, counts)
    np.testing.assert_array_equal(counts, np.bincount(keys, minlength=5))
