"""The convergence study: plan, per-arm learning-rate sweep, paired main runs, parallel child
processes, cached results, resumption and signals.

Order of work: the whole sweep first (arm by arm, bp first, every learning rate of the grid on the
first seed at ``sweep_frac`` of the budget, with its own warm-up and cosine over the shorter run),
then the main runs seed by seed with every arm of a seed together, so an interrupted study leaves
complete pairs. A main run of an arm starts as soon as that arm's sweep is complete (its best lr
is the one with the lowest final validation bpb; with ``extend_sweep`` a best lr at the edge of the
grid adds the next grid point beyond it, up to that many times per arm).

Each run is a child process (``python -m nbrgc.measure.study SPEC``, see
:mod:`nbrgc.measure.study.runner`), ``jobs`` at a time, each at ``threads`` threads, in its own Trainer run folder under ``work`` (checkpoints at every evaluation,
resumed from the newest). A finished run's result is a small JSON file in ``OUT/results/`` whose
``key`` holds everything that determines it (arm, phase, seed, lr, model and training configs, the
dataset's bytes, the test protocol and the arm's numerics fingerprint, see
:mod:`nbrgc.measure.study.fingerprint`); a later invocation reuses every result whose key matches and
computes only what is missing. SIGINT/SIGTERM stop the children at a checkpoint; running the same
command again resumes them.
"""
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

from ...atomic import write_json
from ...errors import ConfigError, NbrgcError
from . import fingerprint as fp_mod
from .arms import ARMS, BASE, train_config
from .runner import EXIT_BUSY, EXIT_OK, EXIT_STOPPED, RunStopped, load_result, run_one

PHASES = ("sweep", "main", "all")
_NOT_IN_KEY = ("log_every", "keep", "ckpt_every", "stage_workers", "attention", "threads",
               "stage_threads")


class StudyInterrupted(NbrgcError):
    """The study was stopped (SIGINT/SIGTERM) after its runs checkpointed; rerunning resumes it."""


def _fmt_lr(lr):
    return f"{lr:.3g}"


def _eta(seconds):
    if seconds is None or not math.isfinite(seconds):
        return "–"
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


def best_of(results):
    """The lr of the lowest final validation bpb among sweep results (diverged ones never win)."""
    ok = [r for r in results if r and not r.get("diverged") and r.get("val_bpb") is not None]
    return min(ok, key=lambda r: (r["val_bpb"], r["lr"]))["lr"] if ok else None


