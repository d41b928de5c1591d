"""The plan of a convergence study: its settings checked, the runs it consists of and the key each
run's result is filed under.

The plan is the whole sweep first (every learning rate of the grid on seed 0 at
``sweep_frac`` of the budget, with its own warm-up and cosine over the shorter run; the grid's
middle rate of every arm first, then outwards, rank by rank),
then the main runs seed by seed with every arm of a seed together, so an interrupted study leaves
complete pairs. A main run of an arm is planned as soon as that arm's sweep is complete (its best lr
is the one with the lowest final validation bpb; with ``extend_sweep`` a best lr at the edge of the
grid adds the next grid point beyond it, up to that many times per arm).

A finished run's result is a small JSON file in ``OUT/results/`` whose ``key`` holds everything
that determines it (arm, phase, seed, lr, model and training configs, the dataset's bytes, the test
protocol and the arm's numerics fingerprint, see :mod:`nbrgc.measure.study.fingerprint`); a later
invocation reuses every result whose key matches. The key's shape is a contract with every result
file already written (tests/test_study.py checks the stored ones): change it only on purpose.
"""
import hashlib
import json
import math
import os
import sys

from ...errors import ConfigError
from . import fingerprint as fp_mod
from .arms import ARMS, fits, model_config, train_config, with_references
from .runner import load_result

PHASES = ("sweep", "main", "all")
# Every arm's learning-rate sweep runs on seed 0 whatever --seeds lists, so an invocation for
# later seeds alone (--seeds 5,6) finds it and the rates it chose.
SWEEP_SEED = 0
_NOT_IN_KEY = ("log_every", "keep", "ckpt_every", "stage_workers", "attention", "threads",
               "stage_threads")
# TrainConfig fields added after studies were stored: in a key only where they differ from the
# value every earlier run had, so that those runs keep their keys
_KEY_IF_NOT = {"horizon": "0", "aux_weight": 1.0, "boundary_delay": 1, "delay_warmup": 0,
               "replay_weights": "current", "readout_blocks": 0,
               "delay_lr_power": 0.0, "optimizer": "adamw",
               "muon_momentum": 0.95, "grad_delay": 0}


def key_train_config(tc):
    """The TrainConfig fields a run's cache key holds."""
    return {k: v for k, v in tc.to_dict().items()
            if k not in _NOT_IN_KEY and not (k in _KEY_IF_NOT and v == _KEY_IF_NOT[k])}


def fmt_lr(lr):
    return f"{lr:.3g}"


def best_of(results):
    """The lr of the lowest final validation bpb among sweep results (diverged ones never win)."""
    ok = [r for r in results if r and not r.get("diverged") and r.get("val_bpb") is not None]
    return min(ok, key=lambda r: (r["val_bpb"], r["lr"]))["lr"] if ok else None


