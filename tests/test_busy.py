"""The busy-machine note: shown when other processes keep the cores busy, not for this process's
own load, never for a single-thread run."""
import os

from nbrgc import threads


def test_note_names_a_smaller_thread_count_when_others_fill_the_cores(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
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
