"""A harness that shows threads really contended: Python threads, each running one nogil compiled loop,
released together. Each loop also bumps a plain (non-atomic) counter; lost plain increments prove the
loops overlapped in that very run, so an exact atomic count beside them means something.

Overlap is produced by construction, not hoped for: every loop (see ``overlap_loop`` in the tests)
publishes its own progress and keeps going until EVERY thread has done at least ``m`` iterations, so
however the threads are scheduled (a busy machine may start them one after another, or time-slice
them on one free core) each is still looping while the slowest does its first ``m``. And the plain
counter's read and write straddle the atomic operation, so a thread preempted or overtaken between
them loses the other threads' increments: one such moment in a run is enough."""
import os
import threading

import pytest

ATTEMPTS = 5  # a run on a loaded machine may happen to run the loops one after another
# NBRGC_CONTENTION_REPEAT=N checks each contention test N times in one test call: how the suite
# shows, inside a full (loaded, parallel) run, that the harness never lacks contention
REPEAT = max(1, int(os.environ.get("NBRGC_CONTENTION_REPEAT", "1") or 1))


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_threads(n, target, args_for):
    """Run ``target(*args_for(i))`` in n threads, released together by a barrier."""
    barrier = threading.Barrier(n)

    def body(*args):
        barrier.wait()
        target(*args)

    ts = [threading.Thread(target=body, args=args_for(i)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
        assert not t.is_alive(), "worker thread hung"


def contended(run_once):
    """Call ``run_once()`` (it returns the plain counter's final value and the number of increments
    the threads made) until a run loses plain increments, at most ATTEMPTS times; returns the
    attempt numbers (one per repeat, NBRGC_CONTENTION_REPEAT). Skips on one core; fails if no run
    of a repeat showed an overlap."""
    if usable_cores() < 2:
        pytest.skip("one usable core: threads never run at the same time, contention cannot be produced")
    return [_contended_once(run_once) for _ in range(REPEAT)]


def _contended_once(run_once):
    seen = []
    for attempt in range(ATTEMPTS):
        plain, expected_plain = run_once()
        assert 0 < plain <= expected_plain  # a plain counter may lose increments, never gain any
        if plain < expected_plain:
            return attempt
        seen.append(plain)
    pytest.fail(f"{ATTEMPTS} runs on {usable_cores()} cores never overlapped (plain counts {seen}): "
                "the harness does not produce contention")
