"""Global backpropagation: one loss, the gradient through every block, one AdamW over everything."""
from ..kernels.adamw import sumsq
from ..optim import clip_scale
from . import StepResult
from .common import SchemeBase


class BP(SchemeBase):
    def __init__(self, model, tc, **_):
        super().__init__(model, tc)
        self.opt = self._adamw(0, model.layout.size)

    def optimizers(self):
        return [self.opt]

    def submit(self, step, x, y, lr):
        loss, _ = self.model.loss_and_grad(x, y)
        sq = float(sumsq(self.model.grad_flat))
        ok = self.check_finite(step, sq, loss, "global backprop")
        scale, norm = clip_scale(sq, self.tc.grad_clip) if ok else (1.0, float("nan"))
        if ok:
            self.opt.step(lr, scale)
        self.done.append(StepResult(step, loss, [loss], norm, not ok))
