"""Softmax cross-entropy over byte logits, fused with its gradient (written over the logits)."""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, fexp, fmax
from .serial import restore_threads, serial_below

_ZERO = np.float32(0.0)  # float32 literals keep float32 rows in float32 (and vectorised)


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def xent_fwd_bwd(logits, targets, losses, scale):
    """Row losses into ``losses``; logits <- scale * (softmax - onehot). Returns the sum of losses."""
    N, V = logits.shape
    prev = serial_below(N * V)
    for i in prange(N):
        t = targets[i]
        lt = logits[i, t]
        m = logits[i, 0]
        for j in range(V):
            m = fmax(m, logits[i, j])
        s = _ZERO
        for j in range(V):
            e = fexp(logits[i, j] - m)
            logits[i, j] = e
            s += e
        losses[i] = np.log(s) + m - lt
        inv = 1.0 / s
        for j in range(V):
            logits[i, j] *= inv * scale
        logits[i, t] -= scale
    restore_threads(prev)
    tot = 0.0
    for i in range(N):
        tot += losses[i]
    return tot


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def xent_fwd(logits, targets, losses):
    """Row losses only (evaluation); logits are left untouched. Returns the sum."""
    N, V = logits.shape
    prev = serial_below(N * V)
    for i in prange(N):
        m = logits[i, 0]
        for j in range(V):
            m = fmax(m, logits[i, j])
        s = _ZERO
        for j in range(V):
            s += fexp(logits[i, j] - m)
        losses[i] = np.log(s) + m - logits[i, targets[i]]
    restore_threads(prev)
    tot = 0.0
    for i in range(N):
        tot += losses[i]
    return tot
