"""Running a convergence study: parallel child processes, results copied between twin arms,
resumption and signals, and the report rebuilt after every finished run.

Each run is a child process (``python -m nbrgc.measure.study SPEC``, see
:mod:`nbrgc.measure.study.runner`), ``jobs`` at a time, each at ``threads`` threads, in its own
Trainer run folder under ``work`` (checkpoints at every evaluation, resumed from the newest). What
runs and under which key is :mod:`nbrgc.measure.study.plan`'s; a later invocation computes only the
results that are missing. SIGINT/SIGTERM stop the children at a checkpoint; running the same command
again resumes them.
"""
import math
import os
import signal
import subprocess
import sys
import time

from ...atomic import write_json
from ...errors import NbrgcError
from . import fingerprint as fp_mod
from .plan import StudyPlan, fmt_lr
from .runner import EXIT_BUSY, EXIT_OK, EXIT_STOPPED, RunStopped, run_one


class StudyInterrupted(NbrgcError):
    """The study was stopped (SIGINT/SIGTERM) after its runs checkpointed; rerunning resumes it."""


def _eta(seconds):
    if seconds is None or not math.isfinite(seconds):
        return "–"
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


class Study(StudyPlan):
    """``Study(out=..., ...).run()`` runs what is missing and writes study.json/study.md/curves.png."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._procs = {}
        self._stop = None

    def _fill_twins(self, todo):
        """Copy the finished results of twin arms into the missing ones; returns the names still
        waiting on their twin (not to be started)."""
        waiting = set()
        for t in todo:
            src_arm = self.twin_of(t["arm"])
            if src_arm is None:
                continue
            src = self.result(self.task(t["phase"], src_arm, t["seed"], t["lr"]))
            if src is None:
                waiting.add(t["name"])
                continue
            res = dict(src, key=t["key"], name=t["name"], arm=t["arm"], twin_of=src_arm, this_call_s=0.0)
            os.makedirs(os.path.dirname(t["result"]), exist_ok=True)
            write_json(t["result"], res)
            self.log(f"  {t['name']}: the same numerics fingerprint as {src_arm}: its result copied")
        return waiting

    def _start(self, task):
        os.makedirs(task["work"], exist_ok=True)
        spec_path = os.path.join(task["work"], "spec.json")
        write_json(spec_path, {k: v for k, v in task.items()})
        logf = open(os.path.join(task["work"], "child.log"), "a")
        import nbrgc
        root = os.path.dirname(os.path.dirname(os.path.abspath(nbrgc.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        proc = subprocess.Popen([sys.executable, "-m", "nbrgc.measure.study", spec_path],
                                stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        logf.close()
        return proc

    def _child_error(self, task):
        try:
            with open(os.path.join(task["work"], "child.log")) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            return "no log"
        errs = [ln for ln in lines if ln.startswith(("error:", "Traceback"))] or lines
        return errs[-1] if errs else "no output"

    def _install_signals(self):
        import threading
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            if self._stop is None:
                self._stop = signal.Signals(signum).name
                self.log(f"received {self._stop}: stopping the running runs at a checkpoint "
                         "(rerun the same command to resume)")
            for _, proc in list(self._procs.values()):
                try:
                    proc.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return old

    def report_only(self):
        """The report of what results/ holds, written as run() writes it; runs nothing."""
        os.makedirs(os.path.join(self.out, "results"), exist_ok=True)
        self.data_id = self.data_key()
        self.fingerprints = self.compute_fingerprints()  # the runs' keys depend on them
        return self.write_report(())

    def run(self):
        """Run what is missing (``jobs`` child processes at a time; 0: one after another in this
        process) and return the report. Raises StudyInterrupted after a stop."""
        os.makedirs(os.path.join(self.out, "results"), exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        self.data_id = self.data_key()
        t0 = time.perf_counter()
        if self.left_out:
            self.log(f"nbrgc-study: --arms all: {', '.join(self.left_out)} cannot run on {self.config} "
                     f"({self.mcfg.n_layer} layers): left out")
        self.log(f"nbrgc-study: numerics fingerprints of {len(self.arms)} arm(s) (float64, "
                 f"{fp_mod.FP_STEPS} steps)...")
        self.fingerprints = self.compute_fingerprints()
        self.log("  " + ", ".join(f"{a} {v}" for a, v in self.fingerprints.items())
                 + f" ({time.perf_counter() - t0:.1f} s)")
        tasks, _ = self.tasks()
        cached = sum(1 for t in tasks if self.result(t) is not None)
        self.log(f"{len(tasks)} run(s) known now, {cached} cached; {self.jobs or 1} at a time, "
                 f"{self.base['threads']} thread(s) each; work folder {self.work}")
        failed, busy, computed = set(), set(), []
        started = time.perf_counter()
        done_tokens = 0
        self._stop = None
        old = self._install_signals() if self.jobs else None
        self.write_report(computed)
        try:
            while True:
                tasks, _ = self.tasks()
                todo = [t for t in tasks if self.result(t) is None]
                twins_waiting = self._fill_twins(todo)
                todo = [t for t in todo if self.result(t) is None]
                ready = [t for t in todo if t["name"] not in self._procs and t["name"] not in failed
                         and t["name"] not in busy and t["name"] not in twins_waiting]
                if self._stop is None and ready and len(self._procs) < max(1, self.jobs):
                    t = ready[0]
                    n_done = len(tasks) - len(todo)
                    self.log(f"[{n_done}/{len(tasks)} done] start {t['phase']} {t['arm']} seed {t['seed']} "
                             f"lr {fmt_lr(t['lr'])} ({t['tokens']:,} tokens"
                             f"{', resuming' if os.path.exists(os.path.join(t['work'], 'run.json')) else ''})")
                    if self.jobs == 0:
                        try:
                            res = run_one(dict(t, dataset_obj=self.data()), log=self.log)
                        except RunStopped as exc:
                            self._stop = str(exc)
                            break
                        except NbrgcError as exc:
                            failed.add(t["name"])
                            self.log(f"  {t['name']} failed: {exc}")
                            continue
                        done_tokens += t["tokens"]
                        computed.append(t["name"])
                        self._finished(t, res, tasks, todo, started, done_tokens)
                        self.write_report(computed)
                    else:
                        self._procs[t["name"]] = (t, self._start(t))
                    continue
                if not self._procs:
                    break
                time.sleep(0.5)
                for name, (t, proc) in list(self._procs.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    del self._procs[name]
                    res = self.result(t)
                    if rc == EXIT_OK and res is not None:
                        done_tokens += t["tokens"]
                        computed.append(name)
                        tasks, _ = self.tasks()
                        todo = [x for x in tasks if self.result(x) is None]
                        self._finished(t, res, tasks, todo, started, done_tokens)
                        self.write_report(computed)
                    elif rc == EXIT_STOPPED:
                        self.log(f"  {name}: stopped at a checkpoint")
                    elif rc == EXIT_BUSY:
                        busy.add(name)
                        self.log(f"  {name}: its run folder is in use by another process; skipped")
                    else:
                        failed.add(name)
                        self.log(f"  {name} failed (exit {rc}): {self._child_error(t)} "
                                 f"(log: {os.path.join(t['work'], 'child.log')})")
        finally:
            if self._procs:  # an exception in this loop: the children stop at a checkpoint
                for t, proc in self._procs.values():
                    proc.send_signal(signal.SIGTERM)
                for t, proc in self._procs.values():
                    proc.wait()
                self._procs = {}
            if old:
                for s, h in old.items():
                    signal.signal(s, h)
        report = self.write_report(computed)
        if self._stop is not None:
            raise StudyInterrupted(f"{self._stop}: the running runs checkpointed; rerun the same "
                                   "command to resume")
        if failed:
            raise NbrgcError(f"{len(failed)} run(s) failed ({', '.join(sorted(failed))}); see their "
                             "child.log in the work folder; the report covers the others")
        return report

    def _finished(self, t, res, tasks, todo, started, done_tokens):
        rest = sum(x["tokens"] for x in todo)
        rate = done_tokens / max(1e-9, time.perf_counter() - started)
        what = ("diverged" if res.get("diverged") else f"val bpb {res['val_bpb']:.4f}"
                + (f", test bpb {res['test_bpb']:.4f}" if res.get("test_bpb") is not None else ""))
        self.log(f"[{len(tasks) - len(todo)}/{len(tasks)} done] finished {t['phase']} {t['arm']} seed "
                 f"{t['seed']} lr {fmt_lr(t['lr'])}: {what} in {res['this_call_s']:.0f} s; "
                 f"ETA {_eta(rest / rate if rate > 0 else None)} for the {len(todo)} run(s) known now")

    def write_report(self, computed=()):
        from . import report as rep_mod
        from .widen import report_scope
        with report_scope(self):  # the folder's other arms and seeds stay in the report
            rep = rep_mod.build(self, computed)
        rep_mod.write(rep, self.out, plot=self.plot)
        return rep
