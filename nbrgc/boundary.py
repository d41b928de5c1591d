"""rgc-async's evaluations and checkpoints between the run's start and its end, without emptying
the pipeline.

A pause (``drain``) waits for every submitted step and refills the pipeline after, which idles
workers for up to a step on each side of every pause. Where the scheme can snapshot (one process
runs every stage), the trainer instead asks for a :class:`nbrgc.schemes.snapshot.Snapshot` of
boundary n and goes on submitting steps:

* a checkpoint: this module's thread waits for the copy, writes it and hands the copy back;
* an evaluation: once the copy is complete, the trainer freezes the workers where they compute
  nothing (:meth:`nbrgc.schemes.rgc_async.RGCAsync.freeze`: before a stage step or waiting on an
  earlier one, the pipeline still full), evaluates the copy on the whole thread budget in its own
  thread, lets the workers go on, and writes the copy as the boundary's checkpoint as above.

One copy is in flight at a time: a boundary that needs one first finishes the previous (boundary
n's copy is complete once step n has started its update in every stage). The stages never read
the copy, so their trajectory is the one a paused run follows, the file is the one a paused run
writes, and the evaluation the one it computes, bit for bit (tests/test_pipeline_state.py). The run's end, ``--time`` and stops still
pause: there the pipeline ends anyway.

Evaluating the copy beside running stages instead of freezing them measured slower: the evaluation
and the stages compete for the same cores (benchmarks/README.md, "rgc-async with the default
cadence").
"""
import threading
import time


class BackgroundBoundaries:
    def __init__(self, trainer, run):
        self.trainer, self.run = trainer, run
        self.thread, self.error, self.writing = None, None, None
        self.pending = None  # (step, snapshot, batches state) of an evaluation waiting for its copy

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, step):
        """At boundary ``step`` (after submitting step - 1): checkpoint it beside the training."""
        snap, batches_state = self._take(step)
        self._write(step, snap, batches_state)

    def _take(self, step):
        self.finish_eval()
        self.join()
        r = self.run
        return r.scheme.snapshot(step), r.batches.state()  # exactly ``step`` batches drawn

    def _write(self, step, snap, batches_state):
        if self.trainer.out is None:
            snap.release()
            return
        self.writing = snap
        self.thread = threading.Thread(target=self._write_when_complete, args=(snap, step, batches_state),
                                       name=f"nbrgc-checkpoint-{step}", daemon=True)
        self.thread.start()

    def _write_when_complete(self, snap, step, batches_state):
        r = self.run
        try:
            if not snap.wait():
                return  # the workers stopped; the trainer reports why
            arrays, meta = snap.state()
            r.last_ckpt = (self.trainer.write_checkpoint(step, arrays, meta, snap.params, batches_state)
                           or r.last_ckpt)
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread by join/check
            self.error = exc
        finally:
            snap.release()

    # ------------------------------------------------------------------ evaluations
    def evaluate(self, step):
        """At boundary ``step``: evaluate it (and checkpoint it) once its copy is complete."""
        snap, batches_state = self._take(step)
        self.pending = (step, snap, batches_state)

    def poll(self):
        """Finish a pending evaluation whose copy is complete; raise a finished checkpoint's error."""
        if self.pending is not None and self.pending[1].is_complete():
            self.finish_eval()
        if self.error is not None and (self.thread is None or not self.thread.is_alive()):
            self.join()

    def finish_eval(self):
        """Evaluate the pending boundary n with the workers frozen, then write its checkpoint beside
        the training. Its copy needs step n submitted (each stage copies its part as it starts the
        update of step n): the trainer calls this from boundary n + 1 on."""
        if self.pending is None:
            return
        step, snap, batches_state = self.pending
        self.pending = None
        r, scheme = self.run, self.run.scheme
        try:
            if not snap.wait():
                snap.release()
                return  # the workers stopped; the trainer reports why
            # the boundary's train records come before its evaluation, as after a pause
            self.trainer._log_steps(r, scheme.results_through(step), time.perf_counter())
            ws = scheme.freeze()
            r.clock.pause(r.step, time.perf_counter())
            try:
                r.last_eval = self.trainer._evaluate(r.model, r.held_out, r.stages, ws, step, r.t_start,
                                                     params=snap.params)
            finally:
                scheme.unfreeze()
                r.clock.restart()
        except BaseException:
            snap.release()
            raise
        self._write(step, snap, batches_state)

    def discard(self, submitted):
        """Drop a pending evaluation (the run is failing or interrupted), and give up a checkpoint
        whose boundary's step was never submitted (a stop right after it was asked for: the stop
        checkpoint of that boundary replaces it)."""
        if self.pending is not None:
            self.pending[1].release()
            self.pending = None
        snap = self.writing
        if snap is not None and snap.step is not None and snap.step >= submitted:
            snap.cancel()

    def join(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc
