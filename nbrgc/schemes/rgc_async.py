"""Asynchronous RGC: Python worker threads running nogil Numba code, each with its own thread group,
stage k on micro-batch t while stage k+1 works on t-1.

Workers: stage k runs on worker k mod W (the rule: :func:`nbrgc.config.resolve_stage_workers`). A
worker runs its stages' steps in (step, stage) order and reuses one workspace for them. Every wait
below is on a step that comes earlier in (step, stage) order, so any W from 1 to K runs without
deadlock, and since no result depends on timing, W changes only speed and memory, never a bit of
the losses.

Hand-offs and bounds (all buffers preallocated once, sized by the staleness bound S):

* activations: stage k writes its output for step t into ring slot t mod R of boundary k (R = S + 1);
  stage k+1 copies it into its own workspace and frees the slot (``produced``/``consumed`` counts).
* targets and learning rates ride in a ring of S + 2 entries written by stage 0.
* decoder: S + 2 versions; version v is the decoder after v consensus rounds. Step t of every stage
  reads version max(0, t - S) and may start only once it exists, so no stage runs more than S steps
  ahead of the slowest, and the run is deterministic whatever the timing. S = 0 is exactly rgc-sync.
* RGC rounds: S + 1 rounds in flight, K slots each, one atomic counter per round; the stage whose
  fetch-and-add brings it to K averages the slots, applies the decoder's AdamW into the next version
  and publishes it (after the previous round's version: rounds close in order).

The pipeline state at a step boundary n (every stage has finished step n - 1) is the parameters, the
optimizer state, and the decoder versions max(0, n - S) .. n that steps n .. n + S - 1 still read:
the rings of activations and targets and the RGC rounds are empty there. ``drain`` pauses the
workers at such a boundary without stopping them (each stage waits at most one step for the others),
``state`` writes the versions into the checkpoint and ``load_state`` restores them, so evaluation,
checkpoints, stops and resumes leave the trajectory exactly as an uninterrupted run's.

A checkpoint between evaluations need not even pause: :meth:`RGCAsync.snapshot` has the workers
copy the state at a boundary while they run on (:mod:`nbrgc.schemes.snapshot`).

The worker threads, waits, freezing and shutdown are :mod:`nbrgc.schemes.runtime`'s; this module is
RGC's rule on it: what a stage does at step t (:meth:`RGCAsync._stage_step`), its buffers and state.
"""
import queue
import threading
import time

import numpy as np

from ..config import parse_stage_threads, resolve_stage_workers, worker_groups
from ..errors import NbrgcError
from ..kernels.atomics import fetch_add
from ..local import (RGCBuffer, consensus_weights, split_stages, stage_backward, stage_param_ranges,
                     stage_sumsq)
from ..optim import clip_scale
from ..threads import cpu_count
from . import StepResult
from .autotune import stage_groups
from .common import SchemeBase
from .runtime import _WAIT, StageRuntime, _Stopped
from .snapshot import Snapshot

