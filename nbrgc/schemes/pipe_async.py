"""Asynchronous pipelined training: the rule of :mod:`nbrgc.schemes.pipe_rule` (pipelined backprop by
default, any horizon, auxiliary weight, delay and replay of pipe-sync) with every stage on a worker
thread of :mod:`nbrgc.schemes.runtime`, as rgc-async runs RGC. ``--mode pipe-async``; also what
``--mode rgc-async`` runs when its objective is not RGC's own (a horizon, an auxiliary weight other
than 1, readout blocks).

A step is two actions per stage:

* ``_stage_forward`` (stages in ascending order): take the input (a micro-batch for stage 0, stage
  k-1's output from the activation ring otherwise), wait for the decoder version max(0, t - S), run
  the forward, hand the output on, and the own loss's backward (the rule's step 1);
* ``_stage_late`` (stages in descending order): the late gradient and the message down (steps 2-3),
  the stage's update (step 4) and its post to the decoder's consensus round, closed by the last
  poster as in rgc-async.

Where every message is read at least a step after it is written (``--boundary-delay`` of 1 or more,
after the delay warm-up), no late action waits on anything of its own step, and a stage runs both
as one action (``phases_at``): then, as in rgc-async, stage k+1's forward of step t overlaps stage
k's late part instead of waiting behind the whole forward chain of step t.

Each value is read in the same order as :class:`~nbrgc.schemes.pipe_sync.PipeSync` reads it, so the
losses and weights are the same bits whatever the timing and the number of workers. The waits that
make it so, each on an action that comes earlier in (step, action, stage) order:

* the message for stage k's boundary of micro-batch s is read once stage k+1 has finished the action
  that writes it (its forward of s for the last stage and for a horizon of one stage, else its late
  action at step s + D_{k+1});
* a message ring slot (``--boundary-delay d``: d + 1 of them) is written once stage k has finished
  the late action that read the slot's previous message, d + 1 micro-batches earlier;
* activations, the decoder versions and the rounds as in rgc-async.

Evaluations and checkpoints pause the pipeline at a step boundary (``drain``); its state there (the
decoder versions, the rule's rings) is pipe-sync's, written the same way.
"""
from ..kernels.atomics import fetch_add
from .common import SchemeBase
from .pipe_rule import PipeRule
from .rgc_async import RGCAsync


class PipeAsync(PipeRule, RGCAsync):
    phases = (("_stage_forward", 1), ("_stage_late", -1))
    ONE_ACTION = (("_stage_whole", 1),)

    def phases_at(self, t):
        """Two actions a step where a message is read in the step it is written (a boundary delay
        of 0, or a step of the delay warm-up); otherwise every late action reads messages of earlier
        steps only, so a stage runs its forward and its late part as one action, as rgc-async runs
        its step: a worker then no longer waits for the next stage's forward of step t before its
        own late part, and neighbouring stages overlap."""
        if self.hops and (self.d == 0 or t < self.warm):
            return self.phases
        return self.ONE_ACTION

    def _stage_whole(self, k, t):
        self._stage_forward(k, t)
        self._stage_late(k, t)

    def __init__(self, model, tc, **kw):
        super().__init__(model, tc, **kw)  # RGCAsync's (or the MPI runtime's, nbrgc.distributed)
        self._init_rule()
        if self.readout is not None:
            self.readout.ws_key = self.worker_of  # stages on different workers: their own buffers
        self.rgc = None
        # per stage: the steps whose forward / late action has finished (under self.cond)
        self.done_fwd = [0] * self.K
        self.done_late = [0] * self.K

    def _round_weights(self):
        return self.cw

    def _alloc(self, B, T):
        super()._alloc(B, T)
        self.rgc = self._buffers["rgc"]

    def can_snapshot(self):
        return False  # evaluations and checkpoints drain the pipeline

    def _start(self, step0, B, T):
        if self._rings is None or self._shape != (B, T):
            self._alloc_rings(B, T)
        self.done_fwd = [step0] * self.K
        self.done_late = [step0] * self.K
        super()._start(step0, B, T)

    # ------------------------------------------------------------------ the two actions
    def _stage_forward(self, k, t):
        b, S = self._buffers, self.S
        ws = b["ws"][self.worker_of(k)]
        slot_t = t % (S + 2)
        if k == self.local_stages[0]:
            self._take_input(k, t)
        h = b["tokens"][slot_t] if k == 0 else self._receive(k, t, ws)
        if self.fault_hook is not None:
            self.fault_hook(k, t)
        v = max(0, t - S)
        self._wait(lambda: self.version >= v, k)
        pdec = b["versions"][v % (S + 2)]
        self._zero_grad(k, t)
        loss = self._forward_own(k, t, h, b["targets"][slot_t], ws, pdec, float(b["lr"][slot_t]))
        b["losses"][t % (S + 1), k] = loss
        self._finished(self.done_fwd, k, t)

    def _stage_late(self, k, t):
        b, S = self._buffers, self.S
        lr = float(b["lr"][t % (S + 2)])
        r = t % (S + 1)
        self._late(k, t, b["ws"][self.worker_of(k)])
        self._finished(self.done_late, k, t)
        norm, skipped = self._stage_update(k, t, lr, float(b["losses"][r, k]))
        b["norms"][r, k] = norm
        b["skipped"][r, k] = skipped
        if fetch_add(self.rgc.counters, r, 1) == len(self.local_stages) - 1:
            self._close_round(t, lr, k)

    def _finished(self, done, k, t):
        with self.cond:
            done[k] = t + 1
            self.cond.notify_all()

    # ------------------------------------------------------------------ message waits
    def _late_step(self, k, s):
        """The step whose late action of stage k handles micro-batch s (the inverse of
        PipeRule._late's s = t - D_k; during the delay warm-up, s itself)."""
        return s if s < self.warm else s + self.D[k]

    def _written_at(self, k, s):
        """(action, step): which action of stage k+1, at which step, writes the message for boundary
        k of micro-batch s: its forward of s (the last stage, or a horizon of one stage: the own
        loss's part), else its late action D_{k+1} steps later (s itself during the delay warm-up)."""
        if self.hops == 1 or k + 1 == self.K - 1:
            return "forward", s
        return "late", self._late_step(k + 1, s)

    def _message_ready(self, k, s):
        action, u = self._written_at(k, s)
        done, j = (self.done_fwd if action == "forward" else self.done_late), k + 1
        self._wait(lambda: done[j] > u, k, holds_ws=True)

    def _message_free(self, k, s):
        prev = s - (self.d + 1)  # the slot's previous message
        if prev < 0:
            return
        u = self._late_step(k, prev)  # when stage k read it
        done = self.done_late
        self._wait(lambda: done[k] > u, k + 1, holds_ws=True)

    # ------------------------------------------------------------------ state
    def state(self):
        arrays, meta = SchemeBase.state(self)
        if self.versions_at is None:  # no step yet: every version is the model's decoder
            self.versions[:] = self.model.flat[self.dec_lo:self.dec_hi]
        arrays["decoder_versions"] = self.versions
        self._rule_state(arrays, meta)
        meta.update(stage_groups=self.groups, stage_workers=self.W)
        return arrays, meta

    def load_state(self, arrays, meta):
        SchemeBase.load_state(self, arrays, meta)
        self._load_rule(arrays, meta)
        self.versions[...] = arrays["decoder_versions"]
        self.versions_at = int(meta["step"])
        self._keep_groups(meta)

