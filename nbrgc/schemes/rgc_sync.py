"""Synchronous RGC: the stages run one after another on the same micro-batch in the calling thread.
Deterministic, and the reference the asynchronous pipeline is tested against.

Clipping is per stage: stage k's norm covers its own parameters and its own decoder contribution,
and that contribution enters the consensus average already scaled. With one stage this is exactly
BP's global-norm clipping; with several, no stage waits for another's norm.
"""
import numpy as np

from ..local import (RGCBuffer, consensus_weights, split_stages, stage_backward, stage_param_ranges,
                     stage_sumsq)
from ..optim import clip_scale
from . import StepResult
from .common import SchemeBase, StagesInTurn


class RGCSync(StagesInTurn, SchemeBase):
    def __init__(self, model, tc, **_):
        super().__init__(model, tc)
        self.stages = split_stages(model.cfg.n_layer, tc.n_stages)
        self.ranges = stage_param_ranges(model.layout, self.stages)
        self.opts = [self._optimizer(lo, hi) for lo, hi in self.ranges]
        self.dec_lo, self.dec_hi = model.layout.decoder_range
        self.opt_dec = self._optimizer(self.dec_lo, self.dec_hi)
        self.rgc = RGCBuffer(len(self.stages), self.dec_hi - self.dec_lo, model.dtype,
                             weights=consensus_weights(tc))
        self._ws = None

    def optimizers(self):
        return self.opts + [self.opt_dec]

    def submit(self, step, x, y, lr):
        m, tc = self.model, self.tc
        x, y = m.check_batch(x, y)
        ws = self._workspace(*x.shape)
        G = m.grad_flat
        h = m.embed(x, ws)
        losses, norms, skipped = [], [], False
        for k, (lo, hi) in enumerate(self.stages):
            plo, phi = self.ranges[k]
            G[plo:phi] = 0.0
            slot = self.rgc.slot(0, k)
            slot[...] = 0.0
            out = m.forward_blocks(h, lo, hi, ws)
            h = out.copy() if k + 1 < len(self.stages) else None
            loss = stage_backward(m, ws, k, lo, hi, out, y, slot)
            losses.append(loss)
            sq = stage_sumsq(G, plo, phi, slot)
            if self.check_finite(step, sq, loss, f"stage {k}"):
                scale, norm = clip_scale(sq, tc.grad_clip)
                self.opts[k].step(lr, scale)
                if scale != 1.0:
                    slot *= scale
            else:
                skipped, norm = True, float("nan")
                slot[...] = 0.0
            norms.append(norm)
        mean = self.rgc.close(0)
        G[self.dec_lo:self.dec_hi] = mean
        if not skipped:  # --on-nan skip: a step with a skipped stage leaves the decoder as it was
            self.opt_dec.step(lr)
        self.done.append(StepResult(step, losses[-1], losses, float(np.nanmax(norms)) if not skipped
                                    else float("nan"), skipped))
