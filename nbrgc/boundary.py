"""rgc-async's checkpoints between evaluations, written from a snapshot beside the training.

A pause empties the pipeline and refills it after, which idles workers at every checkpoint. For a
checkpoint that no evaluation needs, the trainer instead asks the scheme for a
:class:`nbrgc.schemes.rgc_async.Snapshot` of boundary n and goes on submitting steps; this thread
waits for the copy, writes it and hands the copy back (one in flight at a time). The stages never
read the copy, so their trajectory is the one a paused run follows, and the file is the one a
paused run writes, bit for bit (tests/test_pipeline_state.py).

Evaluations still pause: on a shared machine an evaluation beside the stages competes with them for
the cores and measured slower than a pause (benchmarks/README.md, "rgc-async with the default
cadence").
"""
import threading


class BackgroundCheckpoints:
    def __init__(self, trainer, run):
        self.trainer, self.run = trainer, run
        self.thread, self.error = None, None

    def start(self, step):
        """At boundary ``step`` (after submitting step - 1): checkpoint it beside the training.
        Waits for the previous one first and raises its error, if any."""
        self.join()
        r = self.run
        snap = r.scheme.snapshot(step)
        batches_state = r.batches.state()  # exactly ``step`` batches drawn
        self.thread = threading.Thread(target=self._write, args=(snap, step, batches_state),
                                       name=f"nbrgc-checkpoint-{step}", daemon=True)
        self.thread.start()

    def _write(self, snap, step, batches_state):
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

    def check(self):
        """Raise a finished checkpoint's error in the calling (training) thread."""
        if self.error is not None and (self.thread is None or not self.thread.is_alive()):
            self.join()

    def join(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc
