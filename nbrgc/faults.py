"""Fault injection for tests: the ``fault_hook`` a :class:`~nbrgc.trainer.Trainer` calls per stage and step."""
import numpy as np

from .errors import ConfigError


class FaultHook:
    """Fault injection for tests; nbrgc-train builds one from the environment variable NBRGC_FAULT.

    ``raise:STAGE:STEP`` raises RuntimeError in that stage at that 0-based step (the step numbering
    of error messages; the JSON log's ``step`` is that + 1); ``nan:STAGE:STEP`` fills that stage's
    block parameters with NaN for that one step (restored when the stage starts its next step).
    Join several with ``,``. bp has one stage, 0. rgc-async calls the hook in the stage's worker
    thread; bp and rgc-sync call it for every stage before the step."""

    def __init__(self, spec):
        self.faults, self.saved, self.flat, self.ranges = set(), {}, None, None
        for part in str(spec).split(","):
            bits = part.strip().split(":")
            if len(bits) != 3 or bits[0] not in ("raise", "nan") or not all(
                    b.strip().isdigit() for b in bits[1:]):
                raise ConfigError(f"NBRGC_FAULT: expected raise:STAGE:STEP or nan:STAGE:STEP, got {part!r}")
            self.faults.add((bits[0], int(bits[1]), int(bits[2])))

    def bind(self, model, ranges):
        self.flat, self.ranges = model.flat, ranges

    def __call__(self, k, t):
        if k in self.saved:
            lo, hi, old = self.saved.pop(k)
            self.flat[lo:hi] = old
        if ("raise", k, t) in self.faults:
            raise RuntimeError(f"injected fault in stage {k} at step {t} (NBRGC_FAULT)")
        if ("nan", k, t) in self.faults and self.ranges is not None and k < len(self.ranges):
            lo, hi = self.ranges[k]
            self.saved[k] = (lo, hi, self.flat[lo:hi].copy())
            self.flat[lo:hi] = np.nan