class StudyPlan:
    """What a study consists of: ``tasks()`` lists every run known now (the main runs appear as the
    sweeps complete), ``task()`` builds one run's spec and key, ``result()`` reads its result back."""

    def __init__(self, out, dataset="default", config="small", model_overrides=None, arms=None,
                 seeds=(0, 1, 2, 3, 4), tokens=5_000_000, steps=None,
                 sweep_lrs=(5e-4, 1e-3, 2e-3, 4e-3), sweep_frac=0.25, extend_sweep=2, margin=0.01,
                 conf=0.95, n_boot=10000, batch=None, warmup_frac=0.05, min_lr_frac=0.1,
                 eval_every=None, eval_batches=16, n_stages=None, threads=1, jobs=2, work=None,
                 phase="all", data_dir=None, test_bytes=None, plot=True, log=None, command=None,
                 verbose=False, dataset_obj=None):
        from ..bench.plan import default_n_stages
        from ...config import preset, preset_batch
        if not out:
            raise ConfigError("a study needs an output folder (--out DIR)")
        self.out = os.path.abspath(out)
        self.work = os.path.abspath(work) if work else os.path.join(self.out, "work")
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.config, self.dataset, self.data_dir = config, dataset, data_dir
        self.mcfg = preset(config, **(model_overrides or {}))
        self.arms = list(arms) if arms else None  # None: every arm that fits, once base is known
        unknown = [a for a in self.arms or () if a not in ARMS]
        if unknown:
            raise ConfigError(f"unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
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
        self.batch = batch if batch is not None else preset_batch(config)
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
        skip = [] if self.arms is not None else [a for a in ARMS if not fits(a, self.mcfg, self.base)]
        chosen = self.arms if self.arms is not None else [a for a in ARMS if a not in skip]
        self.arms = with_references(chosen)
        for arm in self.arms:  # every arm's config is valid before anything runs
            train_config(arm, self.base, SWEEP_SEED, self.sweep_lrs[0], self.steps,
                         self.eval_every).validate_for(model_config(arm, self.mcfg))
        self.left_out = skip  # Study.run says so: a bad flag's error stays the only line
        self._ds = dataset_obj
        self.fingerprints = None
        self.data_id = None  # data_key(), once run() has read the data

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

    def compute_fingerprints(self, arms=None):
        """{arm: numerics fingerprint} of every arm of the study, or of ``arms`` (see
        :mod:`nbrgc.measure.study.fingerprint`); each on the arm's own model config (bp-half trains
        half the layers)."""
        return {arm: fp_mod.scheme_fingerprint(model_config(arm, self.mcfg), self.fingerprint_config(arm))
                for arm in (self.arms if arms is None else arms)}

    def fingerprint_config(self, arm):
        """The TrainConfig an arm's fingerprint is computed from (a run's child checks it again)."""
        return train_config(arm, self.base, SWEEP_SEED, self.sweep_lrs[0], self.steps, self.eval_every)

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

    def code_version(self):
        fps = self.fingerprints or {}
        return hashlib.sha256(json.dumps(fps, sort_keys=True).encode()).hexdigest()[:16]

    def task(self, phase, arm, seed, lr):
        steps, every = ((self.sweep_steps, self.sweep_eval_every) if phase == "sweep"
                        else (self.steps, self.eval_every))
        tc = train_config(arm, self.base, seed, lr, steps, every)
        mcfg = model_config(arm, self.mcfg)
        key = {"arm": arm, "phase": phase, "seed": int(seed), "lr": float(lr),
               "model_config": mcfg.to_dict(),
               "train_config": key_train_config(tc),
               "data": self.data_id,
               "test": ({"metric": "sliding_bpb", "bytes": self.test_bytes} if phase == "main" else None),
               "code_version": self.fingerprints[arm]}
        name = f"{phase}-{arm}-s{seed}-lr{fmt_lr(lr)}"
        h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return {"name": name, "arm": arm, "phase": phase, "seed": int(seed), "lr": float(lr),
                "key": key, "model_config": mcfg.to_dict(), "train_config": tc.to_dict(),
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
            res = {lr: self.result(self.task("sweep", arm, SWEEP_SEED, lr)) for lr in grid}
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
        best, grids = {}, {}
        mid = math.log(self.sweep_lrs[len(self.sweep_lrs) // 2])
        for arm in self.arms:
            grid, res, b, _ = self.sweep_state(arm)
            best[arm] = b
            # the grid's middle rate first, then outwards
            grids[arm] = sorted(grid, key=lambda lr: (abs(math.log(lr) - mid), lr))
        if self.phase in ("sweep", "all"):
            # rank by rank across the arms: a study stopped part-way has the likeliest rate of every
            # arm before a second rate of any
            for r in range(max(len(g) for g in grids.values())):
                out += [self.task("sweep", arm, SWEEP_SEED, grids[arm][r])
                        for arm in self.arms if r < len(grids[arm])]
        if self.phase in ("main", "all"):
            for s in self.seeds:
                for arm in self.arms:
                    if best[arm] is not None:
                        out.append(self.task("main", arm, s, best[arm]))
        return out, best
