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
from dataclasses import dataclass

from . import checkpoint as ckpt
from .boundary import BackgroundBoundaries
from .clock import TrainingClock
from .runfolder import prepare_run_folder
from .config import ModelConfig, TrainConfig
from .errors import ConfigError, NbrgcError
from .evaluate import LN2, evaluate
from .kernels.warmup import ensure_cached
from .local import identity_init, split_stages
from .memory import available_bytes, estimate, fmt_mib, peak_rss_mib
from .model import Model
from .optim import lr_at
from .schemes import make_scheme
from .threads import busy_note, cpu_count, describe, limit_blas, set_threads


@dataclass
class _Run:
    """What one run holds while it trains: the model and scheme, the data streams and the counters."""
    model: Model
    scheme: object
    stages: list               # (lo, hi) block ranges, one per stage
    batches: object
    held_out: list
    eval_ws: object
    t_start: float
    est: dict                  # the memory estimate
    start: int                 # the step this process started from
    clock: "TrainingClock"
    step: int                  # steps submitted
    done: int                  # steps finished
    last_eval: dict = None
    last_ckpt: str = None
    bar: object = None


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
        self._out_lock = threading.RLock()
        self.max_memory = max_memory
        self.fault_hook = fault_hook
        self.time_limit = time_limit
        self.data_spec = data_spec if data_spec is not None else (data if isinstance(data, str) else None)
        self._stop = threading.Event()
        self._stop_reason = None
        from .data import as_dataset
        self.data = as_dataset(data, self.info)
        for split in ("train", "val"):
            arr = getattr(self.data, split)
            if len(arr) < self.seq + 1:
                raise NbrgcError(f"{split} split of {self.data.name} has {len(arr)} bytes; a window of "
                                 f"seq {self.seq} needs at least {self.seq + 1}")

    # ------------------------------------------------------------------ output
    def info(self, msg):
        """Human-readable notes go to stderr (stdout carries the JSON lines with --json)."""
        with self._out_lock:  # the boundary thread (nbrgc.boundary) reports too
            if self._human is not None:
                self._human(msg)
            else:
                print(msg, file=sys.stderr, flush=True)

    def emit(self, rec):
        with self._out_lock:
            self._emit(rec)

    def _emit(self, rec):
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
                "n_stages": self.tc.n_stages, "batch": self.tc.batch, "seq": self.seq, "seed": self.tc.seed}

    def _prepare_out(self):
        if self.out is not None:
            mine = {"model_config": self.mcfg.to_dict(), "train_config": self.tc.to_dict(),
                    "data": self.data_spec or self.data.name}
            prepare_run_folder(self.out, mine, self.resume, self.force, self.info)

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

    def _agree(self, fn, what):
        """``fn()``: one process decides alone; the ranks of an MPI job take rank 0's answer, or
        its one-line error (nbrgc.distributed.run). ``what`` names the decision for that error."""
        return fn()

    # ------------------------------------------------------------------ the run
    def run(self):
        """Set up, train to the last step or a stop, checkpoint a stop, evaluate, summarise."""
        r = self._set_up()
        handlers = self._install_signals()
        results = self._train(r, handlers)
        self._log_steps_after_last_pause(r, results)
        if r.bar is not None:
            r.bar.close()
        # The handlers stay until the stop checkpoint is written: a second Ctrl-C only repeats the
        # request instead of killing the save.
        try:
            if self._stop.is_set():
                self._checkpoint_stop(r)
        finally:
            self._restore_signals(handlers)
        if r.last_eval is None and (r.step > r.start or r.start >= self.tc.steps):
            r.last_eval = self._evaluate(r.model, r.held_out, r.stages, r.eval_ws, r.step, r.t_start)
        summary = self._summary(r)
        self.emit(summary)
        self.info(f"done: val bpb {summary['val_bpb'] if summary['val_bpb'] is None else round(summary['val_bpb'], 4)}"
                  f", {summary['tokens']:,} tokens in {summary['wall_s']:.1f} s, {summary['tokens_per_s']:.0f} "
                  f"tokens/s (training), peak RSS {summary['peak_rss_mib']:.0f} MiB, checkpoint {r.last_ckpt}")
        if self._logf is not None:
            self._logf.close()
        self.model = r.model
        return summary

    def _set_up(self):
        """The run folder, the thread budget, the memory check, the model and its scheme, the batch
        streams and the step to start from."""
        from .data import Batches, eval_batches
        tc, mcfg = self.tc, self.mcfg
        t_start = time.perf_counter()
        self._open_run_folder()
        budget = tc.threads or cpu_count()
        limit_blas(1)
        # so that this process computes with cached code
        ensure_cached(attention=tc.attention, mode=tc.mode, optimizer=tc.optimizer)
        est = self._check_memory(set_threads(budget))
        self.info(f"nbrgc: {describe()}")
        note = None if tc.threads else busy_note(budget, cpu_count())
        if note:
            self.info(f"note: {note}")
        self.info(f"model {mcfg.to_dict()} | mode {tc.mode} | batch {tc.batch} x seq {self.seq} | "
                  f"steps {tc.steps} | data {self.data.name} ({len(self.data.train):,} train bytes)")
        model, scheme, stages = self._build_model_and_scheme()
        batches = Batches(self.data.train, tc.batch, self.seq, seed=tc.seed)
        held_out = eval_batches(self.data.val, tc.batch, self.seq, tc.eval_batches, seed=tc.seed + 1)
        start, restored = 0, None
        if self.resume and self.out is not None:
            start, restored = self._restore(model, scheme, batches)
        if tc.threaded:
            scheme.tune(tc.batch, self.seq)
            self.info(f"stage thread groups: {scheme.groups} (budget {budget}) on {scheme.W} worker(s) "
                      f"(stage k on worker k mod {scheme.W}), max staleness {tc.max_staleness}")
        r = _Run(model=model, scheme=scheme, stages=stages, batches=batches, held_out=held_out,
                 eval_ws=scheme.eval_workspace(tc.batch, self.seq), t_start=t_start, est=est, start=start,
                 clock=TrainingClock(start, tc.batch * self.seq), step=start, done=start)
        if self.progress:
            from tqdm import tqdm
            r.bar = tqdm(total=tc.steps, initial=start, unit="step", file=sys.stderr, dynamic_ncols=True,
                         disable=None)
        if start >= tc.steps:  # e.g. killed after its final checkpoint, before it could exit
            r.last_ckpt = restored
            self.info(f"the run already reached step {start} of {tc.steps}: nothing to train "
                      f"(final checkpoint {r.last_ckpt})")
        r.clock.restart()
        return r

    def _open_run_folder(self):
        self._logf = None
        self._prepare_out()
        if self.out is not None:
            self._logf = open(os.path.join(self.out, "log.jsonl"), "a")

    def _build_model_and_scheme(self):
        tc = self.tc
        model = Model(self.mcfg, seed=tc.seed, attention=tc.attention)
        self.info(f"parameters: {model.n_params:,}")
        scheme = self._make_scheme(model)
        stages = split_stages(self.mcfg.n_layer, tc.n_stages)
        if tc.mode != "bp" and tc.stage_init == "identity":
            identity_init(model, stages)
        if hasattr(self.fault_hook, "bind"):
            self.fault_hook.bind(model, [model.layout.block_range(lo, hi) for lo, hi in stages])
        return model, scheme, stages

    def _train(self, r, handlers):
        """Submit steps until the last one or a stop; pause the scheme at every evaluation, checkpoint
        or stop point, except that where the scheme can snapshot (rgc-async) evaluations and
        checkpoints before the end read a copy of their boundary while the pipeline stays full
        (nbrgc.boundary). Returns the results of steps still in flight when the loop ended."""
        tc, scheme = self.tc, r.scheme
        boundaries = BackgroundBoundaries(self, r) if scheme.can_snapshot() else None
        try:
            while r.step < tc.steps and not self._stop.is_set():
                x, y = r.batches.next()
                r.clock.submitting(r.step, time.perf_counter())
                if self.fault_hook is not None and not tc.threaded:  # threaded stages call it
                    for k in range(len(r.stages)):
                        self.fault_hook(k, r.step)
                scheme.submit(r.step, x, y, lr_at(r.step, tc))
                r.step += 1
                results = scheme.poll()
                time_up = self.time_limit is not None and time.perf_counter() - r.t_start >= self.time_limit
                time_up = self._agree_stop(r.step, time_up)
                # decided once, before the results are reported: a stop requested while reporting
                # (a signal, a callback) must not save a pipeline that has not been drained
                pause = self._is_pause(r.step, time_up)
                if boundaries is not None:
                    # before any evaluation it finishes, which reports the records up to its boundary
                    self._log_steps(r, results, time.perf_counter())
                    results = []
                    boundaries.poll()
                    if pause:
                        boundaries.finish_eval()  # the previous one first: its records may ask to stop
                        if not (r.step == tc.steps or time_up or self._stop.is_set()):
                            if self._is_eval(r.step):
                                boundaries.evaluate(r.step)
                            elif self.out is not None:
                                boundaries.checkpoint(r.step)
                            pause = False
                        else:
                            boundaries.join()
                if not pause:
                    self._log_steps(r, results, time.perf_counter())
                    continue
                self._pause(r, results, evaluate=self._is_eval(r.step) or time_up, save=True)
                if time_up:
                    break
            if boundaries is not None and boundaries.pending is not None:  # a stop between boundaries
                if boundaries.pending[0] < r.step:
                    boundaries.finish_eval()
                else:  # asked for at this boundary, whose copy needs step r.step: evaluate it paused
                    boundaries.discard(r.step)
                    self._pause(r, [], evaluate=True, save=False)
        except KeyboardInterrupt:
            self.request_stop("interrupted")
        except BaseException:
            self._restore_signals(handlers)
            raise
        finally:
            try:
                if boundaries is not None:
                    boundaries.discard(r.step)
                    boundaries.join()
                results = scheme.drain()
            except BaseException:
                self._restore_signals(handlers)
                raise
            finally:
                scheme.close()
        return results

    def _pause(self, r, results, evaluate, save):
        """Hold the scheme at boundary r.step: drain it, log every step up to the boundary, then
        evaluate and/or checkpoint there with the training clock stopped."""
        results = results + r.scheme.drain()
        now = time.perf_counter()
        self._log_steps(r, results, now)
        r.clock.pause(r.step, now)
        if evaluate:
            r.last_eval = self._evaluate(r.model, r.held_out, r.stages, r.eval_ws, r.step, r.t_start)
        if save:
            r.last_ckpt = self._save(r.model, r.scheme, r.batches, r.step) or r.last_ckpt
        r.clock.restart()

    def _is_eval(self, step):
        return bool(self.tc.eval_every and step % self.tc.eval_every == 0) or step == self.tc.steps

    def _is_pause(self, step, time_up):
        """Whether the scheme stops at this step boundary: to evaluate, checkpoint or stop."""
        return self._is_eval(step) or bool(self.tc.ckpt_every and step % self.tc.ckpt_every == 0) or (
            time_up or self._stop.is_set())

    def _log_steps(self, r, results, now):
        """One log record per finished step (emitted every ``log_every`` steps and at the last) and
        the progress bar."""
        tc = self.tc
        for res in results:
            r.done = res.step + 1
            r.clock.finished(res.step)
            rec = {"step": r.done, "loss": res.loss, "bpb": res.loss / LN2, "lr": lr_at(res.step, tc),
                   "grad_norm": res.grad_norm, "tokens_per_s": r.clock.tokens_per_s_at(now),
                   "elapsed_s": now - r.t_start}
            if len(res.stage_losses) > 1:
                rec["stage_bpb"] = [v / LN2 for v in res.stage_losses]
            if res.skipped:
                rec["skipped"] = True
            if r.done % tc.log_every == 0 or r.done == tc.steps:
                self.emit(rec)
            if r.bar is not None:
                r.bar.update(1)
                r.bar.set_postfix(loss=f"{res.loss:.3f}", bpb=f"{res.loss / LN2:.3f}",
                                  tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)

    def _log_steps_after_last_pause(self, r, results):
        """Steps finished after the last pause (a stop between boundaries) are logged like the others."""
        now = time.perf_counter()
        if results:
            r.clock.pause(r.step, now)
        self._log_steps(r, results, now)

    def _checkpoint_stop(self, r):
        if r.step > r.done:  # pragma: no cover - drain always completes submitted steps
            r.step = r.done
        r.last_ckpt = self._save(r.model, r.scheme, r.batches, r.step) or r.last_ckpt
        self.info(f"{self._stop_reason}: " + (f"checkpoint written at step {r.step}" if self.out is not None
                  else f"stopped at step {r.step} (no --out: nothing saved)"))

    def _summary(self, r):
        tc, scheme = self.tc, r.scheme
        summary = {"summary": True, "mode": tc.mode, "steps": r.step,
                   "val_bpb": (r.last_eval or {}).get("val_bpb"),
                   "val_stage_bpb": (r.last_eval or {}).get("val_stage_bpb"),
                   "tokens": (r.step - r.start) * tc.batch * self.seq, "wall_s": time.perf_counter() - r.t_start,
                   "tokens_per_s": r.clock.tokens_per_s(), "peak_rss_mib": peak_rss_mib(),
                   "expected_mib": r.est["total"] / 2**20, "checkpoint": r.last_ckpt, "stopped": self._stop_reason}
        if tc.threaded:
            summary["stage_threads"] = scheme.groups
            summary["stage_workers"] = scheme.W
            summary["pipeline_buffers_mib"] = scheme.buffer_bytes() / 2**20
            prof = scheme.stage_profile()  # since the workers started: the whole run (they persist)
            summary["stage_busy_frac"] = prof["busy_frac"]
            summary["stage_wait_s"] = prof["wait_s"]
        return summary

    def _evaluate(self, model, held_out, stages, ws, step, t_start, params=None):
        res = evaluate(model, held_out, stages, ws, params)
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
        arrays, meta = scheme.state()
        return self.write_checkpoint(step, arrays, meta, model.flat, batches.state())

    def write_checkpoint(self, step, arrays, meta, params, batches_state):
        """The checkpoint of boundary ``step`` from a scheme's state (``arrays``, ``meta``), the
        parameters and the batch stream's state; its path (None without a run folder)."""
        if self.out is None:
            return None
        arrays = dict(arrays, params=params)
        meta = dict(meta, **self._run_meta(), train_config=self.tc.to_dict(), batches=batches_state,
                    data=self.data_spec or self.data.name)
        return ckpt.save(self.out, step, arrays, meta, keep=self.tc.keep)

    def _restore(self, model, scheme, batches):
        expect = {"model_config": self.mcfg.to_dict(), "mode": self.tc.mode,
                  "n_stages": self.tc.n_stages}  # 1 for bp (TrainConfig sets it)
        found = self._agree(lambda: ckpt.latest(self.out, expect=expect, log=self.info),
                            "the checkpoint to resume from")
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
