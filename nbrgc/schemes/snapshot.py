"""A copy of rgc-async's pipeline state at a step boundary, taken while the stages run on.

Boundary n is where every stage has finished step n - 1. Each stage copies its parameters and AdamW
moments at step n just before its own update of step n (they are then exactly its state after step
n - 1: nothing else writes them); the stage that closes round n - 1 copies the decoder version n, the
decoder's moments and the versions ring under the lock that publishes the version (the versions
steps n .. n + S - 1 read are all there, and none can be overwritten before round n + 1 closes). If
round n - 1 closed before the request, the requester copies the decoder itself: it cannot change
until step n is submitted. Nothing the stages compute reads the copy, so taking it changes no bit of
the trajectory.
"""
import threading

import numpy as np

POLL = 0.05  # seconds between checks for a stopped pipeline while waiting


class Snapshot:
    """The pipeline state at step boundary ``step``, filled in by the workers while they run on
    (see the module docstring). ``wait`` until it is complete, read ``params`` and ``state()``,
    then ``release`` it: the scheme keeps one copy and takes the next snapshot into it."""

    def __init__(self, scheme):
        m = scheme.model
        self.scheme = scheme
        self.params = np.zeros(m.layout.size, m.dtype)
        self.M = np.zeros_like(self.params)
        self.V = np.zeros_like(self.params)
        self.versions = np.zeros_like(scheme.versions)
        self.opt_steps = [0] * (scheme.K + 1)
        self.step = None
        self._lock = threading.Lock()
        self._parts = 0
        self._complete = threading.Event()
        self._cancelled = False

    def request(self, step):
        """Arm this copy for boundary ``step`` (the scheme checked it is the submitted one)."""
        s = self.scheme
        with s.cond:
            while s._snap is not None and not s.stop:  # the previous request is still being read
                s.cond.wait(POLL)
            self.step, self._parts, self._cancelled = step, 0, False
            self._complete.clear()  # after a failure or stop, wait() returns False
            s._snap = self
            if s.version == step:  # round step-1 already closed: its decoder state is frozen
                self._take_decoder()  # until step is submitted, so copy it here
        return self

    def _part_done(self):
        with self._lock:
            self._parts += 1
            if self._parts == self.scheme.K + 1:  # every stage and the decoder
                self._complete.set()

    def _take_range(self, i, lo, hi, opt, src=None):
        s = self.scheme
        self.params[lo:hi] = s.model.flat[lo:hi] if src is None else src
        self.M[lo:hi] = s.M[lo:hi]
        self.V[lo:hi] = s.V[lo:hi]
        self.opt_steps[i] = opt.t
        self._part_done()

    def _take_decoder(self):
        """Called with the scheme's lock held, once version ``step`` is published."""
        s = self.scheme
        self.versions[...] = s.versions
        self._take_range(s.K, s.dec_lo, s.dec_hi, s.opt_dec, s.versions[self.step % (s.S + 2)])

    def is_complete(self):
        return self._complete.is_set()

    def wait(self):
        """True once complete; False when the workers stopped first (a failure or a shutdown) or
        the copy was cancelled."""
        while not self._complete.wait(POLL):
            if self.scheme.stop or not self.scheme._threads or self._cancelled:
                return False
        return True

    def cancel(self):
        """The boundary's step will not be submitted (a stop came first): ``wait`` gives up."""
        self._cancelled = True

    def state(self):
        """(arrays, meta) as :meth:`RGCAsync.state` would give them after a pause at ``step``."""
        arrays = {"adam_m": self.M, "adam_v": self.V, "decoder_versions": self.versions}
        return arrays, dict(opt_steps=list(self.opt_steps), **self.scheme.pipeline_meta(self.step))

    def release(self):
        with self.scheme.cond:
            if self.scheme._snap is self:
                self.scheme._snap = None
            self.scheme.cond.notify_all()
