"""AdamW over one flat buffer: one pass for the gradient norm, one fused pass for clip + update.

Decoupled weight decay (PyTorch order: p *= 1 - lr*wd, then the Adam step), applied only where
``decay_mask`` is 1 (matrices); bias-corrected moments.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, cast_like
from .serial import LIGHT, restore_threads, serial_below

_CHUNK = 1 << 14


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def sumsq(G):
    n = G.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    part = np.zeros(nchunks)
    prev = serial_below(n // LIGHT)
    for c in prange(nchunks):
        g = G[c * _CHUNK:min(n, (c + 1) * _CHUNK)]  # a view indexed from 0 vectorises (see below)
        s = 0.0
        for i in range(g.shape[0]):
            s += np.float64(g[i]) * g[i]
        part[c] = s
    restore_threads(prev)
    return part.sum()


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def all_finite(G):
    n = G.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nchunks, np.uint8)
    prev = serial_below(n // LIGHT)
    for c in prange(nchunks):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            if not np.isfinite(G[i]):
                bad[c] = 1
                break
    restore_threads(prev)
    return bad.sum() == 0


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def adamw_update(P, G, M, V, decay_mask, lr, beta1, beta2, eps, wd, step, gscale):
    """One AdamW step at 1-based ``step``; gradients are multiplied by ``gscale`` (clipping) first."""
    # The step's constants are formed in float64 once, then held in the buffer's dtype: Python
    # floats inside the loop would widen every float32 element to float64 (half the vector width,
    # and float64 sqrt and division), which made this pass compute-bound instead of memory-bound.
    b1, omb1 = cast_like(beta1, P), cast_like(1.0 - beta1, P)
    b2, omb2 = cast_like(beta2, P), cast_like(1.0 - beta2, P)
    step_size = cast_like(lr / (1.0 - beta1 ** step), P)
    inv_sqrt_bc2 = cast_like(1.0 / np.sqrt(1.0 - beta2 ** step), P)
    lrwd, e, gs, one = cast_like(lr * wd, P), cast_like(eps, P), cast_like(gscale, P), cast_like(1.0, P)
    n = P.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    prev = serial_below(n)
    for ch in prange(nchunks):
        # chunk views indexed from 0: with range(lo, hi) indices Numba's negative-index wraparound
        # check stays in the loop and LLVM does not vectorise it
        lo, hi = ch * _CHUNK, min(n, (ch + 1) * _CHUNK)
        p_, g_, m_, v_, k_ = P[lo:hi], G[lo:hi], M[lo:hi], V[lo:hi], decay_mask[lo:hi]
        for i in range(hi - lo):
            g = g_[i] * gs
            m = b1 * m_[i] + omb1 * g
            v = b2 * v_[i] + omb2 * g * g
            m_[i] = m
            v_[i] = v
            p = p_[i] * (one - lrwd * k_[i])
            p_[i] = p - step_size * m / (np.sqrt(v) * inv_sqrt_bc2 + e)
    restore_threads(prev)


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def fill(X, value):
    n = X.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    prev = serial_below(n // LIGHT)
    for c in prange(nchunks):
        x = X[c * _CHUNK:min(n, (c + 1) * _CHUNK)]  # 0-based view: vectorises (see adamw_update)
        for i in range(x.shape[0]):
            x[i] = value
    restore_threads(prev)