class RGCAsync(StageRuntime, SchemeBase):
    def __init__(self, model, tc, fault_hook=None, log=None, **_):
        super().__init__(model, tc)
        self.K = tc.n_stages
        self.S = tc.max_staleness
        self.stages = split_stages(model.cfg.n_layer, self.K)
        self.ranges = stage_param_ranges(model.layout, self.stages)
        self.opts = [self._optimizer(lo, hi) for lo, hi in self.ranges]
        self.dec_lo, self.dec_hi = model.layout.decoder_range
        self.opt_dec = self._optimizer(self.dec_lo, self.dec_hi)
        self.budget = tc.threads or cpu_count()
        self.W = resolve_stage_workers(tc, self.budget)
        # the stages this process runs (all of them here; a contiguous share under MPI, see
        # nbrgc.distributed.pipeline): the first pulls the micro-batches, they post len() slots a round
        self.local_stages = list(range(self.K))
        self.groups = parse_stage_threads(tc.stage_threads, self.K)
        if self.groups is not None:
            worker_groups(self.groups, self.W)
        self.fault_hook = fault_hook
        self.log = log or (lambda msg: None)
        self._buffers = None
        # decoder versions live outside the (B, T)-sized buffers: they are pipeline state that a
        # checkpoint carries, valid for the step boundary ``versions_at`` (None: not yet filled)
        self.versions = np.zeros((self.S + 2, self.dec_hi - self.dec_lo), model.dtype)
        self.versions_at = None
        self._threads = []
        self.cond = threading.Condition()
        self.error = None
        self.stop = False
        self.submitted = 0
        self.next_result = 0
        self.version = 0             # decoder versions published (rounds closed)
        self.started_at = 0          # the step the current run of workers started from
        self.results = queue.Queue()
        # per stage, since the workers last started: seconds spent in stage steps, and the part of
        # it spent waiting (input, decoder version, ring space, round order); busy = step - wait
        self.stage_step_s = [0.0] * self.K
        self.stage_wait_s = [0.0] * self.K
        self._snap = None            # the Snapshot being filled or read, if any
        self._snap_buf = None
        # freeze (an evaluation beside a full pipeline): per worker, where it is while frozen may
        # be checked: None (computing), "parked" (before a stage step), "input" (stage 0 waiting
        # for a micro-batch), or (pred, holds_ws) while waiting in _wait for pred
        self.freezing = False
        self._where = [None] * self.W

    def optimizers(self):
        return self.opts + [self.opt_dec]

    # ------------------------------------------------------------------ buffers
    def _alloc(self, B, T):
        m, S, K = self.model, self.S, self.K
        d = m.cfg.d_model
        per = self.stages[0][1] - self.stages[0][0]
        dec = self.dec_hi - self.dec_lo
        b = {}
        b["ws"] = [m.workspace(B, T, 0, per) for _ in range(self.W)]  # one per worker
        b["ring"] = np.zeros((max(K - 1, 1), S + 1, B * T, d), m.dtype)
        b["produced"] = np.zeros(max(K - 1, 1), np.int64)
        b["consumed"] = np.zeros(max(K - 1, 1), np.int64)
        b["tokens"] = np.zeros((S + 2, B, T), np.int32)
        b["targets"] = np.zeros((S + 2, B, T), np.int32)
        b["lr"] = np.zeros(S + 2)
        b["losses"] = np.zeros((S + 1, K))
        b["norms"] = np.zeros((S + 1, K))
        b["skipped"] = np.zeros((S + 1, K), np.bool_)
        b["versions"] = self.versions
        b["rgc"] = RGCBuffer(K, dec, m.dtype, n_rounds=S + 1, weights=self._round_weights())
        b["shape"] = (B, T)
        self._buffers = b
        self.log(f"rgc-async buffers: {self.buffer_bytes() / 2**20:.1f} MiB (ring "
                 f"{b['ring'].nbytes / 2**20:.1f} MiB, decoder versions "
                 f"{b['versions'].nbytes / 2**20:.2f} MiB, RGC slots {b['rgc'].nbytes() / 2**20:.2f} MiB, "
                 f"{self.W} worker workspace(s) {sum(w.nbytes() for w in b['ws']) / 2**20:.1f} MiB)")

    def _round_weights(self):
        """The consensus weights of the decoder's gradients (None: uniform)."""
        return consensus_weights(self.tc)

    def eval_workspace(self, B, T):
        """Worker 0's workspace: only valid while the pipeline is paused (drained)."""
        if self._buffers is None or self._buffers["shape"] != (B, T):
            self._alloc(B, T)
        return self._buffers["ws"][0]

    def buffer_bytes(self):
        b = self._buffers
        if b is None:
            return 0
        return (sum(w.nbytes() for w in b["ws"]) + b["ring"].nbytes + b["versions"].nbytes
                + b["rgc"].nbytes() + b["tokens"].nbytes + b["targets"].nbytes)

    # ------------------------------------------------------------------ control
    def tune(self, B, T):
        """Resolve --stage-threads auto (once)."""
        if self.groups is None:
            self.groups = stage_groups(self.model, self.stages, self.budget, self.W, B, T, self.log)
        return self.groups

    def _start(self, step0, B, T):
        self.tune(B, T)
        if self._buffers is None or self._buffers["shape"] != (B, T):
            self._alloc(B, T)
        b = self._buffers
        if self.versions_at != step0:
            if step0:  # a checkpoint without pipeline state: the stages restart from its decoder
                self.log(f"rgc-async: no decoder versions for step {step0}; steps {step0}.."
                         f"{step0 + self.S - 1} read the current decoder")
            self.versions[:] = self.model.flat[self.dec_lo:self.dec_hi]
            self.versions_at = step0
        self.started_at = step0
        self.version = step0
        b["produced"][:] = step0
        b["consumed"][:] = step0
        b["rgc"].counters[:] = 0
        self.submitted = self.next_result = step0
        self.stop, self.error = False, None
        self.stage_step_s = [0.0] * self.K
        self.stage_wait_s = [0.0] * self.K
        self.freezing = False
        self._where = [None] * self.W
        self._inq = queue.Queue(maxsize=self.S + 1)
        self._threads = [threading.Thread(target=self._worker, args=(w,), daemon=True,
                                          name="nbrgc-stage-" + "+".join(map(str, self.worker_stages(w))))
                         for w in range(self.W)]
        for th in self._threads:
            th.start()

    def submit(self, step, x, y, lr):
        x, y = self.model.check_batch(x, y)
        if not self._threads:
            self._start(step, *x.shape)
        if step != self.submitted:
            raise NbrgcError(f"rgc-async expected step {self.submitted}, got {step}")
        while True:
            self._raise_if_failed()
            try:
                self._inq.put((step, x, y, lr), timeout=_WAIT)
                break
            except queue.Full:
                continue
        self.submitted += 1

    def drain(self):
        """Wait for every submitted step and publish the newest decoder to the model. The workers stay:
        each waits for its next input, so the pipeline resumes where it paused."""
        out = self.results_through(self.submitted)
        if self._threads and self.next_result == self.submitted:
            self.versions_at = self.version
            self.model.flat[self.dec_lo:self.dec_hi] = self.versions[self.version % (self.S + 2)]
        return out

    def can_snapshot(self):
        """This process runs every stage, so it can take a :meth:`snapshot`."""
        return self.local_stages == list(range(self.K))

    def snapshot(self, step):
        """Ask for a copy of the state at boundary ``step``; call it after submitting step
        ``step - 1`` and before submitting ``step``. Returns the :class:`Snapshot`, the one copy
        this scheme keeps (waits while it is still being read)."""
        if step != self.submitted or not self._threads:
            raise NbrgcError(f"rgc-async: a snapshot is taken at the submitted boundary "
                             f"({self.submitted}), not at {step}")
        if self._snap_buf is None:
            self._snap_buf = Snapshot(self)
        return self._snap_buf.request(step)

    # ------------------------------------------------------------------ the stage rule
    def _stage_step(self, k, t):
        m, b, S, K, tc = self.model, self._buffers, self.S, self.K, self.tc
        ws = b["ws"][self.worker_of(k)]
        lo, hi = self.stages[k]
        plo, phi = self.ranges[k]
        slot_t = t % (S + 2)
        # 1. input: a micro-batch (stage 0) or the previous stage's activations for step t
        if k == self.local_stages[0]:
            self._take_input(k, t)
        h = m.embed(b["tokens"][slot_t], ws) if k == 0 else self._receive(k, t, ws)
        if self.fault_hook is not None:
            self.fault_hook(k, t)
        # 2. the decoder version this step reads
        v = max(0, t - S)
        self._wait(lambda: self.version >= v, k)
        pdec = b["versions"][v % (S + 2)]
        y = b["targets"][slot_t]
        lr = float(b["lr"][slot_t])
        # 3. forward, then hand the output on before the loss and backward
        out = m.forward_blocks(h, lo, hi, ws)
        if k + 1 < K:
            self._hand_on(k, t, out)
        # 4. local loss through the shared decoder, backward within the stage, own update
        rgc = b["rgc"]
        slot = rgc.slot(t, k)
        slot[...] = 0.0
        G = m.grad_flat
        G[plo:phi] = 0.0
        loss = stage_backward(m, ws, k, lo, hi, out, y, slot, pdec)
        sq = stage_sumsq(G, plo, phi, slot)
        r = t % (S + 1)
        snap = self._snap
        if snap is not None and snap.step == t:  # this stage's state after step t-1, before its update
            snap._take_range(k, plo, phi, self.opts[k])
        if self.check_finite(t, sq, loss, f"stage {k}"):
            scale, norm = clip_scale(sq, tc.grad_clip)
            self.opts[k].step(lr, scale)
            if scale != 1.0:
                slot *= scale
            b["skipped"][r, k] = False
        else:
            norm = float("nan")
            slot[...] = 0.0
            b["skipped"][r, k] = True
        b["losses"][r, k] = loss
        b["norms"][r, k] = norm
        # 5. post; the last poster closes the round
        if fetch_add(rgc.counters, r, 1) == len(self.local_stages) - 1:
            self._close_round(t, lr, k)

    def _take_input(self, k, t):
        """The first local stage takes micro-batch t from ``submit`` into the rings of tokens, targets
        and learning rates."""
        b = self._buffers
        slot_t = t % (self.S + 2)
        t0 = time.perf_counter()
        w = self.worker_of(k)
        with self.cond:
            self._where[w] = "input"
            if self.freezing:
                self.cond.notify_all()
        try:
            while True:
                if self.stop:
                    raise _Stopped
                try:
                    item = self._inq.get(timeout=_WAIT)
                except queue.Empty:
                    continue
                if item is None:  # the shutdown's wake-up
                    raise _Stopped
                step, x, y, lr = item
                break
            self._park(w)  # a freeze may have lent the workspace out while this waited
        finally:
            self.stage_wait_s[k] += time.perf_counter() - t0
        assert step == t
        b["tokens"][slot_t] = x
        b["targets"][slot_t] = y
        b["lr"][slot_t] = lr

    @staticmethod
    def input_buffer(ws):
        """Where a stage's input activations go in its workspace."""
        return ws.resid[0]

    def _receive(self, k, t, ws):
        """Stage k's input for step t: stage k-1's output, copied out of the ring into ``ws``."""
        b = self._buffers
        prod, cons = b["produced"], b["consumed"]
        self._wait(lambda: prod[k - 1] > t, k, holds_ws=False)
        h = self.input_buffer(ws)
        h[...] = b["ring"][k - 1, t % (self.S + 1)]
        with self.cond:
            cons[k - 1] = t + 1
            self.cond.notify_all()
        return h

    def _hand_on(self, k, t, out):
        """Put stage k's output for step t into the ring once a slot is free (at most S + 1 ahead)."""
        b = self._buffers
        prod, cons = b["produced"], b["consumed"]
        self._wait(lambda: prod[k] - cons[k] < self.S + 1, k)
        b["ring"][k, t % (self.S + 1)] = out
        with self.cond:
            prod[k] = t + 1
            self.cond.notify_all()

    def _gather_round(self, t, r, k):
        """Complete round t's slots, losses, norms and skip flags with the stages other processes
        run (nothing to do when this process runs every stage)."""

    def _close_round(self, t, lr, k):
        b, S = self._buffers, self.S
        self._wait(lambda: self.version >= t, k)  # round t-1 published first: rounds close in order
        rgc = b["rgc"]
        r = t % (S + 1)
        self._gather_round(t, r, k)
        mean = rgc.close(t)
        new = b["versions"][(t + 1) % (S + 2)]
        new[...] = b["versions"][t % (S + 2)]
        losses = [float(v) for v in b["losses"][r]]
        norms = b["norms"][r]
        skipped = bool(b["skipped"][r].any())
        if not skipped:  # --on-nan skip: a round with a skipped stage leaves the decoder as it was
            self.opt_dec.step(lr, 1.0, P=new, G=mean)
        res = StepResult(t, losses[-1], losses, float(np.nanmax(norms)) if not skipped else float("nan"),
                         skipped)
        with self.cond:
            self.version = t + 1
            snap = self._snap
            if snap is not None and snap.step == t + 1:
                snap._take_decoder()
            self.cond.notify_all()
        self.results.put(res)

    # ------------------------------------------------------------------ state
    def state(self):
        """Called at a step boundary (after ``drain``): the versions ring is the pipeline's state."""
        arrays, meta = super().state()
        arrays["decoder_versions"] = self.versions
        meta.update(self.pipeline_meta(self.version))
        return arrays, meta

    def pipeline_meta(self, version):
        """What a checkpoint of boundary ``version`` records about the pipeline besides its arrays
        (a pause's :meth:`state` and a :class:`Snapshot`'s alike)."""
        return {"decoder_version": version, "max_staleness": self.S, "stage_groups": self.groups,
                "stage_workers": self.W}

    def load_state(self, arrays, meta):
        super().load_state(arrays, meta)
        if "decoder_versions" in arrays:
            saved = int(meta.get("max_staleness", -1))
            if saved != self.S:
                from ..errors import CheckpointError
                raise CheckpointError(f"checkpoint was written with max_staleness {saved}, this run "
                                      f"has {self.S} (resume with the same --max-staleness)")
            self.versions[...] = arrays["decoder_versions"]
            self.versions_at = int(meta["step"])
        self._keep_groups(meta)

    def _keep_groups(self, meta):
        # Group sizes change reduction splits (last-bit differences): a resumed `auto` run reuses
        # the groups its autotune chose instead of timing again.
        if (parse_stage_threads(self.tc.stage_threads, self.K) is None and meta.get("stage_groups")
                and int(meta.get("stage_workers", self.K)) == self.W):
            self.groups = [int(g) for g in meta["stage_groups"]]
