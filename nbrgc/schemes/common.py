"""What every scheme shares: optimizer state arrays, divergence handling, state (de)serialisation."""
import math

import numpy as np

from ..errors import DivergenceError
from ..optim import make_optimizer


class SchemeBase:
    def __init__(self, model, tc):
        self.model, self.tc = model, tc
        self.M = np.zeros(model.layout.size, model.dtype)
        self.V = np.zeros(model.layout.size, model.dtype)
        self.done = []

    def _optimizer(self, lo, hi):
        """The run's optimizer (--optimizer: AdamW, or Muon on the blocks' matrices and AdamW on the
        rest) over the parameter slice [lo, hi), its moments in this scheme's M and V."""
        tc, m = self.tc, self.model
        return make_optimizer(tc.optimizer, m.flat, m.grad_flat, self.M, self.V, m.decay_mask, lo, hi,
                              m.layout, muon_momentum=tc.muon_momentum, beta1=tc.beta1,
                              beta2=tc.beta2, eps=tc.eps, weight_decay=tc.weight_decay)

    def check_finite(self, step, sq, loss, where):
        """False when the step must be skipped; raises under --on-nan stop."""
        if math.isfinite(sq) and math.isfinite(loss):
            return True
        what = "loss" if not math.isfinite(loss) else "gradient"
        if self.tc.on_nan == "skip":
            return False
        raise DivergenceError(f"non-finite {what} at step {step} ({where}); parameters left at the "
                              "last good step (use --on-nan skip to skip such steps)")

    # synchronous schemes finish inside submit
    def poll(self):
        out, self.done = self.done, []
        return out

    def drain(self):
        return self.poll()

    def close(self):
        pass

    def optimizers(self):
        raise NotImplementedError

    def can_snapshot(self):
        """Whether the scheme can copy its state at a step boundary while it runs on
        (``snapshot(step)``, see :mod:`nbrgc.schemes.snapshot`); the others pause to checkpoint."""
        return False

    def eval_workspace(self, B, T):
        """A Workspace for evaluating one stage at a time at batch (B, T) while the scheme is
        paused: the scheme's own buffers where it has them, so evaluation allocates nothing."""
        return self.model.cached_workspace(B, T)

    def state(self):
        arrays = {"adam_m": self.M, "adam_v": self.V}
        meta = {"opt_steps": [o.t for o in self.optimizers()]}
        if self.tc.optimizer != "adamw":  # (absent: adamw, as every checkpoint before --optimizer)
            meta["optimizer"] = self.tc.optimizer
        return arrays, meta

    def load_state(self, arrays, meta):
        saved = meta.get("optimizer", "adamw")
        if saved != self.tc.optimizer:
            from ..errors import CheckpointError
            raise CheckpointError(f"checkpoint was written with --optimizer {saved}, this run has "
                                  f"{self.tc.optimizer} (resume with the same optimizer)")
        self.M[...] = arrays["adam_m"]
        self.V[...] = arrays["adam_v"]
        steps = meta["opt_steps"]
        opts = self.optimizers()
        if len(steps) != len(opts):
            from ..errors import CheckpointError
            raise CheckpointError(f"checkpoint has {len(steps)} optimizer groups, this mode needs "
                                  f"{len(opts)} (resume with the same --mode and --n-stages)")
        for o, t in zip(opts, steps):
            o.t = int(t)


class StagesInTurn:
    """Mixin of the schemes that run their stages one after another in the calling thread (rgc-sync,
    pipe-sync): one stage's workspace serves every stage and the evaluation. Needs ``self.stages``
    and ``self._ws`` (None until the first call)."""

    def eval_workspace(self, B, T):
        return self._workspace(B, T)

    def _workspace(self, B, T):
        if self._ws is None or (self._ws.B, self._ws.T) != (B, T):
            per = self.stages[0][1] - self.stages[0][0]
            self._ws = self.model.workspace(B, T, 0, per)  # stages run in turn: one is enough
        return self._ws
