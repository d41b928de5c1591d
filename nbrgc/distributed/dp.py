"""Data-parallel BP on MPI ranks: the fair baseline for RGC across machines.

Every rank holds the whole model and draws the same global batch (the batcher is seeded, so no
tokens travel); rank r computes the loss and gradient of its slice of b_r sequences, weighs them
by b_r / B, and one in-place all-reduce of the flat gradient (and of the loss) gives every rank the
global batch's mean, from which each takes the same clipped AdamW step as single-process BP.
The parameters stay equal on every rank, so nothing else is ever exchanged.
"""
import numpy as np

from ..kernels.adamw import sumsq
from ..optim import clip_scale
from ..schemes import StepResult
from ..schemes.bp import BP


def batch_slices(batch, n_ranks):
    """[(lo, hi), ...]: rank r's rows of the global batch (sizes differ by at most one)."""
    base, extra = divmod(batch, n_ranks)
    out, lo = [], 0
    for r in range(n_ranks):
        hi = lo + base + (r < extra)
        out.append((lo, hi))
        lo = hi
    return out


class DataParallelBP(BP):
    def __init__(self, model, tc, link=None, **kw):
        super().__init__(model, tc, **kw)
        self.link = link
        self.lo, self.hi = batch_slices(tc.batch, link.size)[link.rank]
        self.weight = (self.hi - self.lo) / tc.batch
        self.last_step = None
        self._loss = np.zeros(1)
        self._first = True

    def submit(self, step, x, y, lr):
        self.last_step = step
        m = self.model
        loss, _ = m.loss_and_grad(x[self.lo:self.hi], y[self.lo:self.hi])
        G = m.grad_flat
        if self.weight != 1.0:
            G *= G.dtype.type(self.weight)
        self._loss[0] = loss * self.weight
        long, self._first = self._first, False
        self.link.allreduce(G, "the gradient all-reduce", step, long=long)
        self.link.allreduce(self._loss, "the loss all-reduce", step, kind="control", long=long)
        loss = float(self._loss[0])
        sq = float(sumsq(G))
        ok = self.check_finite(step, sq, loss, "global backprop")
        scale, norm = clip_scale(sq, self.tc.grad_clip) if ok else (1.0, float("nan"))
        if ok:
            self.opt.step(lr, scale)
        self.done.append(StepResult(step, loss, [loss], norm, not ok))

    def drain(self):
        self._first = True  # the step after a pause may wait on a peer still evaluating
        return super().drain()
