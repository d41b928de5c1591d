"""The pipeline's schedule, stage by stage in one thread: the rule of :mod:`nbrgc.schemes.pipe_rule`
(the objective of :mod:`nbrgc.horizon` with its gradients arriving as late as an asynchronous
pipeline delivers them) run in the calling thread. Per step t: every stage's forward and own loss in
stage order, then every stage's late gradient and update in reverse stage order, then the decoder's
consensus step. :class:`~nbrgc.schemes.pipe_async.PipeAsync` runs the same rule on worker threads
and computes the same bits.

The rule fixes every delay, so the trajectory is the same whatever the cadence of evaluations,
checkpoints, stops and resumes; the rings of kept inputs, own gradients and messages are written
into every checkpoint.

The corners: horizon 0, aux_weight 1 is rgc-sync (S = 0) and rgc-async (S), bit for bit; horizon all,
aux_weight 0, delay 0 is backprop with per-stage clipping (bit for bit backprop with --grad-clip 0).
Horizons that are not 0, one stage or all are left to the reference :func:`nbrgc.local_loss_and_grad`.
"""
import numpy as np

from ..local import RGCBuffer, split_stages, stage_param_ranges
from . import StepResult
from .common import SchemeBase, StagesInTurn
from .pipe_rule import PipeRule, delays, ring_shapes, stage_horizon  # noqa: F401 (their old home)


class PipeSync(PipeRule, StagesInTurn, SchemeBase):
    def __init__(self, model, tc, staleness=None, delay=None, **_):
        """``staleness``, ``delay``: override tc's (rgc-sync runs this with 0 and 0, and then no
        delay warm-up or delay rescaling either)."""
        super().__init__(model, tc)
        self.stages = split_stages(model.cfg.n_layer, tc.n_stages)
        self.K = len(self.stages)
        self.ranges = stage_param_ranges(model.layout, self.stages)
        self.opts = [self._optimizer(lo, hi) for lo, hi in self.ranges]
        self.dec_lo, self.dec_hi = model.layout.decoder_range
        self.opt_dec = self._optimizer(self.dec_lo, self.dec_hi)
        self._init_rule(staleness, delay)
        self.rgc = RGCBuffer(self.K, self.dec_hi - self.dec_lo, model.dtype, weights=self.cw)
        # decoder version v is the decoder after v rounds; step t reads version max(0, t - S)
        self.versions = np.zeros((self.S + 2, self.dec_hi - self.dec_lo), model.dtype)
        self.version = None          # the newest version (None: not yet taken from the model)
        self._ws = None

    # ------------------------------------------------------------------ pipeline state
    def _versions_from_model(self):
        self.versions[:] = self.model.flat[self.dec_lo:self.dec_hi]
        self.version = 0

    def state(self):
        arrays, meta = super().state()
        if self.version is None:
            self._versions_from_model()
        arrays["decoder_versions"] = self.versions
        self._rule_state(arrays, meta)
        return arrays, meta

    def load_state(self, arrays, meta):
        super().load_state(arrays, meta)
        self._load_rule(arrays, meta)
        self.versions[...] = arrays["decoder_versions"]
        self.version = int(meta["step"])

    # ------------------------------------------------------------------ one step
    def _hand_on(self, k, t, out):
        self._next_input = out.copy()  # taken before this stage's buffers are reused

    def submit(self, step, x, y, lr):
        m, K, t = self.model, self.K, step
        x, y = m.check_batch(x, y)
        ws = self._workspace(*x.shape)
        if self._rings is None or self._shape != x.shape:
            self._alloc_rings(*x.shape)
        if self.version is None:
            self._versions_from_model()
        pdec = self.versions[max(0, t - self.S) % (self.S + 2)]
        losses = []
        for k in range(K):
            self._zero_grad(k, t)
            h = x
            if k:
                h = ws.resid[0]
                h[...] = self._next_input
            losses.append(self._forward_own(k, t, h, y, ws, pdec, lr))
        norms, skipped = [0.0] * K, False
        for k in range(K - 1, -1, -1):
            self._late(k, t, ws)
            norms[k], skip = self._stage_update(k, t, lr, losses[k])
            skipped = skipped or skip
        mean = self.rgc.close(t)
        S = self.S
        new = self.versions[(t + 1) % (S + 2)]
        new[...] = self.versions[t % (S + 2)]
        if not skipped:  # --on-nan skip: a step with a skipped stage leaves the decoder as it was
            self.opt_dec.step(lr, 1.0, P=new, G=mean)
        self.version = t + 1
        self.model.flat[self.dec_lo:self.dec_hi] = new  # evaluation reads the newest decoder
        self.done.append(StepResult(t, losses[-1], losses, float(np.nanmax(norms)) if not skipped
                                    else float("nan"), skipped))