class Study:
    """``Study(out=..., ...).run()`` runs what is missing and writes study.json/study.md/curves.png."""

    def __init__(self, out, dataset="default", config="small", model_overrides=None, arms=None,
                 seeds=(0, 1, 2, 3, 4), tokens=5_000_000, steps=None,
                 sweep_lrs=(5e-4, 1e-3, 2e-3, 4e-3), sweep_frac=0.25, extend_sweep=2, margin=0.01,
                 conf=0.95, n_boot=10000, batch=None, warmup_frac=0.05, min_lr_frac=0.1,
                 eval_every=None, eval_batches=16, n_stages=None, threads=1, jobs=2, work=None,
                 phase="all", data_dir=None, test_bytes=None, plot=True, log=None, command=None,
                 verbose=False, dataset_obj=None):
        from ..bench.plan import default_n_stages
        from ...config import PRESET_BATCH, preset
        if not out:
            raise ConfigError("a study needs an output folder (--out DIR)")
        self.out = os.path.abspath(out)
        self.work = os.path.abspath(work) if work else os.path.join(self.out, "work")
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.config, self.dataset, self.data_dir = config, dataset, data_dir
        self.mcfg = preset(config, **(model_overrides or {}))
        self.arms = list(arms) if arms else list(ARMS)
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ConfigError(f"unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
        self.arms = [BASE] + [a for a in ARMS if a in self.arms and a != BASE]
        self.seeds = list(seeds)
        if not self.seeds:
            raise ConfigError("a study needs at least one seed")
        self.sweep_lrs = sorted(float(v) for v in sweep_lrs)
        if len(self.sweep_lrs) < 3:
            raise ConfigError(f"the sweep needs at least 3 learning rates, got {len(self.sweep_lrs)}")
        if not 0 < sweep_frac <= 1:
            raise ConfigError(f"sweep_frac must be in (0, 1], got {sweep_frac}")
        if extend_sweep < 0:
            raise ConfigError(f"extend_sweep must be >= 0, got {extend_sweep}")
        if phase not in PHASES:
            raise ConfigError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
        if jobs < 0:
            raise ConfigError(f"jobs must be >= 0 (0: in this process), got {jobs}")
        if not (math.isfinite(margin) and margin > 0):
            raise ConfigError(f"margin must be a finite number > 0, got {margin!r}")
        if test_bytes is not None and test_bytes < 2:
            raise ConfigError(f"test_bytes must be >= 2, got {test_bytes}")
        self.sweep_frac, self.extend_sweep, self.phase, self.jobs = sweep_frac, extend_sweep, phase, jobs
        self.margin, self.conf, self.n_boot, self.test_bytes = margin, conf, n_boot, test_bytes
        self.plot, self.command, self.verbose = plot, command, verbose
        self.batch = batch if batch is not None else PRESET_BATCH.get(config, 8)
        self.seq = self.mcfg.ctx
        per_step = self.batch * self.seq
        if steps is None:
            if tokens is None or tokens < 1:
                raise ConfigError(f"tokens must be >= 1, got {tokens}")
            steps = max(1, -(-int(tokens) // per_step))
        if steps < 1:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        self.steps = int(steps)
        self.sweep_steps = max(1, int(round(self.steps * sweep_frac)))
        self.eval_every = int(eval_every) if eval_every else max(1, self.steps // 25)
        if self.eval_every < 1:
            raise ConfigError(f"eval_every must be >= 1, got {eval_every}")
        self.sweep_eval_every = max(1, int(round(self.eval_every * sweep_frac)))
        self.base = dict(batch=self.batch, seq=0, min_lr_frac=min_lr_frac, warmup_frac=warmup_frac,
                         eval_batches=eval_batches, threads=threads,
                         n_stages=n_stages or default_n_stages(self.mcfg.n_layer),
                         keep=1, ckpt_every=0, log_every=max(1, min(10, self.steps)))
        for arm in self.arms:  # every arm's config is valid before anything runs
            train_config(arm, self.base, self.seeds[0], self.sweep_lrs[0], self.steps,
                         self.eval_every).validate_for(self.mcfg)
        self._ds = dataset_obj
        self.fingerprints = None
        self._procs = {}
        self._stop = None

    # ------------------------------------------------------------------ pieces
    def data(self):
        if self._ds is None:
            from ...data import load_dataset
            self._ds = load_dataset(self.dataset, data_dir=self.data_dir, log=self.log, seq=self.seq)
        return self._ds

    def data_key(self):
        ds = self.data()
        h = hashlib.sha256()
        for split in (ds.train, ds.val, ds.test):
            h.update(memoryview(split).tobytes())
        return {"name": os.path.basename(str(self.dataset)) if self.dataset else ds.name,
                "sha256": h.hexdigest()[:16], "bytes": [len(ds.train), len(ds.val), len(ds.test)]}

    def compute_fingerprints(self):
        """{arm: numerics fingerprint} of every arm (see :mod:`nbrgc.measure.study.fingerprint`)."""
        return {arm: fp_mod.scheme_fingerprint(self.mcfg, self.fingerprint_config(arm))
                for arm in self.arms}

    def fingerprint_config(self, arm):
        """The TrainConfig an arm's fingerprint is computed from (a run's child checks it again)."""
        return train_config(arm, self.base, self.seeds[0], self.sweep_lrs[0], self.steps, self.eval_every)

    def twin_of(self, arm):
        """The first earlier arm whose numerics fingerprint equals ``arm``'s, or None. Such arms train
        the same bits (rgc-async with S = 0 and rgc-sync at one thread run the same calls on the same
        shapes: tests/test_schemes.py), so their runs are computed once and the result copied."""
        fps = self.fingerprints or {}
        if self.base["threads"] != 1:  # the fingerprint runs one thread; groups of more split sums
            return None
        for other in self.arms:
            if other == arm:
                return None
            if fps.get(other) is not None and fps.get(other) == fps.get(arm):
                return other
        return None

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

    def code_version(self):
        fps = self.fingerprints or {}
        return hashlib.sha256(json.dumps(fps, sort_keys=True).encode()).hexdigest()[:16]

    def task(self, phase, arm, seed, lr):
        steps, every = ((self.sweep_steps, self.sweep_eval_every) if phase == "sweep"
                        else (self.steps, self.eval_every))
        tc = train_config(arm, self.base, seed, lr, steps, every)
        key = {"arm": arm, "phase": phase, "seed": int(seed), "lr": float(lr),
               "model_config": self.mcfg.to_dict(),
               "train_config": {k: v for k, v in tc.to_dict().items() if k not in _NOT_IN_KEY},
               "data": self._data_key,
               "test": ({"metric": "sliding_bpb", "bytes": self.test_bytes} if phase == "main" else None),
               "code_version": self.fingerprints[arm]}
        name = f"{phase}-{arm}-s{seed}-lr{_fmt_lr(lr)}"
        h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return {"name": name, "arm": arm, "phase": phase, "seed": int(seed), "lr": float(lr),
                "key": key, "model_config": self.mcfg.to_dict(), "train_config": tc.to_dict(),
                "dataset": self.dataset, "data_dir": self.data_dir, "score_test": phase == "main",
                "test_bytes": self.test_bytes, "verbose": self.verbose,
                "fingerprint_config": self.fingerprint_config(arm).to_dict(),
                "work": os.path.join(self.work, f"{name}-{h}"),
                "result": os.path.join(self.out, "results", f"{name}.json"),
                "tokens": steps * self.batch * self.seq}

    def result(self, task):
        return load_result(task["result"], task["key"])

    def sweep_state(self, arm):
        """(grid, results by lr, best lr or None while incomplete, at_edge) for ``arm``."""
        grid = list(self.sweep_lrs)
        ratio = grid[1] / grid[0]
        extended = 0
        while True:
            res = {lr: self.result(self.task("sweep", arm, self.seeds[0], lr)) for lr in grid}
            if any(r is None for r in res.values()):
                return grid, res, None, False
            best = best_of(list(res.values()))
            if best is None:
                return grid, res, None, False
            at_edge = (best == grid[0] and len(grid) > 1) or best == grid[-1]
            if not at_edge or extended >= self.extend_sweep:
                return grid, res, best, at_edge
            grid = sorted(grid + [best * ratio if best == grid[-1] else best / ratio])
            extended += 1

    def tasks(self):
        """Every task the study knows of now, in priority order, with its state (done, waiting)."""
        out = []
        best = {}
        for arm in self.arms:
            grid, res, b, _ = self.sweep_state(arm)
            best[arm] = b
            if self.phase in ("sweep", "all"):
                out += [self.task("sweep", arm, self.seeds[0], lr) for lr in grid]
        if self.phase in ("main", "all"):
            for s in self.seeds:
                for arm in self.arms:
                    if best[arm] is not None:
                        out.append(self.task("main", arm, s, best[arm]))
        return out, best

    # ------------------------------------------------------------------ running
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

    def run(self):
        """Run what is missing (``jobs`` child processes at a time; 0: one after another in this
        process) and return the report. Raises StudyInterrupted after a stop."""
        from . import report as rep_mod
        os.makedirs(os.path.join(self.out, "results"), exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        self._data_key = self.data_key()
        t0 = time.perf_counter()
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
                             f"lr {_fmt_lr(t['lr'])} ({t['tokens']:,} tokens"
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
                 f"{t['seed']} lr {_fmt_lr(t['lr'])}: {what} in {res['this_call_s']:.0f} s; "
                 f"ETA {_eta(rest / rate if rate > 0 else None)} for the {len(todo)} run(s) known now")

    def write_report(self, computed=()):
        from . import report as rep_mod
        rep = rep_mod.build(self, computed)
        rep_mod.write(rep, self.out, plot=self.plot)
        return rep
