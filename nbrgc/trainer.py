"""The loop every scheme shares: schedule, batches, evaluation, logging, checkpoints, signals.

    import nbrgc
    summary = nbrgc.train(nbrgc.preset("small"), nbrgc.TrainConfig(mode="rgc-async", steps=500),
                          data="default", out="runs/small")

One JSON object per log line (``step``, ``loss``, ``bpb``, ``lr``, ``tokens_per_s``, ``elapsed_s``,
``val_bpb`` when evaluated); the last is the summary (``summary: true``, ``val_bpb``, ``tokens``,
``wall_s``, ``tokens_per_s``, ``peak_rss_mib``, ``checkpoint``). These keys are stable.
"""
import json
import math
import os
import signal
import sys
import threading
import time

import numpy as np

from . import checkpoint as ckpt
from .atomic import write_json
from .config import ModelConfig, TrainConfig
from .errors import ConfigError, NbrgcError
from .evaluate import LN2, evaluate
from .local import identity_init, split_stages
from .memory import available_bytes, estimate, fmt_mib, peak_rss_mib
from .model import Model
from .optim import lr_at
from .schemes import make_scheme
from .threads import cpu_count, describe, limit_blas, set_threads

CONFIG_FILE = "run.json"


class FaultHook:
    """Fault injection for tests; nbrgc-train builds one from the environment variable NBRGC_FAULT.

    ``raise:STAGE:STEP`` raises RuntimeError in that stage at that 0-based step (the step numbering
    of error messages; the JSON log's ``step`` is that + 1); ``nan:STAGE:STEP`` fills that stage's
    block parameters with NaN for that one step (restored when the stage starts its next step).
    Join several with ``,``. bp has one stage, 0. rgc-async calls the hook in the stage's worker
    thread; bp and rgc-sync call it for every stage before the step."""

    def __init__(self, spec):
        self.faults, self.saved, self.flat, self.ranges = set(), {}, None, None
        for part in str(spec).split(","):
            bits = part.strip().split(":")
            if len(bits) != 3 or bits[0] not in ("raise", "nan") or not all(
                    b.strip().isdigit() for b in bits[1:]):
                raise ConfigError(f"NBRGC_FAULT: expected raise:STAGE:STEP or nan:STAGE:STEP, got {part!r}")
            self.faults.add((bits[0], int(bits[1]), int(bits[2])))

    def bind(self, model, ranges):
        self.flat, self.ranges = model.flat, ranges

    def __call__(self, k, t):
        if k in self.saved:
            lo, hi, old = self.saved.pop(k)
            self.flat[lo:hi] = old
        if ("raise", k, t) in self.faults:
            raise RuntimeError(f"injected fault in stage {k} at step {t} (NBRGC_FAULT)")
        if ("nan", k, t) in self.faults and self.ranges is not None and k < len(self.ranges):
            lo, hi = self.ranges[k]
            self.saved[k] = (lo, hi, self.flat[lo:hi].copy())
            self.flat[lo:hi] = np.nan


def _resolve_data(data, log):
    from .data import Dataset, load_dataset
    if isinstance(data, Dataset):
        return data
    if isinstance(data, np.ndarray):
        n = len(data)
        cut = int(n * 0.9)
        return Dataset(name="array", train=data[:cut], val=data[cut:], test=data[cut:], source="array")
    return load_dataset(data if data is not None else "default", log=log)


