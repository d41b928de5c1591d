"""Global backpropagation: one loss, the gradient through every block, one optimizer over everything.

With ``--grad-delay N`` each gradient is computed on the weights of N updates ago and applied to the
current ones: g_t = ∇L(W_{t-N}; batch t), W_{t+1} = W_t - step(g_t). With N = 1 that is what
PipeDream-2BW's schedule computes (every stage one step late, forward and backward of a micro-batch
on the same weight version), without the pipeline: the cost of a uniform one-step delay, apart from
the per-stage delays of ``--mode pipe-sync``. The first N steps read the initial weights. The N kept
versions are in every checkpoint, so a resumed run continues the same trajectory.
"""
import numpy as np

from ..errors import CheckpointError
from ..kernels.adamw import sumsq
from ..optim import clip_scale
from . import StepResult
from .common import SchemeBase


class BP(SchemeBase):
    def __init__(self, model, tc, **_):
        super().__init__(model, tc)
        self.opt = self._optimizer(0, model.layout.size)
        self.delay = tc.grad_delay
        # with a delay: kept[t % N] holds the weights of step t until step t + N reads them (made at
        # the first step or checkpoint, after a resume has loaded the weights), and current holds
        # the step's own weights while the model computes on the old ones
        self.kept = None
        self.current = np.empty_like(model.flat) if self.delay else None

    def optimizers(self):
        return [self.opt]

    def _kept(self):
        """The kept weights; on a fresh run every slot holds the initial weights, which the steps
        before N read."""
        if self.kept is None:
            self.kept = np.repeat(self.model.flat[None], self.delay, axis=0)
        return self.kept

    def _delayed_weights(self, step):
        """Put the weights of step - N in the model and keep this step's for step + N."""
        W = self.model.flat
        slot = self._kept()[step % self.delay]
        self.current[...] = W
        W[...] = slot
        slot[...] = self.current

    def submit(self, step, x, y, lr):
        if self.delay:
            self._delayed_weights(step)
        loss, _ = self.model.loss_and_grad(x, y)
        if self.delay:
            self.model.flat[...] = self.current  # the update applies to the current weights
        sq = float(sumsq(self.model.grad_flat))
        ok = self.check_finite(step, sq, loss, "global backprop")
        scale, norm = clip_scale(sq, self.tc.grad_clip) if ok else (1.0, float("nan"))
        if ok:
            self.opt.step(lr, scale)
        self.done.append(StepResult(step, loss, [loss], norm, not ok))

    def state(self):
        arrays, meta = super().state()
        if self.delay:
            arrays["bp_delayed_weights"] = self._kept()
            meta["grad_delay"] = self.delay
        return arrays, meta

    def load_state(self, arrays, meta):
        super().load_state(arrays, meta)
        saved = int(meta.get("grad_delay", 0))
        if saved != self.delay:
            raise CheckpointError(f"checkpoint was written with --grad-delay {saved}, this run has "
                                  f"{self.delay} (resume with the same delay)")
        if self.delay:
            self.kept = np.array(arrays["bp_delayed_weights"], dtype=self.model.dtype)
