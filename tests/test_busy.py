"""The busy-machine note: shown when other processes keep the cores busy, not for this process's
own load, never for a single-thread run."""
import os
import subprocess
import sys
import time

import pytest

from nbrgc import threads


def test_note_names_a_smaller_thread_count_when_others_fill_the_cores(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    monkeypatch.setattr(threads, "runnable_others", lambda: 40)
    note = threads.busy_note(2, 2)
    assert note is not None and "--threads 1" in note and "busy" in note
    assert "--threads 4" in threads.busy_note(8, 8)


def test_no_note_on_an_idle_machine_or_for_one_thread(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.busy_note(2, 2) is None
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    assert threads.busy_note(1, 2) is None


def test_own_cpu_time_is_not_counted_as_others(monkeypatch):
    # a process that has kept 2 cores busy for its whole (long) life explains a load of 2 alone
    monkeypatch.setattr(threads, "_STARTED", threads.time.monotonic() - 3600.0)
    monkeypatch.setattr(os, "times", lambda: os.times_result((7200.0, 0.0, 0.0, 0.0, 0.0)))
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    assert threads.others_load() < 0.1
    assert threads.busy_note(2, 2) is None


def test_no_note_when_the_load_average_only_remembers_a_process_that_ended(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    monkeypatch.setattr(threads, "runnable_others", lambda: 0)
    assert threads.busy_note(2, 2) is None


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="Linux's /proc/loadavg")
def test_runnable_others_counts_busy_processes():
    # a busy loop is runnable whether or not it holds a core at the moment of a sample
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        assert threads.runnable_others() >= 2
    finally:
        for p in busy:
            p.kill()
            p.wait()