class Trainer:
    """A training run. ``run()`` returns the summary dict; ``request_stop()`` asks it to checkpoint and
    return at the next step (what SIGINT/SIGTERM do)."""

    def __init__(self, model_cfg, train_cfg, data=None, out=None, *, resume=False, force=False,
                 json_lines=False, progress=True, log=None, max_memory=None, fault_hook=None,
                 stream=None, data_spec=None, time_limit=None):
        if not isinstance(model_cfg, ModelConfig):
            raise ConfigError("model_cfg must be a ModelConfig (see nbrgc.preset)")
        if not isinstance(train_cfg, TrainConfig):
            raise ConfigError("train_cfg must be a TrainConfig")
        self.mcfg, self.tc = model_cfg, train_cfg.for_model(model_cfg)
        self.seq = train_cfg.validate_for(model_cfg)
        self.out = out
        self.resume, self.force = resume, force
        self.json_lines, self.progress = json_lines, progress
        self.stream = stream or sys.stdout
        self._human = log
        self.max_memory = max_memory
        self.fault_hook = fault_hook
        self.time_limit = time_limit
        self.data_spec = data_spec if data_spec is not None else (data if isinstance(data, str) else None)
        self._stop = threading.Event()
        self._stop_reason = None
        self.data = _resolve_data(data, self.info)
        for split in ("train", "val"):
            arr = getattr(self.data, split)
            if len(arr) < self.seq + 1:
                raise NbrgcError(f"{split} split of {self.data.name} has {len(arr)} bytes; a window of "
                                 f"seq {self.seq} needs at least {self.seq + 1}")

    # ------------------------------------------------------------------ output
    def info(self, msg):
        """Human-readable notes go to stderr (stdout carries the JSON lines with --json)."""
        if self._human is not None:
            self._human(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    def emit(self, rec):
        if self.json_lines:
            self.stream.write(json.dumps(rec) + "\n")
            self.stream.flush()
        if self._logf is not None:
            self._logf.write(json.dumps(rec) + "\n")
            self._logf.flush()

    def request_stop(self, reason="stop requested"):
        self._stop_reason = reason
        self._stop.set()

    # ------------------------------------------------------------------ set-up
    def _run_meta(self):
        return {"model_config": self.mcfg.to_dict(), "mode": self.tc.mode,
                "n_stages": self.tc.n_stages if self.tc.mode != "bp" else 1,
                "batch": self.tc.batch, "seq": self.seq, "seed": self.tc.seed}

    def _prepare_out(self):
        if self.out is None:
            return
        try:
            os.makedirs(self.out, exist_ok=True)
        except OSError as exc:
            raise NbrgcError(f"cannot use {self.out} as the run folder: {exc.strerror or exc}") from None
        path = os.path.join(self.out, CONFIG_FILE)
        mine = {"model_config": self.mcfg.to_dict(), "train_config": self.tc.to_dict(),
                "data": self.data_spec or self.data.name}
        if os.path.exists(path) and not self.force:
            try:
                with open(path) as f:
                    theirs = json.load(f)
                if not isinstance(theirs, dict):
                    raise ValueError
            except (OSError, ValueError):
                raise NbrgcError(f"{path} is unreadable; pass --force to start a new run there") from None
            if not self.resume:
                raise NbrgcError(f"{self.out} already holds a run; pass --resume to continue it or "
                                 "--force to start over")
            for key in ("model_config",):
                if theirs.get(key) != mine[key]:
                    raise NbrgcError(f"{self.out} holds a run with another {key.replace('_', ' ')}; "
                                     "use another --out or --force")
        if self.force and not self.resume:  # starting over: a later --resume must not find the old run
            old = ckpt.list_checkpoints(self.out)
            for p in old:
                try:
                    os.remove(p)
                except OSError as exc:
                    raise NbrgcError(f"--force: cannot remove {p}: {exc.strerror or exc}") from None
            if old:
                self.info(f"--force: removed {len(old)} checkpoint(s) of the previous run in {self.out}")
        write_json(path, mine)

    def _check_memory(self, nt):
        est = estimate(self.mcfg, self.tc, self.tc.batch, self.seq, nt)
        limit = self.max_memory if self.max_memory is not None else available_bytes()
        if est["total"] > limit:
            raise NbrgcError(f"this run needs about {fmt_mib(est['total'])} but "
                             f"{'--max-memory allows' if self.max_memory is not None else 'only'} "
                             f"{fmt_mib(limit)}{'' if self.max_memory is not None else ' are available'}"
                             "; lower --batch/--seq/--n-layer or pass --max-memory")
        self.info("expected memory: " + ", ".join(f"{k} {fmt_mib(v)}" for k, v in est.items()))
        return est

    def _make_scheme(self, model):
        return make_scheme(model, self.tc, fault_hook=self.fault_hook, log=self.info)

    def _agree_stop(self, step, time_up):
        """Whether the run stops for time after this step. One process decides alone; ranks of an
        MPI job must agree on it and on a requested stop (nbrgc.distributed.run)."""
        return time_up

    # ------------------------------------------------------------------ the run
    def run(self):
        from .data import Batches, eval_batches
        tc, mcfg = self.tc, self.mcfg
        t_start = time.perf_counter()
        self._logf = None
        self._prepare_out()
        if self.out is not None:
            self._logf = open(os.path.join(self.out, "log.jsonl"), "a")
        budget = tc.threads or cpu_count()
        limit_blas(1)
        nt = set_threads(budget)
        est = self._check_memory(nt)
        self.info(f"nbrgc: {describe()}")
        self.info(f"model {mcfg.to_dict()} | mode {tc.mode} | batch {tc.batch} x seq {self.seq} | "
                  f"steps {tc.steps} | data {self.data.name} ({len(self.data.train):,} train bytes)")
        model = Model(mcfg, seed=tc.seed, attention=tc.attention)
        self.info(f"parameters: {model.n_params:,}")
        scheme = self._make_scheme(model)
        stages = split_stages(mcfg.n_layer, tc.n_stages if tc.mode != "bp" else 1)
        if tc.mode != "bp" and tc.stage_init == "identity":
            identity_init(model, stages)
        if hasattr(self.fault_hook, "bind"):
            self.fault_hook.bind(model, [model.layout.block_range(lo, hi) for lo, hi in stages])
        batches = Batches(self.data.train, tc.batch, self.seq, seed=tc.seed)
        held_out = eval_batches(self.data.val, tc.batch, self.seq, tc.eval_batches, seed=tc.seed + 1)
        start, restored = 0, None
        if self.resume and self.out is not None:
            start, restored = self._restore(model, scheme, batches)
        if tc.mode == "rgc-async":
            scheme.tune(tc.batch, self.seq)
            self.info(f"stage thread groups: {scheme.groups} (budget {budget}) on {scheme.W} worker(s) "
                      f"(stage k on worker k mod {scheme.W}), max staleness {tc.max_staleness}")
        eval_ws = scheme.eval_workspace(self.tc.batch, self.seq)
        handlers = self._install_signals()
        tokens_per_step = tc.batch * self.seq
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=tc.steps, initial=start, unit="step", file=sys.stderr, dynamic_ncols=True,
                       disable=None)
        train_time, timed_tokens, last_eval, last_ckpt = 0.0, 0, None, None
        if start >= tc.steps:  # e.g. killed after its final checkpoint, before it could exit
            last_ckpt = restored
            self.info(f"the run already reached step {start} of {tc.steps}: nothing to train "
                      f"(final checkpoint {last_ckpt})")
        step, done = start, start
        seg_t0 = time.perf_counter()
        first_timed = start + 1  # the first step of a process loads kernels: not throughput

        def report(results, now):
            nonlocal done, timed_tokens
            for r in results:
                done = r.step + 1
                if r.step >= first_timed:
                    timed_tokens += tokens_per_step
                rec = {"step": done, "loss": r.loss, "bpb": r.loss / LN2, "lr": lr_at(r.step, tc),
                       "grad_norm": r.grad_norm,
                       "tokens_per_s": timed_tokens / max(1e-9, train_time + now - seg_t0)
                       if timed_tokens else 0.0,
                       "elapsed_s": now - t_start}
                if len(r.stage_losses) > 1:
                    rec["stage_bpb"] = [v / LN2 for v in r.stage_losses]
                if r.skipped:
                    rec["skipped"] = True
                if done % tc.log_every == 0 or done == tc.steps:
                    self.emit(rec)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{r.loss:.3f}", bpb=f"{r.loss / LN2:.3f}",
                                    tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)

        try:
            while step < tc.steps and not self._stop.is_set():
                x, y = batches.next()
                t_sub = time.perf_counter()
                if step == first_timed:
                    seg_t0 = t_sub
                if self.fault_hook is not None and tc.mode != "rgc-async":
                    for k in range(len(stages)):
                        self.fault_hook(k, step)
                scheme.submit(step, x, y, lr_at(step, tc))
                step += 1
                results = scheme.poll()
                time_up = self.time_limit is not None and time.perf_counter() - t_start >= self.time_limit
                time_up = self._agree_stop(step, time_up)
                # decided once, before the results are reported: a stop requested while reporting
                # (a signal, a callback) must not save a pipeline that has not been drained
                pause = bool((tc.eval_every and step % tc.eval_every == 0) or step == tc.steps or (
                    tc.ckpt_every and step % tc.ckpt_every == 0) or time_up or self._stop.is_set())
                if pause:
                    results += scheme.drain()
                now = time.perf_counter()
                report(results, now)
                if pause:
                    if step > first_timed:
                        train_time += now - seg_t0
                    if (tc.eval_every and step % tc.eval_every == 0) or step == tc.steps or time_up:
                        last_eval = self._evaluate(model, held_out, stages, eval_ws, step, t_start)
                    last_ckpt = self._save(model, scheme, batches, step) or last_ckpt
                    seg_t0 = time.perf_counter()
                    if time_up:
                        break
        except KeyboardInterrupt:
            self.request_stop("interrupted")
        except BaseException:
            self._restore_signals(handlers)
            raise
        finally:
            try:
                results = scheme.drain()
            except BaseException:
                self._restore_signals(handlers)
                raise
            finally:
                scheme.close()
        # steps finished after the last pause (a stop between boundaries) are logged like the others
        now = time.perf_counter()
        if results and step > first_timed:
            train_time += now - seg_t0
        report(results, now)
        if bar is not None:
            bar.close()
        # The handlers stay until the stop checkpoint is written: a second Ctrl-C only repeats the
        # request instead of killing the save.
        try:
            if self._stop.is_set():
                if step > done:  # pragma: no cover - drain always completes submitted steps
                    step = done
                last_ckpt = self._save(model, scheme, batches, step) or last_ckpt
                self.info(f"{self._stop_reason}: " + (f"checkpoint written at step {step}" if self.out is not None
                          else f"stopped at step {step} (no --out: nothing saved)"))
        finally:
            self._restore_signals(handlers)
        if last_eval is None and (step > start or start >= tc.steps):
            last_eval = self._evaluate(model, held_out, stages, eval_ws, step, t_start)
        wall = time.perf_counter() - t_start
        summary = {"summary": True, "mode": tc.mode, "steps": step,
                   "val_bpb": (last_eval or {}).get("val_bpb"),
                   "val_stage_bpb": (last_eval or {}).get("val_stage_bpb"),
                   "tokens": (step - start) * tokens_per_step, "wall_s": wall,
                   "tokens_per_s": timed_tokens / train_time if train_time > 0 else 0.0,
                   "peak_rss_mib": peak_rss_mib(), "expected_mib": est["total"] / 2**20,
                   "checkpoint": last_ckpt, "stopped": self._stop_reason}
        if tc.mode == "rgc-async":
            summary["stage_threads"] = scheme.groups
            summary["stage_workers"] = scheme.W
            summary["pipeline_buffers_mib"] = scheme.buffer_bytes() / 2**20
            prof = scheme.stage_profile()  # since the workers started: the whole run (they persist)
            summary["stage_busy_frac"] = prof["busy_frac"]
            summary["stage_wait_s"] = prof["wait_s"]
        self.emit(summary)
        self.info(f"done: val bpb {summary['val_bpb'] if summary['val_bpb'] is None else round(summary['val_bpb'], 4)}"
                  f", {summary['tokens']:,} tokens in {wall:.1f} s, {summary['tokens_per_s']:.0f} tokens/s "
                  f"(training), peak RSS {summary['peak_rss_mib']:.0f} MiB, checkpoint {last_ckpt}")
        if self._logf is not None:
            self._logf.close()
        self.model = model
        return summary

    def _evaluate(self, model, held_out, stages, ws, step, t_start):
        res = evaluate(model, held_out, stages, ws)
        if not res:
            return None
        if not all(math.isfinite(v) for v in res["val_stage_bpb"]):
            from .errors import DivergenceError
            bad = [k for k, v in enumerate(res["val_stage_bpb"]) if not math.isfinite(v)]
            raise DivergenceError(f"non-finite validation loss at step {step} (stage{'s' * (len(bad) > 1)} "
                                  f"{', '.join(map(str, bad))}); no checkpoint written at this step")
        rec = {"step": step, "val_bpb": res["val_bpb"], "elapsed_s": time.perf_counter() - t_start}
        if len(stages) > 1:
            rec["val_stage_bpb"] = res["val_stage_bpb"]
        self.emit(rec)
        self.info(f"step {step}: val bpb {res['val_bpb']:.4f}" + (
            "  (stages " + ", ".join(f"{v:.3f}" for v in res["val_stage_bpb"]) + ")" if len(stages) > 1 else ""))
        return res

    # ------------------------------------------------------------------ checkpoints
    def _save(self, model, scheme, batches, step):
        if self.out is None:
            return None
        arrays, meta = scheme.state()
        arrays = dict(arrays, params=model.flat)
        meta = dict(meta, **self._run_meta(), train_config=self.tc.to_dict(), batches=batches.state(),
                    data=self.data_spec or self.data.name)
        return ckpt.save(self.out, step, arrays, meta, keep=self.tc.keep)

    def _restore(self, model, scheme, batches):
        expect = {"model_config": self.mcfg.to_dict(), "mode": self.tc.mode,
                  "n_stages": self.tc.n_stages if self.tc.mode != "bp" else 1}
        found = ckpt.latest(self.out, expect=expect, log=self.info)
        if found is None:
            self.info(f"no checkpoint in {self.out}: starting from step 0")
            return 0, None
        path, arrays, meta = found
        model.flat[...] = arrays["params"]
        scheme.load_state(arrays, meta)
        batches.set_state(meta["batches"])
        self.info(f"resumed from {path} (step {meta['step']})")
        return int(meta["step"]), path

    # ------------------------------------------------------------------ signals
    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return None
        old = {}

        def handler(signum, frame):
            self.request_stop(f"received {signal.Signals(signum).name}")
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
        return old

    def _restore_signals(self, old):
        if old:
            for sig, h in old.items():
                signal.signal(sig, h)


def train(model_cfg, train_cfg, data=None, out=None, **kw):
    """Train and return the summary dict (see the module docstring)."""
    return Trainer(model_cfg, train_cfg, data, out, **kw).run()
